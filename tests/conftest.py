"""Shared pytest setup."""

import jax
import pytest

from specjax.api.generate import _COMPILED
from specjax.decoding import loop

# The lossless check's fixture, as a user's suite would load it (tests/test_conformance.py).
pytest_plugins = ["specjax.testing.pytest_plugin"]


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drops each module's compiled programs when it ends: the suite compiles a few hundred
    programs, and keeping them all alive only grows the process."""
    yield
    _COMPILED.clear()
    loop.programs.cache_clear()
    jax.clear_caches()
