"""Shared pytest setup: one compilation cache for the whole run, and programs released per
module."""

import os
import shutil
import tempfile

import jax
import pytest

from specjax.api.generate import _COMPILED
from specjax.decoding import loop
from specjax.presets import enable_compile_cache

# The lossless check's fixture, as a user's suite would load it (tests/test_conformance.py).
pytest_plugins = ["specjax.testing.pytest_plugin"]


def pytest_configure(config):
    """JAX's persistent compilation cache in a fresh directory for this run (unless
    SPECJAX_COMPILE_CACHE names one, or "off"): the same program compiled again by a later
    module, by a second test worker or by a CLI subprocess is read back instead. The directory is
    made once, before any worker starts, so that workers and subprocesses inherit it; each run
    starts empty, so a run on a clean machine times the same as this one and nothing from an
    earlier checkout is ever reused."""
    if "SPECJAX_COMPILE_CACHE" not in os.environ:
        directory = tempfile.mkdtemp(prefix="specjax-test-xla-")
        os.environ["SPECJAX_COMPILE_CACHE"] = directory
        config.stash[_OWN_CACHE] = directory
    enable_compile_cache()


def pytest_unconfigure(config):
    directory = config.stash.get(_OWN_CACHE, None)
    if directory is not None:
        os.environ.pop("SPECJAX_COMPILE_CACHE", None)
        shutil.rmtree(directory, ignore_errors=True)


_OWN_CACHE = pytest.StashKey[str]()


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drops each module's compiled programs when it ends: the suite compiles a few hundred
    programs, and keeping them all alive only grows the process."""
    yield
    _COMPILED.clear()
    loop.programs.cache_clear()
    jax.clear_caches()
