"""Times one cached decode step and one K+1-token verify call of a mid-size random Llama.

    python scripts/bench_forward.py [--layers 12 --d-model 768 --k 4 --context 512]

Reports the median of several calls after warm-up, and the bytes of weights each call must
read, which divided by the time gives the memory bandwidth the call achieves (decode of a
small batch is bandwidth-bound: every weight is read once per call).
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from specjax.cache import KVCache
from specjax.model import count_params, forward


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()

    d = args.d_model
    config = specjax.ModelConfig(arch="llama", vocab_size=args.vocab, d_model=d,
                                 n_layers=args.layers, n_heads=args.heads,
                                 n_kv_heads=args.kv_heads, head_dim=d // args.heads,
                                 d_ff=int(8 * d / 3) // 64 * 64, max_positions=args.context,
                                 norm_eps=1e-5, activation="silu", tie_embeddings=False)
    params = specjax.init_params(config, jax.random.key(0))
    step = jax.jit(forward, static_argnums=1)
    cache = KVCache.init(config, 1, args.context)
    # Fill half the context so attention reads a realistic cache.
    half = args.context // 2
    _, cache = step(params, config, jnp.zeros((1, half), jnp.int32), jnp.arange(half)[None], cache)

    def timed(t):
        tokens = jnp.zeros((1, t), jnp.int32)
        positions = half + jnp.arange(t)[None]
        jax.block_until_ready(step(params, config, tokens, positions, cache))  # compile + warm
        times = []
        for _ in range(args.reps):
            start = time.perf_counter()
            jax.block_until_ready(step(params, config, tokens, positions, cache))
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    weight_bytes = 4 * count_params(params)
    decode, verify = timed(1), timed(args.k + 1)
    print(f"config: {args.layers} layers, D={d}, N={args.heads}, K={args.kv_heads}, "
          f"V={args.vocab}, {count_params(params) / 1e6:.1f}M params (float32), "
          f"cache {args.context} slots, {half} filled; {jax.devices()[0].device_kind}")
    for name, seconds in (("decode step (1 token)", decode),
                          (f"verify call ({args.k + 1} tokens)", verify)):
        print(f"{name:26s} {seconds * 1e3:8.2f} ms   {weight_bytes / seconds / 1e9:6.2f} GB/s of weights")
    print(f"verify / decode = {verify / decode:.2f}  (the price of checking K={args.k} drafts)")


if __name__ == "__main__":
    main()
