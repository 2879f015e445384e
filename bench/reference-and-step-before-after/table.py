"""The side-by-side table of this directory's eight runs (README.md): tokens per target call and
tokens/s per method, old code against new, in run order. Run from the repository root:
python bench/reference-and-step-before-after/table.py"""

import json
from pathlib import Path

HERE = Path(__file__).parent
ORDER = ("old-{d}", "new-{d}", "new-{d}-second", "old-{d}-second")


def rows(run: str) -> dict:
    found = json.loads((HERE / run / "results.json").read_text())["summary"]
    return {(r["method"], r["tree"] or r["k"]): r for r in found if r["category"] == "all"}


for dtype in ("float32", "bfloat16"):
    runs = [o.format(d=dtype) for o in ORDER if (HERE / o.format(d=dtype)).is_dir()]
    got = {run: rows(run) for run in runs}
    print(f"\n{dtype}: " + ", ".join(runs))
    print("| method | tokens/call | " + " | ".join(runs) + " |")
    print("|---|--:|" + "--:|" * len(runs))
    for key in got[runs[0]]:
        calls = {round(got[r][key]["tokens_per_target_call"], 2) for r in runs if key in got[r]}
        speeds = " | ".join(f"{got[r][key]['tokens_per_second']:.1f}" if key in got[r] else "-"
                            for r in runs)
        label = key[1] if isinstance(key[1], int) else ("own tree" if key[1] else "")
        print(f"| {key[0]} {label} | {'/'.join(map(str, sorted(calls)))} | {speeds} |")
