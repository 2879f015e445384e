"""The docs stay true: every repository path, `specjax.` name and internal link that README.md
and docs/*.md mention exists; every number of the README's results table is the recorded run's;
every directory under bench/ is cited by a page, and its README says which, truly; every call of
the API a page's Python shows takes the API's keywords, and the README's example runs.

Pure text and imports of specjax's own modules, but for the README's example (the tiny pair).
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Pages that may cite a bench/ directory: the user docs, the changelog and the checkpoints' and
# data's cards.
CITING = [*PAGES, ROOT / "CHANGELOG.md", *sorted(ROOT.glob("weights/*/README.md")),
          ROOT / "weights" / "README.md", *sorted(ROOT.glob("data/*/README.md"))]
TOP_DIRS = ("specjax", "tests", "scripts", "bench", "weights", "data", "docs")
ROOT_FILES = {p.name for p in ROOT.iterdir() if p.is_file()}

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)")
URL = re.compile(r"https?://\S+")
# A repository path in prose: starts with a top-level directory, then path characters.
BARE_PATH = re.compile(r"(?<![\w./-])(?:%s)/[\w.*{},/-]*" % "|".join(TOP_DIRS))
DOTTED = re.compile(r"(?<![\w.])specjax(?:\.[A-Za-z_]\w*)+")
NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*")


def _text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def _prose(text: str) -> str:
    """The text outside fenced code blocks."""
    return FENCE.sub("", text)


def _expand(path: str) -> list[str]:
    """`a/{b,c}/d` -> [a/b/d, a/c/d]."""
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [q for alt in m.group(1).split(",")
            for q in _expand(path[:m.start()] + alt + path[m.end():])]


def _repo_paths(text: str) -> set[str]:
    """Repository paths a page mentions: in code spans, in prose, and as link targets are
    checked by the link test. Only paths that start with a top-level directory or name a file
    at the root; user-chosen examples (`--out DIR`, `~/.cache/specjax`) are left alone."""
    prose = URL.sub("", _prose(text))
    found = set()
    for span in CODE_SPAN.findall(prose):
        for token in span.split():
            token = token.strip("\"'(),;:")
            if token in ROOT_FILES or token.split("/")[0] in TOP_DIRS and "/" in token:
                found.add(token)
    found.update(BARE_PATH.findall(CODE_SPAN.sub("", LINK.sub("", prose))))
    out = set()
    for path in found:
        path = re.sub(r"::.*$|:\d+$", "", path).rstrip(".,:;)")
        if "=" in path or "<" in path or "NAME" in path or "DIR" in path:
            continue                                     # a placeholder, not a path
        out.update(_expand(path))
    return out


@pytest.mark.fast
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_repository_path_a_page_mentions_exists(page):
    missing = sorted(p for p in _repo_paths(_text(page))
                     if not (any(ROOT.glob(p)) if "*" in p else (ROOT / p).exists()))
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"


def _resolve(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


@pytest.mark.fast
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_specjax_name_a_page_mentions_resolves(page):
    names = set(DOTTED.findall(_text(page)))
    unresolved = sorted(n for n in names if not _resolve(n))
    assert not unresolved, f"{page.relative_to(ROOT)} names what specjax lacks: {unresolved}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lower case, without punctuation
    other than hyphens and underscores, spaces made hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)     # links -> their text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = _prose(_text(page))
    out, seen = set(), {}
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    out.update(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))
    return out


@pytest.mark.fast
def test_slugs_follow_githubs_rules():
    assert (slug("The engine, round two: before and after")
            == "the-engine-round-two-before-and-after")
    assert slug("EAGLE on `data/eagle2/` (round 3)") == "eagle-on-dataeagle2-round-3"
    assert slug("Is your sampler lossless?") == "is-your-sampler-lossless"


@pytest.mark.fast
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_internal_link_resolves(page):
    broken = []
    for target in LINK.findall(_prose(_text(page))):
        if re.match(r"[a-z]+:", target):
            continue                                     # http:, https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} has broken links: {broken}"


# The README's results table: each row's label names a row of the recorded run's summary.
README_ROWS = {
    "autoregressive": ("specjax", "autoregressive", "-"),
    "speculative, 4 drafted": ("specjax", "speculative", "4"),
    "n-gram, 4 drafted": ("specjax", "ngram", "4"),
    "Medusa, the heads' tree": ("specjax", "medusa", "heads' tree"),
    "EAGLE, the drafter's tree": ("specjax", "eagle", "drafter's tree"),
    "EAGLE, dynamic tree 4,4,8": ("specjax", "eagle", "dynamic 4,4,8"),
    "transformers' `generate` (autoregressive)": ("transformers", "autoregressive", "-"),
}


def _readme_results() -> tuple[str, Path]:
    text = _text(ROOT / "README.md")
    section = text.split("\n## Results", 1)[1].split("\n## ", 1)[0]
    run, = set(re.findall(r"`(bench/[\w.-]+)/`", section))
    return section, ROOT / run


def _table(text: str, header_start: str) -> list[list[str]]:
    lines = text.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[i + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


@pytest.mark.fast
def test_every_readme_result_is_the_named_runs():
    from specjax.bench.report import k_label

    section, run = _readme_results()
    recorded = {(r[0], r[1], r[2]): r for r in
                _table((run / "results.md").read_text(), "| engine | method | K |")}
    summary = {(r["engine"], r["method"], k_label(r)): r
               for r in json.loads((run / "results.json").read_text())["summary"]}
    table = _table(section, "| method |")
    assert [row[0] for row in table] == list(README_ROWS)
    for label, tokens_s, speedup, per_call in table:
        key = README_ROWS[label]
        file_row, raw = recorded[key], summary[key]
        # results.md's columns: engine method K tokens/s speedup spread vs-AR spread
        # acceptance tokens/call ...
        assert tokens_s == file_row[3], label
        assert per_call == file_row[9], label
        if key[0] == "specjax":
            assert speedup == file_row[4], label
            # The one definition: the ratio of the same statistic, recomputed from the raw data.
            base = summary[("specjax", "autoregressive", "-")]["tokens_per_second"]
            assert speedup == f"{raw['tokens_per_second'] / base:.2f}x", label
        else:
            assert speedup == "", label
    # The prose around the table states the run's host and settings: each is the run's.
    results = json.loads((run / "results.json").read_text())
    machine, settings = results["machine"], results["settings"]
    prose = " ".join(re.sub(r"^\|.*$", "", section, flags=re.M).split())
    cores, host = re.search(r"on a (\d+)-core (.+?) host", prose).groups()
    assert (int(cores), host) == (machine["cpu_count"], machine["cpu_model"])
    assert f"{settings['max_new_tokens']} new tokens" in prose
    assert settings["dtype"] in prose
    assert ("greedy" in prose) == (settings["temperature"] == 0)
    words = {3: "three"}.get(len(results["prompts"]), str(len(results["prompts"])))
    assert f"{words} quick prompts" in prose
    numbers = set(NUMBER.findall(CODE_SPAN.sub("", prose)))
    assert numbers <= {cores, str(settings["max_new_tokens"])}, numbers


@pytest.mark.fast
def test_the_readme_is_a_front_door():
    text = _text(ROOT / "README.md")
    assert len(text.splitlines()) <= 80
    assert len(NUMBER.findall(CODE_SPAN.sub("", _prose(text)))) <= 40


def _cites(text: str, name: str) -> bool:
    return any(cited.rstrip(".") == name
               for path in re.findall(r"bench/[\w.{},*-]+", text)
               for cited in (p.split("/")[1] for p in _expand(path)))


BENCH = sorted(p for p in (ROOT / "bench").iterdir() if p.is_dir())


@pytest.mark.fast
@pytest.mark.parametrize("run", BENCH, ids=lambda p: p.name)
def test_every_bench_directory_is_cited_and_says_by_which_page(run):
    citing = {str(p.relative_to(ROOT)) for p in CITING if p.exists() and _cites(_text(p), run.name)}
    assert citing, f"bench/{run.name}/ is cited by no page: remove it (CHANGELOG.md says how)"
    readme = run / "README.md"
    assert readme.exists(), f"bench/{run.name}/README.md is missing"
    line, = [x for x in _text(readme).splitlines() if x.startswith("Cited by: ")]
    said = {p.strip() for p in line.removeprefix("Cited by: ").split(",")}
    assert said == citing, f"bench/{run.name}/README.md: {line!r}, but cited by {sorted(citing)}"


# -- The API the pages show ------------------------------------------------------------------

PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
CALLS = ("generate", "stream", "explain", "prepare")


def _python_blocks(page: Path) -> list[str]:
    return PYTHON_BLOCK.findall(_text(page))


@pytest.mark.parametrize("page", [p for p in PAGES if _python_blocks(p)], ids=lambda p: p.name)
def test_every_call_a_page_shows_is_the_api_s(page):
    """Every `generate` / `stream` / `explain` / `prepare` call in a page's Python blocks passes
    only the run's options by keyword (the method and the sampling by position or by their
    names), and every method object or `SamplingParams` it makes names only its own fields: a
    page still showing the flat keywords of 0.5 fails here."""
    import ast
    import dataclasses

    import specjax
    from specjax.api.generate import RUN_OPTIONS
    from specjax.api.methods import TYPES

    fields = {cls.__name__: {f.name for f in dataclasses.fields(cls)} for cls in TYPES.values()}
    fields["SamplingParams"] = {f.name for f in dataclasses.fields(specjax.SamplingParams)}
    allowed = {"method", "sampling", *RUN_OPTIONS, "steps", "top"}
    bad, seen = [], 0
    for block in _python_blocks(page):
        for node in ast.walk(ast.parse(block)):
            if not isinstance(node, ast.Call) or not isinstance(node.func, (ast.Name, ast.Attribute)):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
            given = {k.arg for k in node.keywords if k.arg}
            if name in CALLS:
                seen += 1
                bad += [f"{name}(..., {k}=)" for k in sorted(given - allowed)]
            elif name in fields:
                bad += [f"{name}(..., {k}=)" for k in sorted(given - fields[name])]
    assert seen or page.name not in ("README.md", "api.md"), f"{page.name} shows no call"
    assert not bad, f"{page.relative_to(ROOT)} shows keywords the API does not take: {bad}"


def test_the_readme_example_runs():
    """The README's Python block, run as written on the shipped tiny pair."""
    import contextlib
    import io
    import os

    block = _python_blocks(ROOT / "README.md")[0]
    out = io.StringIO()
    cwd = os.getcwd()
    try:
        os.chdir(ROOT)
        with contextlib.redirect_stdout(out):
            exec(compile(block, "README.md", "exec"), {})
    finally:
        os.chdir(cwd)
    text = out.getvalue()
    assert "step 1:" in text and ("'length'" in text or "'eos'" in text), text
