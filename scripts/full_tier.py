"""Writes the full tier's measured worker-seconds, per test module, into tests/full_tier.txt.

    python -m pytest --all --junitxml=full.xml        # a full-tier run from a fresh clone
    python scripts/full_tier.py full.xml --host "2-core Intel Xeon (AVX-512, AMX)" --wall 1500

The record is for holding the full tier to its budget (issue 74, item 4): a check in
tests/test_tiers.py is to read it once a full run has written it.
"""

from __future__ import annotations

import argparse
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", type=Path, help="the full run's --junitxml file")
    parser.add_argument("--host", required=True, help="the machine it ran on, in words")
    parser.add_argument("--wall", type=float, required=True,
                        help="the run's wall-clock seconds, install excluded")
    args = parser.parse_args(argv)
    modules = by_module(args.junit)
    lines = ["# The full tier's measured time (scripts/full_tier.py; tests/test_tiers.py).",
             "# A line: worker-seconds module. The header: the run.",
             f"# Run: {date.today().isoformat()}, {args.host}, {args.junit.name}, "
             f"wall {args.wall:.0f} s",
             *(f"{modules[m]:8.1f}  {m}" for m in sorted(modules, key=modules.get,
                                                         reverse=True))]
    RECORD.write_text("\n".join(lines) + "\n")
    print(f"{RECORD.name}: {len(modules)} modules, {sum(modules.values()):.0f} worker-seconds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
