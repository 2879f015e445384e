"""The package's layers hold: the import-linter contracts in pyproject.toml pass, no module of
specjax imports itself back through others, and imports inside functions are only the heavy or
optional dependencies that a user may not have installed. The code stays in pieces a reader can
hold: modules of about 500 lines and functions of about 80 at most, but those docs/layout.md
names with why and how long they may be."""

from __future__ import annotations

import ast
import io
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "specjax"
# Imported inside functions on purpose: optional extras (bench, gguf, hub, tests) or
# platform-specific modules, each with a comment at the import saying why.
LAZY_ALLOWED = {"torch", "transformers", "matplotlib", "gguf", "huggingface_hub", "fcntl", "scipy",
                "optax", "xllamacpp", "outlines_core"}


@pytest.mark.fast
def test_import_linter_contracts_are_kept():
    lint = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    result = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broken" in result.stdout and " 0 broken" in result.stdout


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    modules = sorted(graph.modules)
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(m):
        index[m] = low[m] = len(index)
        stack.append(m)
        on_stack.add(m)
        for n in graph.find_modules_directly_imported_by(m):
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in on_stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            component = []
            while True:
                n = stack.pop()
                on_stack.discard(n)
                component.append(n)
                if n == m:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for m in modules:
        if m not in index:
            visit(m)
    return found


@pytest.mark.fast
def test_no_import_cycles():
    graph = grimp.build_graph("specjax", cache_dir=None)
    # A package imports its own modules to re-export them; that is not a cycle of the code.
    for package in [m for m in graph.modules if graph.find_children(m)]:
        for child in graph.find_children(package):
            if graph.direct_import_exists(importer=package, imported=child):
                graph.remove_import(importer=package, imported=child)
    assert _cycles(graph) == []


@pytest.mark.fast
def test_the_cycle_finder_sees_a_cycle():
    graph = grimp.ImportGraph()
    for m in ("a", "b", "c"):
        graph.add_module(m)
    graph.add_import(importer="a", imported="b")
    graph.add_import(importer="b", imported="c")
    assert _cycles(graph) == []
    graph.add_import(importer="c", imported="a")
    assert _cycles(graph) == [["a", "b", "c"]]


@pytest.mark.fast
@pytest.mark.parametrize("path", sorted((ROOT / "specjax").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_inside_functions_are_optional_dependencies(path):
    lines = path.read_text().splitlines()
    for node in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.Import):
                names = [a.name for a in inner.names]
            elif isinstance(inner, ast.ImportFrom):
                names = [inner.module or ""]
            else:
                continue
            tops = {name.split(".")[0] for name in names}
            where = f"{path.relative_to(ROOT)}:{inner.lineno}"
            assert tops <= LAZY_ALLOWED, f"{where}: move `{', '.join(names)}` to the top"
            around = " ".join(lines[max(0, inner.lineno - 4):inner.lineno])
            assert "#" in around, f"{where}: say in a comment why this import is lazy"


@pytest.mark.fast
def test_scripts_and_library_never_import_tests():
    for path in [*(ROOT / "specjax").rglob("*.py"), *(ROOT / "scripts").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert node.module.split(".")[0] != "tests", path
            if isinstance(node, ast.Import):
                assert all(a.name.split(".")[0] != "tests" for a in node.names), path


def test_model_is_imported_from_the_model_layer():
    # `Model` is defined in model/transformer.py: a module that needs it imports it from there
    # (or from specjax.model), not through a layer above that imports it too (io.checkpoint).
    wrong = [f"{path.relative_to(ROOT)}:{node.lineno} from {node.module}"
             for path in sorted(PACKAGE.rglob("*.py"))
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.ImportFrom) and any(a.name == "Model" for a in node.names)
             and node.module not in ("specjax.model.transformer", "specjax.model")]
    assert wrong == []


# -- Prose: the core says what and why -----------------------------------------------------------
#
# No docstring or comment in specjax/model/, sampling/ or decoding/ quotes a timing, a host or an
# issue number: measurements belong to docs/benchmarks.md, with their host beside them, and
# history to CHANGELOG.md, where a reader of the code does not trip over numbers that were true
# of one machine once.

_NUMBER = r"\d[\d,]*(?:\.\d+)?"
QUOTING = [(kind, re.compile(pattern, flags)) for kind, pattern, flags in (
    # Timings: a number with a unit of time, a rate per second, a speedup.
    ("timing", rf"\b{_NUMBER}\s?(?:ms|µs|us|ns|secs?|seconds?|milliseconds?|microseconds?"
               r"|minutes?|hours?)\b", 0),
    ("timing", rf"\b{_NUMBER} s\b|\b\d+\.\d+s\b", 0),         # seconds, not "the 0s and 1s"
    ("timing", r"\b(?:tokens?|tok|it|steps?|calls?|rows?|[KMG]i?B|GFLOPs?|TFLOPs?)/s\b", 0),
    ("timing", r"\bper second\b", re.I),
    ("timing", rf"\b{_NUMBER}\s?(?:x|×|times)\s+(?:faster|slower|quicker|as fast|the speed)\b",
     re.I),
    ("timing", rf"\b{_NUMBER}\s?% (?:faster|slower|quicker)\b", re.I),
    ("timing", rf"\b(?:speed-?up|slow-?down) of {_NUMBER}", re.I),
    # Hosts: a processor, a core count, a clock, an accelerator, "this machine".
    ("host", r"\b(?:EPYC|Xeon|Ryzen|Threadripper|Graviton|Zen ?\d?|Apple M\d|Core i\d)\b", 0),
    ("host", r"\bAVX[-\w]*\s+(?:host|machine|server|CPU|box|laptop)s?\b", re.I),
    ("host", r"\b\d+-core\b|\b\d+ (?:CPU |physical |logical )?cores\b", re.I),
    ("host", r"\b\d+(?:\.\d+)? ?GHz\b", re.I),
    ("host", r"\b(?:A100|H100|H200|V100|RTX ?\d{4}|TPU ?v\d\w*)\b", 0),
    ("host", r"\b(?:on|of|for) (?:this|my|our|that|the same) (?:machine|host|box|laptop|server)\b",
     re.I),
    # History: which issue or pull request a change came from.
    ("history", r"\b(?:issue|PR|pull request) #?\d+\b", re.I),
)]


def _prose(path: Path) -> list[tuple[int, str]]:
    """(first line, text) of every docstring of a module and of every run of comment lines,
    whitespace collapsed, so a number and its unit split over two lines are still one phrase."""
    source = path.read_text()
    found, run, last = [], [], None
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        line = token.start[0]
        if run and line != last + 1:
            found.append((run[0][0], " ".join(text for _, text in run)))
            run = []
        run.append((line, token.string.lstrip("#").strip()))
        last = line
    if run:
        found.append((run[0][0], " ".join(text for _, text in run)))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                found.append((node.body[0].lineno, " ".join(doc.split())))
    return found


def _quoted(text: str) -> list[str]:
    """What in `text` quotes a timing, a host or an issue: 'kind: match' for each."""
    return [f"{kind}: {m.group(0)}" for kind, pattern in QUOTING for m in pattern.finditer(text)]


@pytest.mark.parametrize("layer", ["model", "sampling", "decoding"])
def test_the_core_quotes_no_timing_host_or_issue(layer):
    found = [f"{path.relative_to(ROOT)}:{line}: {hit}"
             for path in sorted((PACKAGE / layer).rglob("*.py"))
             for line, text in _prose(path) for hit in _quoted(text)]
    assert not found, "move these to docs/benchmarks.md or CHANGELOG.md:\n" + "\n".join(found)


def test_the_prose_check_sees_timings_and_hosts_and_lets_the_math_be():
    # Positive and negative controls: what the core must not say, and what it may.
    flagged = ["a step took 13 ms", "0.18 ms", "20-30 ms a step", "in 2.5 s", "3 seconds",
               "26 tokens/s", "1.4x slower", "2 times faster", "17% faster",
               "a speedup of 1.3", "on a 2-core AMD EPYC (AVX2)", "the Zen 4 host", "Xeon",
               "an AVX-512 host", "16 cores", "3.0 GHz", "on an H100", "on this machine",
               "as of issue 64", "see PR #12"]
    for text in flagged:
        assert _quoted(text), text
    allowed = ["1-32 rows", "rows 1..32", "bfloat16", "float32 max", "int8 weights",
               "Q8_0 x Q8_0", "1.5 x smallest", "within 1.5x", "2 x smallest",
               "(16 floats, AVX-512)", "no host round trip per token",
               "computed once, on the host", "top_p = 0.9 at T = 1", "K + 1 tokens",
               "s = 3 slots", "ids 1 and 2", "its best 4,096 logits", "[B, K, V]",
               "the 0s and 1s of a mask", "a fifth of a step", "the core (model, sampling)",
               "a 49,152-token vocabulary", "steps 1 and 2", "faster on huge batches"]
    for text in allowed:
        assert not _quoted(text), (text, _quoted(text))


# -- The methods are listed once -----------------------------------------------------------------

def _method_lists(source: str) -> list[tuple[int, list[str]]]:
    """The tuple, list and set literals of `source` that hold two or more method names."""
    from specjax.api.methods import TYPES as METHODS
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            names = [e.value for e in node.elts
                     if isinstance(e, ast.Constant) and e.value in METHODS]
            if len(names) >= 2:
                found.append((node.lineno, names))
    return found


def test_the_methods_are_listed_once_in_their_classes():
    # `api.methods.CLASSES` is the one list of the decoding methods: every other place reads it,
    # so no other literal in specjax/ lists two of them.
    registry = PACKAGE / "api" / "methods.py"
    lists = {f"{path.relative_to(PACKAGE)}:{line}": names
             for path in sorted(PACKAGE.rglob("*.py")) if path != registry
             for line, names in _method_lists(path.read_text())}
    assert lists == {}
    # The check sees a list where there is one.
    assert _method_lists('X = ("speculative", "ngram", 3)\nif m in ["eagle", "dflash"]: pass') == [
        (1, ["speculative", "ngram"]), (2, ["eagle", "dflash"])]


# The two descriptions that list every method (a new method is not done until they name it):
# the README and the command line's help. No other text need name them all, and the layers below
# the API do not list them: their descriptions speak of "every method" (`heads`, whose modules
# are named after the drafters they hold, aside).
DESCRIPTIONS = ("README.md", "cli/generate.py:GENERATE_HELP")
LOW_LAYERS = ("model/__init__.py", "sampling/__init__.py", "sampling/logits.py",
              "decoding/__init__.py")


def _named(text: str) -> set[str]:
    from specjax.api.methods import TYPES
    lower = text.lower()
    return {name for name in TYPES if name in lower or name.replace("ngram", "n-gram") in lower}


def test_the_readme_and_the_help_name_every_method_and_the_low_layers_list_none():
    from specjax.api.methods import TYPES
    missing = {}
    for where in DESCRIPTIONS:
        path, _, name = where.partition(":")
        if not name:
            text = (ROOT / path).read_text()
        else:
            module = ast.parse((PACKAGE / path).read_text())
            text = next(node.value.value for node in module.body if isinstance(node, ast.Assign)
                        and getattr(node.targets[0], "id", None) == name)
        if set(TYPES) - _named(text):
            missing[where] = sorted(set(TYPES) - _named(text))
    assert missing == {}
    # A low layer's description names no more than one of them.
    listing = {layer: sorted(_named(ast.get_docstring(ast.parse((PACKAGE / layer).read_text()))))
               for layer in LOW_LAYERS}
    assert {layer: names for layer, names in listing.items() if len(names) > 1} == {}
    assert _named("speculative and n-gram decoding") == {"speculative", "ngram"}


# -- Size -----------------------------------------------------------------------------------------
#
# Guides, not reasons to split: a file holds one concept and is split where its concepts part.
# A module or function past a guide is named in docs/layout.md's "Size" table, with the most lines
# it may have and why; the table is the one list of the exceptions, read here.

MODULE_GUIDE = 500
FUNCTION_GUIDE = 80


def _module_lines() -> dict[str, int]:
    return {str(path.relative_to(ROOT)): len(path.read_text().splitlines())
            for path in sorted(PACKAGE.rglob("*.py"))}


def _long_functions(source: str) -> dict[str, int]:
    """The functions of `source` (methods and nested ones too) longer than the guide, by name:
    from `def` to their last line, docstring included, decorators not."""
    return {node.name: node.end_lineno - node.lineno + 1 for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > FUNCTION_GUIDE}


def _exceptions(text: str) -> dict[str, int]:
    """docs/layout.md's "Size" table: `specjax/path.py` (a module) or `specjax/path.py:name` (a
    function) -> the most lines it may have. A row is "| `where` | lines | why |"."""
    section = text.partition("\n## Size\n")[2].partition("\n## ")[0]
    rows = re.findall(r"^\| `(specjax/[\w/]+\.py(?::\w+)?)` \| (\d+) \| (.*?) \|$", section, re.M)
    assert all(why.strip() for _, _, why in rows), "every exception says why"
    return {where: int(lines) for where, lines, _ in rows}


def _layout_exceptions() -> dict[str, int]:
    return _exceptions((ROOT / "docs" / "layout.md").read_text())


def test_no_module_runs_past_the_guide_unless_the_layout_says_why():
    exceptions = {k: v for k, v in _layout_exceptions().items() if ":" not in k}
    long = {path: n for path, n in _module_lines().items() if n > MODULE_GUIDE}
    assert {k: n for k, n in long.items() if n > exceptions.get(k, MODULE_GUIDE)} == {}
    # The table stays true: each module it names exists and is still past the guide.
    assert set(exceptions) - set(long) == set()


def test_no_function_runs_past_the_guide_unless_the_layout_says_why():
    exceptions = {k: v for k, v in _layout_exceptions().items() if ":" in k}
    long = {f"{path.relative_to(ROOT)}:{name}": n for path in sorted(PACKAGE.rglob("*.py"))
            for name, n in _long_functions(path.read_text()).items()}
    assert {k: n for k, n in long.items() if n > exceptions.get(k, FUNCTION_GUIDE)} == {}
    assert set(exceptions) - set(long) == set()
    # The measure sees a long function where there is one.
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_GUIDE))
    assert _long_functions(f"def f():\n{body}\n") == {"f": FUNCTION_GUIDE + 1}
    assert _long_functions(f"def f():\n{body[:body.rindex(chr(10))]}\n") == {}


def test_the_size_table_is_read_as_written():
    # The reader sees the rows of the table where there are some, and only in its section.
    text = ("# Layout\n\n## Size\n\n| where | lines | why |\n| --- | --: | --- |\n"
            "| `specjax/io/x.py` | 560 | one concept |\n| `specjax/a/b.py:run` | 95 | a loop |\n"
            "\n## Next\n\n| `specjax/io/y.py` | 900 | elsewhere |\n")
    assert _exceptions(text) == {"specjax/io/x.py": 560, "specjax/a/b.py:run": 95}
    with pytest.raises(AssertionError, match="says why"):
        _exceptions("\n## Size\n\n| `specjax/io/x.py` | 560 |  |\n")
