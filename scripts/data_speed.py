"""Times `train data`'s work, the target's continuations of a batch of chat prompts, greedy and
sampled (T = 1, top-p 0.9), and prints tokens per minute of each (bench/smollm2-data-topp/).

    python scripts/data_speed.py --target DIR [--steps 96] [--batch 64]

Both settings decode the same prompts (64 of the built-in chat set, in the target's chat
template) for the same number of steps after an untimed warm-up, so their step times compare
directly. Run it on an idle host: it measures the host's two cores."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import specjax
from specjax.bench.common import _cpu_model
from specjax.cli.train_stages import read_prompts
from specjax.train import eagle3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--steps", type=int, default=96)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    target = specjax.load(args.target)
    rows = read_prompts(Path("builtin:chat"), target, False)[64:64 + args.batch]
    results = {}
    for label, temperature, top_p in (("greedy", 0.0, 1.0), ("T=1 top-p 0.9", 1.0, 0.9)):
        settings = dict(temperature=temperature, top_p=top_p, batch=args.batch)
        eagle3.continuations(target, rows, max_new_tokens=4, **settings)     # compiles
        start = time.perf_counter()
        sequences = eagle3.continuations(target, rows, max_new_tokens=args.steps, seed=1,
                                         **settings)
        seconds = time.perf_counter() - start
        tokens = int(np.sum(sequences.length - sequences.prompt_length))
        results[label] = dict(tokens=tokens, seconds=round(seconds, 2),
                              ms_per_step=round(1000 * seconds / args.steps, 1),
                              tokens_per_minute=round(60 * tokens / seconds))
        print(f"{label:>14}: {tokens} tokens in {seconds:.1f} s, "
              f"{1000 * seconds / args.steps:.0f} ms a step, {60 * tokens / seconds:,.0f} "
              f"tokens/min", flush=True)
    print(json.dumps({"sampler": specjax.sampling.logits.__file__, "host": _cpu_model(),
                      "steps": args.steps, "batch": args.batch, "results": results}))


if __name__ == "__main__":
    main()
