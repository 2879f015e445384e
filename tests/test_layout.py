"""The package's layers hold: the import-linter contracts in pyproject.toml pass, no module of
specjax imports itself back through others, and imports inside functions are only the heavy or
optional dependencies that a user may not have installed."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specjax"
# Imported inside functions on purpose: optional extras (bench, gguf, hub, tests) or
# platform-specific modules, each with a comment at the import saying why.
LAZY_ALLOWED = {"torch", "transformers", "matplotlib", "gguf", "huggingface_hub", "fcntl", "scipy",
                "optax", "xllamacpp", "outlines_core"}


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


def test_no_import_cycles():
    graph = grimp.build_graph("specjax", cache_dir=None)
    # A package imports its own modules to re-export them; that is not a cycle of the code.
    for package in [m for m in graph.modules if graph.find_children(m)]:
        for child in graph.find_children(package):
            if graph.direct_import_exists(importer=package, imported=child):
                graph.remove_import(importer=package, imported=child)
    assert _cycles(graph) == []


def test_the_cycle_finder_sees_a_cycle():
    graph = grimp.ImportGraph()
    for m in ("a", "b", "c"):
        graph.add_module(m)
    graph.add_import(importer="a", imported="b")
    graph.add_import(importer="b", imported="c")
    assert _cycles(graph) == []
    graph.add_import(importer="c", imported="a")
    assert _cycles(graph) == [["a", "b", "c"]]


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


def test_scripts_and_library_never_import_tests():
    for path in [*(ROOT / "specjax").rglob("*.py"), *(ROOT / "scripts").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert node.module.split(".")[0] != "tests", path
            if isinstance(node, ast.Import):
                assert all(a.name.split(".")[0] != "tests" for a in node.names), path


# -- The methods are listed once -----------------------------------------------------------------

def _method_lists(source: str) -> list[tuple[int, list[str]]]:
    """The tuple, list and set literals of `source` that hold two or more method names."""
    from specjax.decoding.methods import METHODS
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            names = [e.value for e in node.elts
                     if isinstance(e, ast.Constant) and e.value in METHODS]
            if len(names) >= 2:
                found.append((node.lineno, names))
    return found


def test_the_methods_are_listed_once_in_the_registry():
    # The registry (`decoding.methods.REGISTRY`) is the one list of the decoding methods: every
    # other place reads it, so no other literal in specjax/ lists two of them.
    registry = PACKAGE / "decoding" / "methods.py"
    lists = {f"{path.relative_to(PACKAGE)}:{line}": names
             for path in sorted(PACKAGE.rglob("*.py")) if path != registry
             for line, names in _method_lists(path.read_text())}
    assert lists == {}
    # The check sees a list where there is one.
    assert _method_lists('X = ("speculative", "ngram", 3)\nif m in ["eagle", "dflash"]: pass') == [
        (1, ["speculative", "ngram"]), (2, ["eagle", "dflash"])]


# The descriptions of the project and of its layers that list the methods, and which they list:
# every method, or every method of a kind.
DESCRIPTIONS = {"pyproject.toml": "all", "__init__.py": "all", "decoding/__init__.py": "all",
                "cli/main.py": "all", "cli/generate.py:GENERATE_HELP": "all", "bench/suite.py": "all",
                "sampling/logits.py": "all", "heads/__init__.py": "loads heads or a drafter"}


def _named(text: str) -> set[str]:
    from specjax.decoding.methods import REGISTRY
    lower = text.lower()
    return {m.name for m in REGISTRY.values()
            if m.name in lower or m.name.replace("ngram", "n-gram") in lower}


def test_every_description_of_the_methods_names_them_all():
    # Each description names every method its entry asks for: a new method's record is not
    # done until these say so.
    import tomllib

    from specjax.decoding.methods import REGISTRY
    kinds = {"all": set(REGISTRY),
             "loads heads or a drafter": {m.name for m in REGISTRY.values()
                                          if m.loads in ("heads", "drafter")}}
    missing = {}
    for where, kind in DESCRIPTIONS.items():
        if where == "pyproject.toml":
            text = tomllib.loads((ROOT / where).read_text())["project"]["description"]
        else:
            path, _, name = where.partition(":")
            module = ast.parse((PACKAGE / path).read_text())
            text = ast.get_docstring(module) if not name else next(
                node.value.value for node in module.body if isinstance(node, ast.Assign)
                and getattr(node.targets[0], "id", None) == name)
        if kinds[kind] - _named(text):
            missing[where] = sorted(kinds[kind] - _named(text))
    assert missing == {}
    assert _named("speculative and n-gram decoding") == {"speculative", "ngram"}
