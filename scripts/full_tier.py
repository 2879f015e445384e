"""Writes the full tier's measured worker-seconds, per test module, into tests/full_tier.txt.

    python -m pytest --all --junitxml=full.xml        # a full-tier run from a fresh clone
    python scripts/full_tier.py full.xml --host "2-core Intel Xeon (AVX-512, AMX)" --wall 1500

With `--compiles PREFIX` (a run made with SPECJAX_COMPILE_REPORT=PREFIX, tests/support/compile_report.py)
it also prints, per module, the seconds its tests spent tracing, lowering and compiling against
their whole time, and the backend calls that compiled rather than read the cache back.

tests/docs/test_tiers.py holds the record to CI's limit and each area (a folder under tests/) to
its budget; the script prints the areas' sums to compare.
"""

from __future__ import annotations

import argparse
import collections
import json
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from datetime import date
from pathlib import Path

RECORD = Path(__file__).resolve().parent.parent / "tests" / "full_tier.txt"


def by_module(junit: Path) -> dict[str, float]:
    """{test module: seconds of its tests (setup, call and teardown)} from a --junitxml file."""
    seconds = defaultdict(float)
    for case in ElementTree.parse(junit).iter("testcase"):
        seconds[case.get("classname").replace(".", "/") + ".py"] += float(case.get("time"))
    return dict(seconds)


def compiles(prefix: str) -> dict[str, collections.Counter]:
    """{test module: summed compile figures} from every PREFIX.<pid>.jsonl of a run."""
    modules = defaultdict(collections.Counter)
    for path in Path(prefix).parent.glob(Path(prefix).name + ".*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            modules[row.pop("test").split("::")[0]].update(row)
    return dict(modules)


def compile_table(modules: dict[str, float], figures: dict[str, collections.Counter]) -> str:
    """Markdown: per module, worker-seconds, compile seconds (trace + lower + backend) and the
    programs compiled (backend calls less cache hits), slowest first, with a total row."""
    rows = ["| module | worker-s | compile-s | trace + lower s | programs compiled | cache reads |",
            "|---|--:|--:|--:|--:|--:|"]
    total = collections.Counter()
    for module in sorted(modules, key=modules.get, reverse=True):
        f = figures.get(module, collections.Counter())
        front = f["trace_s"] + f["lower_s"]
        built = f["backend_calls"] - f["cache_hits"]
        total.update(worker=modules[module], compile=front + f["backend_s"], front=front,
                     built=built, hits=f["cache_hits"])
        rows.append(f"| {module} | {modules[module]:.0f} | {front + f['backend_s']:.0f} | "
                    f"{front:.0f} | {built} | {f['cache_hits']} |")
    rows.append(f"| all | {total['worker']:.0f} | {total['compile']:.0f} | {total['front']:.0f} | "
                f"{total['built']} | {total['hits']} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", type=Path, help="the full run's --junitxml file")
    parser.add_argument("--host", required=True, help="the machine it ran on, in words")
    parser.add_argument("--wall", type=float, required=True,
                        help="the run's wall-clock seconds, install excluded")
    parser.add_argument("--compiles", help="the run's SPECJAX_COMPILE_REPORT prefix")
    args = parser.parse_args(argv)
    modules = by_module(args.junit)
    if args.compiles:
        print(compile_table(modules, compiles(args.compiles)))
    lines = ["# The full tier's measured time (scripts/full_tier.py; tests/docs/test_tiers.py).",
             "# A line: worker-seconds module. The header: the run.",
             f"# Run: {date.today().isoformat()}, {args.host}, {args.junit.name}, "
             f"wall {args.wall:.0f} s",
             *(f"{modules[m]:8.1f}  {m}" for m in sorted(modules, key=modules.get,
                                                         reverse=True))]
    RECORD.write_text("\n".join(lines) + "\n")
    print(f"{RECORD.name}: {len(modules)} modules, {sum(modules.values()):.0f} worker-seconds")
    areas = defaultdict(float)      # the folders under tests/ (tests/docs/test_tiers.py's budgets)
    for module, seconds in modules.items():
        areas[module.split("/")[1] if module.count("/") > 1 else module] += seconds
    print(", ".join(f"{a} {s:.0f}" for a, s in sorted(areas.items(), key=lambda x: -x[1])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
