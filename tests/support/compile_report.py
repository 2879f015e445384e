"""What a test run spends compiling, per test (docs/tests.md, issue 84): a pytest plugin that
tests/conftest.py loads.

    SPECJAX_COMPILE_REPORT=compiles python -m pytest --all --junitxml=full.xml
    python scripts/full_tier.py full.xml --compiles compiles --host "..." --wall 1800

With SPECJAX_COMPILE_REPORT=PREFIX set, every process of the run (each test worker, or the one
process under `-n 0`) writes PREFIX.<pid>.jsonl at its end: a line per test that compiled, with
the seconds JAX spent tracing, lowering and in XLA's backend (compiling, or reading a program back
from the persistent cache), the backend calls and how many of them were cache hits. JAX reports
these through `jax.monitoring`; nothing here changes what a test compiles or runs.
"""

from __future__ import annotations

import collections
import json
import os

import pytest

TRACE = "/jax/core/compile/jaxpr_trace_duration"
LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
BACKEND = "/jax/core/compile/backend_compile_duration"    # a compile or a cache read
HIT = "/jax/compilation_cache/cache_hits"


class _Ledger:
    """Each test's compile figures in this process; the test that runs now gets the events."""

    def __init__(self):
        self.test = "(outside any test)"
        self.rows = collections.defaultdict(collections.Counter)

    def duration(self, event: str, seconds: float, **_) -> None:
        name = {TRACE: "trace_s", LOWER: "lower_s", BACKEND: "backend_s"}.get(event)
        if name is not None:
            self.rows[self.test][name] += seconds
            if event == BACKEND:
                self.rows[self.test]["backend_calls"] += 1

    def event(self, event: str, **_) -> None:
        if event == HIT:
            self.rows[self.test]["cache_hits"] += 1


_LEDGER = _Ledger()


def pytest_configure(config):
    if os.environ.get("SPECJAX_COMPILE_REPORT"):
        import jax
        jax.monitoring.register_event_duration_secs_listener(_LEDGER.duration)
        jax.monitoring.register_event_listener(_LEDGER.event)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _LEDGER.test = item.nodeid.split("@", 1)[0]
    yield
    _LEDGER.test = "(outside any test)"


def pytest_sessionfinish(session):
    prefix = os.environ.get("SPECJAX_COMPILE_REPORT")
    if not prefix or not _LEDGER.rows:
        return
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    with open(f"{prefix}.{os.getpid()}.jsonl", "w") as out:
        for test, figures in _LEDGER.rows.items():
            out.write(json.dumps({"test": test, **figures}) + "\n")
