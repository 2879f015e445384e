"""Re-derives a recorded suite run's summary tables from its per-prompt rows with the current
definitions of specjax/bench/report.py (a speedup is the ratio of median tokens/s), and rewrites
its results.json and results.md in place. The rows, the timings and the figures are left as
recorded; a note in the run says when and why the summary was re-derived.

    python scripts/resummarize.py bench/smollm2-engine [bench/DIR ...]
    python scripts/resummarize.py bench/medusa-tree-search/results-shipped.json   (-> its .md)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specjax.bench.report import METRICS, markdown, summarize

NOTE = ("summary and by-category tables re-derived from the per-prompt rows by "
        "scripts/resummarize.py: a speedup is the ratio of median tokens/s (earlier: the median "
        "of per-prompt ratios)")


def resummarize(where: Path) -> None:
    path = where if where.suffix == ".json" else where / "results.json"
    results = json.loads(path.read_text())
    if results.get("schema") != "specjax.bench/1" or "summary" not in results:
        raise SystemExit(f"{path}: not a suite run (specjax.bench/1 with a summary)")
    rows = [{**{m: None for m in METRICS}, **row} for row in results["rows"]]
    categories = list(dict.fromkeys(r["category"] for r in results["by_category"]))
    results["summary"] = summarize(rows, "all")
    results["by_category"] = [r for c in categories
                              for r in summarize([x for x in rows if x["category"] == c], c)]
    if NOTE not in results["notes"]:
        results["notes"].append(NOTE)
    path.write_text(json.dumps(results, indent=2) + "\n")
    path.with_suffix(".md").write_text(markdown(results))


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        resummarize(Path(arg))
