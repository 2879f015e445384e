"""Compile time per method on SmolLM2 and one 1.2B-shape Llama's forward, for the code on
PYTHONPATH: run once with the old tree and once with the new, side by side (README.md here).

    PYTHONPATH=TREE python bench/compile-once-per-layer/compile_times.py --out FILE.json

Each method's whole-generation program is compiled in a fresh process (no persistent cache:
SPECJAX_COMPILE_CACHE=off), so one method's compile does not warm another's.
"""

import argparse
import json
import os
import subprocess
import sys
import time

METHODS = ("autoregressive", "speculative", "ngram", "medusa", "eagle")


def one_method(method: str, dtype: str) -> dict:
    import specjax
    from specjax.io.fetch import fetch
    target = specjax.load(fetch("smollm2"), dtype=dtype)
    chosen = {"autoregressive": lambda: specjax.Autoregressive(),
              "speculative": lambda: specjax.Speculative(
                  specjax.load("weights/smollm2-draft", dtype=dtype), k=4),
              "ngram": lambda: specjax.NGram(k=4),
              "medusa": lambda: specjax.Medusa(specjax.load("weights/smollm2-medusa")),
              "eagle": lambda: specjax.Eagle(specjax.load("weights/smollm2-eagle"))}[method]()
    result = specjax.generate(target, ["def fibonacci(n):"], chosen,
                              specjax.SamplingParams(temperature=0.0), max_new_tokens=16)
    return {"method": method, "dtype": dtype, "compile_s": result.stats.compile_s}


def llama_1b(layers: int) -> dict:
    """A random Llama of Llama-3.2-1B's shape (D 2048, 32/8 heads, F 8192, V 128256) with
    `layers` layers: the compile time of one decode step of `forward` (the kernels on)."""
    import jax
    import jax.numpy as jnp
    import specjax
    from specjax import kernels
    from specjax.model.cache import KVCache
    from specjax.model.transformer import forward
    from specjax.model.params import init_params
    kernels.ensure()
    config = specjax.ModelConfig(arch="llama", vocab_size=128256, d_model=2048, n_layers=layers,
                                 n_heads=32, n_kv_heads=8, head_dim=64, d_ff=8192,
                                 max_positions=512, norm_eps=1e-5, activation="silu",
                                 tie_embeddings=True)
    shapes = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
    cache = jax.eval_shape(lambda: KVCache.init(config, 1, 512))
    step = jax.jit(forward, static_argnums=1)
    tokens = jax.ShapeDtypeStruct((1, 1), jnp.int32)
    start = time.perf_counter()
    step.lower(shapes, config, tokens, tokens, cache).compile()
    return {"llama_1b_layers": layers, "compile_s": time.perf_counter() - start}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        kind, value, dtype = args.one.split(":")
        row = one_method(value, dtype) if kind == "method" else llama_1b(int(value))
        print(json.dumps(row))
        return
    rows = []
    env = dict(os.environ, SPECJAX_COMPILE_CACHE="off")
    jobs = [f"method:{m}:float32" for m in METHODS] + ["method:autoregressive:bfloat16",
                                                       "method:eagle:bfloat16"]
    jobs += [f"llama:{n}:float32" for n in (4, 16)]
    for job in jobs:
        out = subprocess.run([sys.executable, __file__, "--out", "-", "--one", job], env=env,
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    with open(args.out, "w") as f:
        json.dump({"python_path": os.environ.get("PYTHONPATH", ""), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
