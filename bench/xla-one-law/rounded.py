"""Did rounding every product that feeds an add on its own (`layers.rounded`: the norms'
squares, LayerNorm's scale, gelu_new's cubic term; RoPE's two products were already) change
any bit of SmolLM2's greedy decoding on XLA's path? If not, the identity records made before it
stand for the code after it.

    python bench/xla-one-law/rounded.py [--dtypes float32 q8_0] > rounded-zen4.txt

Runs greedy `generate` with `logprobs=1` on every seventh of the identity check's prompts (3 of
21), 32 new tokens, autoregressive and EAGLE, kernels off, twice, each in its own process: as
the code is, and with the norms and the activation called without `unfused_products` (the code
before; RoPE's products rounded in both).
Prints, per dtype, method and prompt, whether the tokens and each token's log-probability (a
function of the target's logits) are equal bit for bit.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys

import jax


def decode(dtypes: list[str], unrounded: bool) -> dict:
    from specjax import SamplingParams, generate, load
    from specjax.io.fetch import fetch
    from specjax.model import layers, transformer
    from specjax.testing.identity import _smollm2_method, prompt_ids
    if unrounded:      # the norms and the activation as before: RoPE's products still rounded
        transformer.rms_norm = lambda x, scale, eps, **_: layers.rms_norm(x, scale, eps)
        transformer.layer_norm = lambda x, s, b, eps, **_: layers.layer_norm(x, s, b, eps)
        transformer.activation = lambda name, x, **_: layers.activation(name, x)
    out = {}
    for dtype in dtypes:
        target = load(fetch("smollm2"), dtype=dtype)
        for name in ("autoregressive", "eagle"):
            method = name if name == "autoregressive" else _smollm2_method(name, target)
            for i, prompt in enumerate(prompt_ids(target)[::7]):
                result = generate(target, [prompt], method,
                                  SamplingParams(temperature=0.0, logprobs=1),
                                  max_new_tokens=32, kernels=False)
                out[f"{dtype} {name} prompt {7 * i}"] = (
                    [int(t) for t in result.tokens[0]],
                    [float(t.logprob).hex() for t in result.logprobs[0]])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "q8_0"])
    parser.add_argument("--unrounded", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(decode(args.dtypes, args.unrounded)))
        return
    runs = []
    for unrounded in (False, True):
        command = [sys.executable, __file__, "--child", "--dtypes", *args.dtypes]
        done = subprocess.run(command + (["--unrounded"] if unrounded else []),
                              capture_output=True, text=True, check=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"host: {platform.processor() or platform.machine()}, jax {jax.__version__}\n")
    print("| row | tokens | log-probabilities |\n|---|---|---|")
    for key, (tokens, logprobs) in runs[0].items():
        other_tokens, other_logprobs = runs[1][key]
        same = lambda a, b: "equal" if a == b else "differ"
        print(f"| {key} | {same(tokens, other_tokens)} ({len(tokens)}) "
              f"| {same(logprobs, other_logprobs)} |")


if __name__ == "__main__":
    main()
