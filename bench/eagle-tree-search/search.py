"""Measurement: `train eagle --dynamic-tree A B C ...`'s search (`eagle3.best_dynamic_tree`) run on
the shipped SmolLM2 EAGLE drafter over a grid of EAGLE-2 dynamic trees, on the cards' ten
held-out chat questions: each tree's tokens per target call at T = 0 (exact), the time of a
decoding step with it on the first question in autoregressive steps (timed here), and their
ratio, the speedup the search ranks by. Run it on an otherwise idle machine:

    python bench/eagle-tree-search/search.py --out bench/eagle-tree-search/results.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import jax

import specjax
from specjax.io import chat
from specjax.presets import model_paths
from specjax.sampling.tree import DynamicTree
from specjax.train import eagle3
from specjax.train.prompts import EVAL_QUESTIONS

WEIGHTS = Path(specjax.__file__).resolve().parent.parent / "weights"
GRID = ("3,2,4", "3,4,6", "4,4,8", "4,4,12", "5,4,12", "5,4,16", "6,6,24")


def cpu() -> str:
    """This machine's CPU, as /proc/cpuinfo names it."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    fields = {}
    for line in info.splitlines():
        if ":" in line:
            key, value = line.split(":", 1)
            fields.setdefault(key.strip(), value.strip())
    return (f"{fields.get('model name', platform.processor())}, family "
            f"{fields.get('cpu family')} model {fields.get('model')}, "
            f"avx512f: {'avx512f' in info}, {len(os.sched_getaffinity(0))} cores")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", nargs="+", default=list(GRID))
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    args.preset, args.target, args.draft = "smollm2", None, None
    target_path, _, _ = model_paths(args, want_draft=False)
    target = specjax.load(target_path)
    drafter = specjax.load(WEIGHTS / "smollm2-eagle")
    prompts = [chat.encode(target, chat.render(target, q)) for q in EVAL_QUESTIONS]
    trees = [DynamicTree.parse(t) for t in args.trees]
    started = time.time()
    best, rows = eagle3.best_dynamic_tree(target, drafter, trees, prompts,
                                          max_new_tokens=args.max_new_tokens,
                                          new_tokens=args.max_new_tokens, repeats=args.repeats)
    result = {"host": cpu(), "jax": jax.__version__, "target": str(target_path),
              "drafter": "weights/smollm2-eagle", "prompts": "EVAL_QUESTIONS (10)",
              "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
              "seconds": round(time.time() - started, 1),
              "best": [best.depth, best.top_k, best.total_tokens], "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for row in rows:
        print(row)
    print("best", result["best"], Path(args.out))


if __name__ == "__main__":
    main()
