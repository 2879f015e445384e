"""Writes each fast-tier test's measured time into tests/fast_tier.txt.

    python -m pytest --junitxml=fast.xml              # a fast-tier run, from a cold cache
    python scripts/fast_tier.py fast.xml --host "2-core AMD EPYC Zen 4 (AVX-512)"

The tier is the tests marked `fast` in their modules (tests/conftest.py); the record keeps
its lines and their order (a line without `[...]` sums every case of its test), gets each
line's seconds and the header's run line from the run, and a line at its end for each test
the run timed that no line covers (a test newly marked). A recorded test that the run did not
time is an error: the record would then claim a cost nobody measured (remove its line if the
test left the tier). tests/docs/test_tiers.py holds the record to the marks and its sum to the
tier's budget.
"""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ElementTree
from datetime import date
from pathlib import Path

LIST = Path(__file__).resolve().parent.parent / "tests" / "fast_tier.txt"


def measured(junit: Path) -> dict[str, float]:
    """{node id: seconds (setup, call and teardown)} from a pytest --junitxml file, and for each
    parametrized function the sum over its parameters."""
    times = {}
    for case in ElementTree.parse(junit).iter("testcase"):
        module = case.get("classname").replace(".", "/") + ".py"
        name = case.get("name").split("@", 1)[0]       # pytest-xdist's group suffix
        node_id, seconds = f"{module}::{name}", float(case.get("time"))
        times[node_id] = seconds
        if "[" in name:         # a line naming the function stands for all its parameters
            function = node_id.split("[", 1)[0]
            times[function] = times.get(function, 0.0) + seconds
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", type=Path, help="the run's --junitxml file")
    parser.add_argument("--host", required=True, help="the machine it ran on, in words")
    args = parser.parse_args(argv)
    times = measured(args.junit)
    lines, missing, covered = [], [], set()
    for line in LIST.read_text().splitlines():
        body = line.split("#", 1)[0].strip()
        if line.startswith("# Run:"):
            line = f"# Run: {date.today().isoformat()}, {args.host}, {args.junit.name}"
        elif body:
            node_id = body.split(maxsplit=1)[1]
            covered.add(node_id)
            if node_id not in times:
                missing.append(node_id)
                continue
            line = f"{times[node_id]:7.2f}  {node_id}"
        lines.append(line)
    functions = {n.split("[", 1)[0] for n in times if "[" in n}     # the sums over cases
    lines += [f"{times[n]:7.2f}  {n}" for n in times if n not in functions
              and n not in covered and n.split("[", 1)[0] not in covered]       # newly marked
    if missing:
        print(f"fast_tier: the run did not time {len(missing)} listed tests, e.g. {missing[0]}",
              file=sys.stderr)
        return 2
    LIST.write_text("\n".join(lines) + "\n")
    total = sum(float(re.split(r"\s+", ln.strip())[0]) for ln in lines
                if ln.strip() and not ln.startswith("#"))
    print(f"{LIST.name}: {len(times)} timed, {total:.0f} worker-seconds listed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
