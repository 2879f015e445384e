"""Measurement: drafters (EAGLE), heads (Medusa) or draft models for one target, side by side on
the held-out prompts of a `train data` directory (or, with --questions, the 10 chat questions
the cards report): tokens per target call and acceptance by depth at T = 0 and T = 1, each with
its own default tree (`generate`'s default when it ships none) and each with the first one's
tree; draft models (`--method speculative`) draft a chain of --k tokens.

    python scripts/compare_drafters.py --preset tiny-llama --data runs/tiny-data \
        --method eagle weights/llama-eagle runs/tiny-eagle --out runs/tiny-eagle-compare.json

Use it to check that a drafter made by `python -m specjax train` is as good as a shipped one
made by the scripts' recipe: the same prompts, settings and seed for both.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # specjax, without installing

import specjax  # noqa: E402
from specjax.presets import PRESETS, model_paths  # noqa: E402
from specjax.io import chat  # noqa: E402
from specjax.sampling.tree import DynamicTree  # noqa: E402
from specjax.train import data  # noqa: E402
from specjax.train.prompts import EVAL_QUESTIONS  # noqa: E402
import specjax


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS))
    parser.add_argument("--target", help="a target directory or GGUF file (instead of --preset)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", help="a `train data` directory: its held-out prompts")
    source.add_argument("--questions", action="store_true",
                        help="the 10 held-out chat questions the cards report "
                             "(specjax.train.prompts.EVAL_QUESTIONS), in the chat template")
    parser.add_argument("--held-out", type=int, default=None,
                        help="the first N held-out prompts (default: all)")
    parser.add_argument("--method", choices=("eagle", "medusa", "speculative"), required=True)
    parser.add_argument("--k", type=int, default=4, help="speculative: the draft's chain")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="results.json")
    parser.add_argument("drafters", nargs="+",
                        help="drafter (eagle), heads (medusa) or draft model (speculative) dirs")
    args = parser.parse_args()
    args.draft = None
    target_path, _, _ = model_paths(args, want_draft=False)
    target = specjax.load(target_path)
    if args.questions:
        prompts = [chat.encode(target, chat.render(target, q)) for q in EVAL_QUESTIONS]
    else:
        _, prompts = data.read(args.data, target)
    prompts = prompts[:args.held_out] if args.held_out is not None else prompts
    keyword = {"eagle": "drafter", "medusa": "heads", "speculative": "draft"}[args.method]
    options = {"k": args.k} if args.method == "speculative" else {}
    models = [specjax.load(d) for d in args.drafters]
    first_tree = getattr(models[0], "tree", None)     # a draft model has none
    results = {"target": str(target_path), "data": args.data or "EVAL_QUESTIONS",
               "prompts": len(prompts),
               "method": args.method, "max_new_tokens": args.max_new_tokens,
               "seed": args.seed, **options, "rows": []}
    started = time.time()
    for name, model in zip(args.drafters, models):
        own = getattr(model, "tree", None)
        trees = [("own", own)] + ([("first's", first_tree)] if own != first_tree else [])
        for label, tree in trees:
            for temperature in (0.0, 1.0):
                r = specjax.generate(target, prompts,
                                     method=specjax.api.methods.build(
                                         args.method, tree=tree, **{keyword: model}, **options),
                                     sampling=specjax.SamplingParams(temperature=temperature),
                                     max_new_tokens=args.max_new_tokens, seed=args.seed)
                row = {"drafter": name, "tree": label, "temperature": temperature,
                       "tree_shape": describe(tree),
                       "tokens_per_target_call": round(r.stats.tokens_per_target_call, 3),
                       "acceptance_by_position": [
                           None if a is None else round(float(a), 3)
                           for a in r.stats.acceptance_by_position]}
                results["rows"].append(row)
                print(f"[{time.time() - started:5.0f} s] {name}, {label} tree, T = "
                      f"{temperature:g}: {row['tokens_per_target_call']:.3f} tokens per call",
                      flush=True)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(Path(args.out))


def describe(tree):
    """A tree for the results: its paths, EAGLE-2's sizes for a dynamic one, None for none."""
    if tree is None:
        return None
    if isinstance(tree, DynamicTree):
        return {"dynamic": [tree.depth, tree.top_k, tree.total_tokens]}
    return [list(p) for p in tree.paths]


if __name__ == "__main__":
    main()
