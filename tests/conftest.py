"""Shared pytest setup: the two tiers (`python -m pytest` runs the fast one, `--all` everything),
how the suite compiles (XLA settings that compile faster and keep every bit, one compilation
cache that every worker of a run shares), and programs released per module."""

import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

# How the suite compiles: XLA's CPU backend with two settings that only make compiling faster.
# The suite's tiny models spend most of their time compiling, and these must not change a bit of
# what it checks: tests/docs/test_compile_level.py holds them to that (logits, sampling
# distributions, weights drawn from seeds and sampled tokens, against a process at XLA's
# defaults).
# - LLVM at -O1 rather than -O2: compiles about a fifth faster. -O0 was measured too (a third
#   faster) and it does change bits: the weights specjax.testing's pair draws from its seeds
#   differ in the last bit, so it is not used.
# - XLA's older loop emitters for fusions instead of its MLIR fusion emitters: a third less
#   compile time again on the tiny models' programs, but twice the time on SmolLM2's 30 layers,
#   so modules marked `deep_model` compile with the MLIR emitters (`_deep_model_compile`).
# The flags are tried in a subprocess first: an XLA that no longer knows one aborts at start,
# and then the suite runs without it. SPECJAX_TEST_XLA_OPT=default runs the suite at XLA's
# defaults (docs/tests.md).
SUITE_XLA_FLAGS = ("--xla_backend_optimization_level=1", "--xla_cpu_use_fusion_emitters=false")


def _name(flag: str) -> str:
    return flag.split("=")[0]


def _xla_starts_with(flags: list[str]) -> bool:
    probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"],
                           env=dict(os.environ, XLA_FLAGS=" ".join(flags)), capture_output=True)
    return probe.returncode == 0


def _compile_fast() -> None:
    if os.environ.get("SPECJAX_TEST_XLA_OPT", "").strip().lower() == "default":
        return
    flags = os.environ.get("XLA_FLAGS", "").split()
    named = {_name(f) for f in flags}
    extra = [f for f in SUITE_XLA_FLAGS if _name(f) not in named]
    if not extra:
        return           # a test worker or a subprocess: the flags came with the environment
    while extra and not _xla_starts_with(flags + extra):
        extra.pop()
    os.environ["XLA_FLAGS"] = " ".join(flags + extra)


def suite_xla_flags() -> list[str]:
    """The flags of SUITE_XLA_FLAGS this run compiles with."""
    return [f for f in os.environ.get("XLA_FLAGS", "").split() if f in SUITE_XLA_FLAGS]


_compile_fast()      # before JAX starts its backend, and inherited by workers and subprocesses

# `generate` with no model options runs SmolLM2 (fetched on first use); the suite's CLI tests
# run the tiny pair unless they name a model, as they did before that default. test_cli's
# test_generate_defaults_to_smollm2_or_the_tiny_pair_offline unsets it to test the default.
os.environ.setdefault("SPECJAX_PRESET", "tiny-llama")


import pytest  # noqa: E402

from specjax.api.generate import release_programs  # noqa: E402
from specjax.io.fetch import cache_root  # noqa: E402
from specjax.presets import enable_compile_cache  # noqa: E402

# The lossless check's fixture, as a user's suite would load it (tests/kit/test_conformance.py).
pytest_plugins = ["specjax.testing.pytest_plugin",
                  "tests.support.compile_report"]     # SPECJAX_COMPILE_REPORT: compile seconds per test

# -- The two tiers (docs/tests.md) -------------------------------------------------------------
# `python -m pytest` runs the fast tier, which proves the core within minutes (Theorem 1
# exactly, a G-test with its negative control per method family, greedy equality of every
# method, parity with transformers, the loaders' hostile files, the CLI's errors);
# `python -m pytest --all` runs every test, as CI does. Named files or test ids run whole.
# The fast tier is the tests marked `fast` where they are written: `@pytest.mark.fast` on a
# test (all its cases), `@pytest.mark.fast(cases=[...])` for some cases of a parametrized one
# (the ids in its `[...]`), or a module's `pytestmark`. tests/fast_tier.txt records each one's
# measured time, and tests/docs/test_tiers.py holds the marks and the record to each other and
# the record to the tier's budget, so that a test joins the tier only with its cost counted.
# `-m fast` selects the tier too, `--all -m "not fast"` the rest.

FAST_TIER = Path(__file__).with_name("fast_tier.txt")
_FAST_COLLECTED = pytest.StashKey["FastCollected"]()


def fast_tier() -> dict[str, float]:
    """tests/fast_tier.txt as {node id: seconds}: a line is `seconds node-id`, where a test
    function named without `[...]` stands for all its cases; `#` starts a comment."""
    tests = {}
    for number, line in enumerate(FAST_TIER.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if line:
            seconds, node_id = line.split(maxsplit=1)
            if node_id in tests:
                raise pytest.UsageError(f"{FAST_TIER.name}:{number}: {node_id} is listed twice")
            tests[node_id] = float(seconds)
    return tests


def _node_id(item) -> str:
    return item.nodeid.split("@", 1)[0]          # without pytest-xdist's `@group` suffix


def _case(node_id: str) -> str | None:
    """The case of a parametrized test (what its id holds in `[...]`), None for a plain one."""
    return node_id.split("[", 1)[1][:-1] if "[" in node_id else None


def fast_cases(item) -> tuple[str, ...] | None:
    """The cases that the closest `fast` mark of a test names: None for every case."""
    mark = item.get_closest_marker("fast")
    if mark.args or set(mark.kwargs) - {"cases"} or not isinstance(
            mark.kwargs.get("cases", ()), (list, tuple)):
        raise pytest.UsageError(f"{item.nodeid}: a `fast` mark takes only cases=[ids], "
                                f"not {mark.args} {mark.kwargs}")
    cases = mark.kwargs.get("cases")
    return None if cases is None else tuple(cases)


def in_fast_tier(item) -> bool:
    """Whether the test is marked `fast`, for this case if the mark names cases."""
    if item.get_closest_marker("fast") is None:
        return False
    cases = fast_cases(item)
    return cases is None or _case(_node_id(item)) in cases


@dataclasses.dataclass(frozen=True)
class FastCollected:
    """What one process collected: the node ids of every test and of those in the fast tier,
    the cases a `fast` mark names that its test does not have (`module::test[case]`), whether
    that was the whole suite (no paths named) and whether every case of its tests (no test ids
    named)."""
    node_ids: frozenset[str]
    fast: frozenset[str]
    unknown_cases: frozenset[str]
    whole_suite: bool
    whole_tests: bool


def _unknown_cases(items) -> frozenset[str]:
    named, present = set(), set()
    for item in items:
        function = _node_id(item).split("[", 1)[0]
        present.add((function, _case(_node_id(item))))
        if item.get_closest_marker("fast") is not None:
            named.update((function, case) for case in fast_cases(item) or ())
    return frozenset(f"{function}[{case}]" for function, case in named - present)


def pytest_addoption(parser):
    parser.addoption("--all", action="store_true", dest="all_tiers",
                     help="run every test, not only the fast tier (CI does; docs/tests.md)")


@pytest.hookimpl(tryfirst=True)             # before `-m` and `-k` look at the marks
def pytest_collection_modifyitems(config, items):
    fast = {item for item in items if in_fast_tier(item)}
    for item in items:
        if item not in fast:    # a case its test's mark leaves out: not `-m fast` either
            item.own_markers[:] = [m for m in item.own_markers if m.name != "fast"]
    named = config.option.file_or_dir or []
    config.stash[_FAST_COLLECTED] = FastCollected(
        frozenset(map(_node_id, items)), frozenset(map(_node_id, fast)), _unknown_cases(items),
        whole_suite=not named, whole_tests=not any("::" in arg for arg in named))
    if config.getoption("all_tiers") or named:
        return
    config.hook.pytest_deselected(items=[item for item in items if item not in fast])
    items[:] = [item for item in items if item in fast]


def pytest_report_header(config):
    if config.getoption("all_tiers"):
        return "specjax: every test (--all)"
    if config.option.file_or_dir:
        return "specjax: the named tests, in the fast tier or not"
    return "specjax: the fast tier (tests marked `fast`); `python -m pytest --all` runs every test"


@pytest.fixture
def fast_collected(pytestconfig) -> FastCollected:
    """What this process collected (tests/docs/test_tiers.py)."""
    return pytestconfig.stash[_FAST_COLLECTED]



def pytest_configure(config):
    """JAX's persistent compilation cache for the run, set before any worker starts so that the
    workers and every CLI subprocess share it: a program compiled again by a later module, the
    other worker or a subprocess is read back rather than compiled.

    By default it is kept between runs on this machine, outside the repo: <cache>/test-xla/KEY
    (<cache> is $SPECJAX_CACHE or ~/.cache/specjax; KEY the kernels' build key, as for the
    command line's cache, and JAX's own key holds the program, its XLA flags and jaxlib), so a
    second run compiles only what changed. SPECJAX_COMPILE_CACHE=fresh gives the run an empty
    directory of its own, removed at its end: a cold run, which is how the tiers' recorded times
    are measured (docs/tests.md). =DIR uses DIR, =off none."""
    setting = os.environ.get("SPECJAX_COMPILE_CACHE")
    if setting is None:
        root = cache_root() / "test-xla"
        _prune(root, KEPT_CACHE_BYTES)
        os.environ["SPECJAX_COMPILE_CACHE"] = str(root)
    elif setting.strip().lower() == "fresh":
        directory = tempfile.mkdtemp(prefix="specjax-test-xla-")
        os.environ["SPECJAX_COMPILE_CACHE"] = directory
        config.stash[_OWN_CACHE] = directory
    enable_compile_cache()


# The kept cache's bound: past it the
# entries read longest ago go first, so programs of old checkouts do not pile up.
KEPT_CACHE_BYTES = 8 << 30


def _prune(root: Path, limit: int) -> None:
    """Deletes the entries of the kept cache read longest ago until it holds at most `limit`
    bytes (a worker started by this run finds the variable set and never prunes)."""
    try:
        files = [(f.stat().st_atime, f.stat().st_size, f) for f in root.rglob("*") if f.is_file()]
    except OSError:
        return
    total = sum(size for _, size, _ in files)
    for _, size, path in sorted(files):
        if total <= limit:
            break
        path.unlink(missing_ok=True)
        total -= size


def pytest_unconfigure(config):
    directory = config.stash.get(_OWN_CACHE, None)
    if directory is not None:
        os.environ.pop("SPECJAX_COMPILE_CACHE", None)
        shutil.rmtree(directory, ignore_errors=True)


_OWN_CACHE = pytest.StashKey[str]()


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drops each module's compiled programs when it ends
    (`specjax.api.generate.release_programs`): the suite compiles a few hundred programs, and
    keeping them all alive only grows the process and its memory maps."""
    yield
    release_programs()


@contextmanager
def _compile_options(**options):
    """Every program compiled inside gets these XLA options, on top of XLA_FLAGS. (JAX's public
    way is `jax.jit(compiler_options=)` on each program; the suite sets them from outside,
    through the function JAX builds each compilation's options with.)"""
    from jax._src import compiler
    build = getattr(compiler, "get_compile_options", None)
    if build is None:      # another JAX: compile with XLA_FLAGS alone, which costs only time
        yield
        return

    def with_options(*args, env_options_overrides=None, **kwargs):
        return build(*args, env_options_overrides={**options, **(env_options_overrides or {})},
                     **kwargs)
    compiler.get_compile_options = with_options
    try:
        yield
    finally:
        compiler.get_compile_options = build


@pytest.fixture(autouse=True, scope="module")
def _deep_model_compile(request):
    """Modules marked `deep_model` (SmolLM2's 30 layers) compile with XLA's MLIR fusion
    emitters, its default: there the loop emitters double the compile time."""
    if (request.node.get_closest_marker("deep_model") is None
            or "--xla_cpu_use_fusion_emitters=false" not in suite_xla_flags()):
        yield
        return
    with _compile_options(xla_cpu_use_fusion_emitters=True):
        yield
