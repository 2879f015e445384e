"""The suite's two tiers and how it compiles (tests/conftest.py, docs/tests.md).

The fast tier, what `python -m pytest` runs, is the tests marked `fast` in their modules;
tests/fast_tier.txt records each one's time, measured in one test worker of a fast-tier run from
a cold compile cache (its header names the run). Here the marks and the record are held to each
other, the record to the tier's budget and the tier to what it must prove, so that a test joins
the tier only with its cost counted.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from tests import conftest

# The fast tier's budget in worker-seconds: two workers' share of the 6 minutes the tier may
# take on a 2-core host from a fresh clone, less what each worker spends before its first test
# (starting JAX and torch, collecting the suite, building the kernels; docs/tests.md).
BUDGET_S = 2 * (6 * 60 - 60)

# What the fast tier must prove, each by at least one recorded test of the module
# (docs/tests.md).
PROVES = {
    "Theorem 1 exactly": "tests/exactness/test_rejection.py",
    "a G-test and its negative control per method family": "tests/exactness/test_distribution.py",
    "greedy equality of every method": "tests/methods/test_decoding.py",
    "parity with transformers": "tests/exactness/test_parity.py",
    "the loaders' hostile files": "tests/io/test_loader_fuzz.py",
    "the CLI's errors": "tests/cli/test_cli.py",
    "its own composition": "tests/docs/test_tiers.py",
}


def _function(node_id: str) -> str:
    return node_id.split("[", 1)[0]


def unrecorded_and_stale(fast: set[str], record: dict[str, float],
                         modules: set[str] | None = None) -> tuple[list[str], list[str]]:
    """The fast tests without a recorded time, and the recorded lines that name no fast test
    (of `modules` only, when the run collected only those). A line without `[...]` stands for
    every case of its test."""
    unrecorded = sorted(n for n in fast if n not in record and _function(n) not in record)
    named = fast | {_function(n) for n in fast}
    stale = sorted(n for n in record if n not in named
                   and (modules is None or n.split("::")[0] in modules))
    return unrecorded, stale


@pytest.mark.fast
def test_the_fast_tests_are_the_recorded_ones(fast_collected):
    # A test marked `fast` without its time would run in the tier uncounted against its budget;
    # a time recorded for a test no longer marked (or gone) would count what the tier never runs.
    modules = None if fast_collected.whole_suite else {
        n.split("::")[0] for n in fast_collected.node_ids}
    unrecorded, stale = unrecorded_and_stale(set(fast_collected.fast), conftest.fast_tier(),
                                             modules)
    assert not unrecorded, f"marked `fast`, no time in tests/fast_tier.txt: {unrecorded}"
    assert not stale, f"tests/fast_tier.txt times tests not marked `fast`: {stale}"


@pytest.mark.fast
def test_the_record_check_catches_an_unrecorded_and_a_stale_test():
    # The check above on a made-up tier: a marked test without a line, a line without a marked
    # test, and a line without `[...]` that stands for its cases.
    fast = {"tests/a/test_x.py::test_one", "tests/a/test_x.py::test_two[p]",
            "tests/a/test_x.py::test_two[q]", "tests/a/test_x.py::test_new"}
    record = {"tests/a/test_x.py::test_one": 1.0, "tests/a/test_x.py::test_two": 2.0,
              "tests/b/test_y.py::test_gone": 3.0}
    assert unrecorded_and_stale(fast, record) == (["tests/a/test_x.py::test_new"],
                                                  ["tests/b/test_y.py::test_gone"])
    assert unrecorded_and_stale(fast, record, {"tests/a/test_x.py"})[1] == []
    assert unrecorded_and_stale(fast - {"tests/a/test_x.py::test_new"},
                                {k: v for k, v in record.items() if "gone" not in k}) == ([], [])


@pytest.mark.fast
def test_a_fast_mark_names_only_cases_its_test_has_and_leaves_out_the_others(fast_collected):
    if fast_collected.whole_tests:
        assert not fast_collected.unknown_cases, (
            f"`fast(cases=...)` names cases its test does not have: "
            f"{sorted(fast_collected.unknown_cases)}")
    # A mark with cases takes those and no others: a G-test case the mark leaves out is
    # collected but not in the tier.
    module = "tests/exactness/test_distribution.py::test_method_samples_the_target_distribution"
    cases = {n for n in fast_collected.node_ids if _function(n) == module}
    if not cases:
        pytest.skip("the run did not collect tests/exactness/test_distribution.py")
    assert f"{module}[speculative-k2-t0.7]" in fast_collected.fast
    assert f"{module}[speculative-k4-t1.0]" in cases - fast_collected.fast


@pytest.mark.fast
def test_the_fast_tier_fits_its_budget_and_proves_the_core():
    listed = conftest.fast_tier()
    total = sum(listed.values())
    slowest = max(listed, key=listed.get)
    assert total <= BUDGET_S, (f"the fast tier's tests take {total:.0f} worker-seconds, over its "
                               f"{BUDGET_S} (the slowest: {slowest}, {listed[slowest]:.0f} s)")
    files = {node_id.split("::")[0] for node_id in listed}
    for what, module in PROVES.items():
        assert module in files, f"the fast tier runs nothing of {module} ({what})"


# The full tier's budget in worker-seconds: two workers' share of what CI allows the whole run
# (90 minutes) less the install and the start (10 minutes). Issue 74 aims at 25 minutes on the
# 2-core hosts, 2 * (25 * 60 - 60) = 2,880 worker-seconds; the record below says how far the
# suite is from that aim, and this check keeps it from outgrowing CI.
FULL_BUDGET_S = 2 * (80 * 60)
FULL_TIER = Path(__file__).resolve().parents[1] / "full_tier.txt"


def full_tier() -> dict[str, float]:
    """tests/full_tier.txt as {test module: worker-seconds} (scripts/full_tier.py writes it
    from a full run's --junitxml file)."""
    rows = [line.split() for line in FULL_TIER.read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    return {module: float(seconds) for seconds, module in rows}


def test_the_full_tier_fits_its_budget_and_every_module_is_measured():
    # A new test module is measured before it joins (a run of scripts/full_tier.py), so a slow
    # one shows in the stop that adds it; the modules measured must still exist.
    recorded = full_tier()
    tests = Path(__file__).resolve().parents[1]
    modules = {f"tests/{p.relative_to(tests).as_posix()}" for p in tests.rglob("test_*.py")}
    assert modules - set(recorded) == set(), "test modules missing from tests/full_tier.txt"
    assert set(recorded) - modules == set(), "tests/full_tier.txt names modules that are gone"
    total = sum(recorded.values())
    slowest = max(recorded, key=recorded.get)
    assert total <= FULL_BUDGET_S, (
        f"the full tier's tests take {total:.0f} worker-seconds, over its {FULL_BUDGET_S} "
        f"(the slowest module: {slowest}, {recorded[slowest]:.0f} s)")


# Each area's budget in the full tier's worker-seconds (docs/tests.md says what each proves):
# its recorded figure when the areas were made (tests/full_tier.txt of 2026-12-05, 2-core Zen 4,
# 4,710 worker-seconds in all) and about 15% more, rounded up to 10 s. A new slow test, or a
# module that grows, then fails here in the submission that records it, not weeks later when
# CI runs out of time; raising a budget is a decision its submission states. A record measured
# on another host is compared with these only after the budgets are scaled to that host.
AREA_BUDGET_S = {
    "methods": 2110,       # 1,829: greedy equality of every method, trees, SmolLM2 in 4 dtypes
    "exactness": 1620,     # 1,403: Theorem 1 exactly and by G-tests, parity, one law
    "engine": 580,         # 504: kernels, cache, batches, mesh, export, compiled once
    "training": 390,       # 338: train eagle3 / medusa end to end
    "kit": 290,            # 246: specjax.testing, llama.cpp and vLLM clients
    "io": 170,             # 143: loaders, GGUF, shipped and published checkpoints
    "docs": 180,           # 126; 157 cold (stop 89: the walkthrough 72 s, not 28): docs, layout,
                           # walkthrough, tiers, compile settings
    "cli": 150,            # 122: the command line and the bench
}


def area(module: str) -> str:
    """A test module's area: its folder under tests/ (`tests/io/test_gguf.py` -> `io`)."""
    parts = module.split("/")
    return parts[1] if len(parts) > 2 else "(no area: " + module + ")"


def over_budget(record: dict[str, float], budgets: dict[str, int]) -> list[str]:
    """What breaks the per-area budgets: an area over its budget (with its slowest module), a
    recorded module in no area that has one, an area with a budget and no recorded module."""
    spent: dict[str, dict[str, float]] = {}
    for module, seconds in record.items():
        spent.setdefault(area(module), {})[module] = seconds
    broken = [f"{a} takes {sum(m.values()):.0f} worker-seconds, over its budget of "
              f"{budgets[a]} (the slowest: {max(m, key=m.get)}, {max(m.values()):.0f} s)"
              for a, m in sorted(spent.items()) if a in budgets and sum(m.values()) > budgets[a]]
    broken += [f"{', '.join(sorted(m))}: in no area with a budget" for a, m in sorted(
        spent.items()) if a not in budgets]
    broken += [f"the area {a} has a budget and no recorded module" for a in sorted(budgets)
               if a not in spent]
    return broken


def test_every_area_of_the_full_tier_fits_its_budget():
    tests = Path(__file__).resolve().parents[1]
    folders = {p.parent.name for p in tests.glob("*/test_*.py")}
    assert folders == set(AREA_BUDGET_S), f"area folders {sorted(folders)}, budgets {AREA_BUDGET_S}"
    assert sum(AREA_BUDGET_S.values()) <= FULL_BUDGET_S
    broken = over_budget(full_tier(), AREA_BUDGET_S)
    assert not broken, "; ".join(broken)


def test_the_area_check_catches_a_slow_new_test_and_a_module_in_no_area():
    # Negative controls: today's record with one made-up module in the engine's folder, 50
    # worker-seconds more than the area's budget leaves; a module at tests/'s top, in no area;
    # and an area left empty.
    record = full_tier()
    engine = sum(s for m, s in record.items() if area(m) == "engine")
    extra = round(AREA_BUDGET_S["engine"] - engine + 50.0)
    made_up = {**record, "tests/engine/test_slow.py": float(extra)}
    slow = over_budget(made_up, AREA_BUDGET_S)
    slowest = max((m for m in made_up if area(m) == "engine"), key=made_up.get)
    assert slow == [f"engine takes {engine + extra:.0f} worker-seconds, over its budget of "
                    f"{AREA_BUDGET_S['engine']} (the slowest: {slowest}, "
                    f"{made_up[slowest]:.0f} s)"], slow
    assert over_budget({**record, "tests/test_loose.py": 1.0}, AREA_BUDGET_S) == [
        "tests/test_loose.py: in no area with a budget"]
    without_cli = {m: s for m, s in record.items() if area(m) != "cli"}
    assert over_budget(without_cli, AREA_BUDGET_S) == ["the area cli has a budget and no "
                                                       "recorded module"]


@pytest.mark.fast
def test_the_private_compile_option_hook_still_reaches_xla():
    """conftest's `_compile_options` sets XLA options from outside through JAX's private
    `jax._src.compiler.get_compile_options` (JAX's public way, `jax.jit(compiler_options=)`,
    is per program, inside specjax). Pinned here: if a JAX release renames it, drops its
    `env_options_overrides`, or stops calling it when it compiles, this fails, rather than the
    deep-model modules silently compiling with the suite's flags (which costs time, never a
    bit: tests/docs/test_compile_level.py)."""
    from jax._src import compiler
    assert "env_options_overrides" in inspect.signature(compiler.get_compile_options).parameters
    original, seen = compiler.get_compile_options, []

    def recording(*args, **kwargs):         # what JAX's own function receives
        seen.append(kwargs.get("env_options_overrides"))
        return original(*args, **kwargs)
    compiler.get_compile_options = recording
    try:
        with conftest._compile_options(xla_cpu_use_fusion_emitters=True):
            # A program no other test compiles, so that it is compiled here, not read back.
            jax.jit(lambda x: jnp.cumsum(x * 3.0 + 7.0)[::-1]).lower(
                jnp.zeros(31, jnp.float32)).compile()
        assert compiler.get_compile_options is recording          # the context restored it
    finally:
        compiler.get_compile_options = original
    assert seen and all(o and o.get("xla_cpu_use_fusion_emitters") is True for o in seen), seen
