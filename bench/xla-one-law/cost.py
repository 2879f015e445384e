"""What the one law's width costs on a CPU with the kernels off (issue 85): SmolLM2-135M's
autoregressive decoding, 64 new tokens of one prompt, at the law's width (every step fed 16
rows) against XLA's own shapes (`law_width=1`, each step a one-row product), in float32.
The two run in turn, A B A B ..., so that a drift of the machine's speed hits both alike.

    python bench/xla-one-law/cost.py [--reps 3] [--dtype float32]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import specjax
from specjax.io.fetch import fetch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    target = specjax.load(fetch("smollm2"), dtype=args.dtype)
    one = dataclasses.replace(target, config=target.config.replace(law_width=1))
    prompt = ["def fibonacci(n):"]
    greedy = specjax.SamplingParams(temperature=0.0)
    runs = {"law width 16": target, "law width 1": one}
    tokens, seconds = {}, {name: [] for name in runs}
    for name, model in runs.items():                                  # compile, and the tokens
        tokens[name] = specjax.generate(model, prompt, "autoregressive", greedy,
                                        max_new_tokens=64, kernels=False, eos_ids=()).tokens
    for _ in range(args.reps):
        for name, model in runs.items():
            start = time.perf_counter()
            specjax.generate(model, prompt, "autoregressive", greedy, max_new_tokens=64,
                             kernels=False, eos_ids=())
            seconds[name].append(time.perf_counter() - start)
    print(f"SmolLM2-135M, {args.dtype}, kernels off, 64 new tokens, {args.reps} runs each:")
    for name, s in seconds.items():
        best = sorted(s)[len(s) // 2]
        print(f"- {name}: median {best:.2f} s, {64 / best:.1f} tokens/s ({', '.join(f'{x:.2f}' for x in s)})")
    ratio = sorted(a / b for a, b in zip(seconds["law width 16"], seconds["law width 1"]))
    print(f"- ratio 16/1, pair by pair: {', '.join(f'{r:.2f}' for r in ratio)}")
    print(f"- same tokens: {tokens['law width 16'] == tokens['law width 1']}")


if __name__ == "__main__":
    main()
