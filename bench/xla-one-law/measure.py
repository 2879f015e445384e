"""Issue 85's starting point: on XLA's path (the CPU kernels off, the path GPU and TPU programs
take), does a token get the same logits scored alone and inside a verify call?

    python bench/xla-one-law/measure.py [--dtypes float32 bfloat16 int8 q8_0] > out.md

On SmolLM2-135M (fetched on first use): a 12-token prefill, then 17 one-token steps, against
calls of 2, 9 and 17 tokens on the same cache, with the kernels off and on; and XLA's product
`x @ w.T` (576 by 1,536, the MLP's first matrix) at 1 to 17 rows, each row against the same row
in a 16-row product. Prints a Markdown table per check: equal bit for bit, or the largest
difference.
"""

from __future__ import annotations

import argparse
import platform

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from specjax.api.forward import forward
from specjax.io.fetch import fetch
from specjax.model.cache import KVCache
from specjax.model.transformer import in_dtype

PREFILL, STEPS, CALLS = 12, 17, (2, 9, 17)


def steps_and_calls(model, kernels: bool):
    """([STEPS, V] logits of one-token steps, {n: [n, V]} of n-token calls), one row."""
    tokens = np.random.default_rng(7).integers(0, model.config.vocab_size, (1, PREFILL + STEPS))
    run = lambda t, p, c: forward(model.params, model.config, t, p, c, kernels=kernels)
    _, cache = run(tokens[:, :PREFILL], np.arange(PREFILL)[None], KVCache.init(model.config, 1, 64))
    out, c = [], cache
    for i in range(PREFILL, PREFILL + STEPS):
        logits, c = run(tokens[:, i:i + 1], np.array([[i]]), c)
        out.append(np.asarray(logits[0, 0]))
    calls = {n: np.asarray(run(tokens[:, PREFILL:PREFILL + n],
                               np.arange(PREFILL, PREFILL + n)[None], cache)[0][0])
             for n in CALLS}
    return np.stack(out), calls


def verdict(a: np.ndarray, b: np.ndarray) -> str:
    if np.array_equal(a, b):
        return "equal"
    return f"differ, max {np.max(np.abs(a.astype(np.float64) - b)):.2g}"


def products(dtype: str) -> list[str]:
    """XLA's product at 1..17 rows against the same rows of a 16-row product."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((17, 576)), dtype)
    w = jnp.asarray(rng.standard_normal((1536, 576)) * 0.05, dtype)
    dot = jax.jit(lambda x, w: jnp.einsum("TD,FD->TF", x, w, preferred_element_type=jnp.float32))
    full = np.asarray(dot(x[:16], w))
    return [f"{n}: {verdict(np.asarray(dot(x[:n], w))[:min(n, 16)], full[:min(n, 16)])}"
            for n in (1, 2, 4, 8, 9, 16, 17)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "int8", "q8_0"])
    args = parser.parse_args()
    base = specjax.load(fetch("smollm2"))
    print(f"host: {platform.processor() or platform.machine()}, jax {jax.__version__}\n")
    print("| dtype | kernels | " + " | ".join(f"{n}-token call vs steps" for n in CALLS) + " |")
    print("|---|---|" + "---|" * len(CALLS))
    for dtype in args.dtypes:
        model = in_dtype(base, dtype)
        for kernels in (False, True):
            steps, calls = steps_and_calls(model, kernels)
            cells = [verdict(calls[n], steps[:n]) for n in CALLS]
            print(f"| {dtype} | {'on' if kernels else 'off'} | " + " | ".join(cells) + " |",
                  flush=True)
    print("\nXLA's product, rows of an n-row call against a 16-row call:")
    for dtype in ("float32", "bfloat16"):
        print(f"- {dtype}: " + "; ".join(products(dtype)))


if __name__ == "__main__":
    main()
