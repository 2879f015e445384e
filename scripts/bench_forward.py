"""Times one cached decode step and one K+1-token verify call, next to numpy on the same weights.

    python scripts/bench_forward.py                          # a random 12-layer D=768 Llama
    python scripts/bench_forward.py --model ~/.cache/specjax/smollm2-135m-instruct
    python scripts/bench_forward.py --model ~/.cache/specjax/smollm2-135m-instruct \
        --medusa weights/smollm2-medusa --eagle weights/smollm2-eagle --sizes 1,5,9,16,24

`--medusa` adds one step of Medusa heads (every head's blocks and its subset projection, on one
hidden state) and its cost ratio c to the decode step; `--sizes` times verify calls of each
number of tokens (a tree's nodes plus its root), in units of the decode step, next to the same
calls with XLA's formulation throughout (`specjax.model.linear`), in units of its own step.
`--eagle` times one call of an EAGLE drafter (fusion, its decoder layer over its own cache,
its subset logits) on 1, 4 and 8 pairs, each as a cost ratio c of the decode step: a static
tree of depth D costs D calls (the catch-up and one per level above the deepest), and so does
a dynamic tree.

Reports medians of several calls after warm-up, and the bytes of weights each call must read,
which divided by the time gives the memory bandwidth the call achieves (decoding a small batch
is bandwidth-bound: every weight is read once per call). The numpy line multiplies one token's
vector through every weight matrix of the same model (each layer's projections and the LM head)
with the machine's BLAS: what streaming those bytes costs without any of the model's other work,
the yardstick for the decode step.
"""

import argparse
import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from specjax import kernels
from specjax.decoding.loop import with_kernels
from specjax.model.cache import KVCache
from specjax.model.config import DTYPES
from specjax.model.params import init_params, unstack_layers
from specjax.model.quant import Int8Weight, dequantize
from specjax.model.transformer import count_params, forward


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a checkpoint directory (default: a random Llama)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32",
                        help="the weights' dtype (and the cache's, but for int8 and q8_0: "
                             "float32)")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--medusa", help="a Medusa heads directory for --model: time one step of them")
    parser.add_argument("--eagle", help="an EAGLE drafter directory for --model: time its calls")
    parser.add_argument("--sizes", help="comma-separated call sizes to time, in decode steps")
    args = parser.parse_args()
    plugin = kernels.plugin()     # built and registered, as `generate` does
    if (args.medusa or args.eagle) and not args.model:
        parser.error("--medusa and --eagle need --model, the target they were trained on")

    if args.model:
        model = specjax.load(args.model, dtype=args.dtype)
        config, params = model.config, model.params
    else:
        d = args.d_model
        config = specjax.ModelConfig(arch="llama", vocab_size=args.vocab, d_model=d,
                                     n_layers=args.layers, n_heads=args.heads,
                                     n_kv_heads=args.kv_heads, head_dim=d // args.heads,
                                     d_ff=int(8 * d / 3) // 64 * 64, max_positions=args.context,
                                     norm_eps=1e-5, activation="silu", tie_embeddings=False,
                                     dtype=args.dtype)
        params = init_params(config, jax.random.key(0))
    config = config.replace(kernels=plugin)      # the programs name the kernels they use
    step = jax.jit(forward, static_argnums=1)
    cache = KVCache.init(config, 1, args.context)
    # Fill half the context so attention reads a realistic cache.
    half = args.context // 2
    _, cache = step(params, config, jnp.zeros((1, half), jnp.int32), jnp.arange(half)[None], cache)

    def median_time(fn):
        jax.block_until_ready(fn())   # compile + warm
        times = []
        for _ in range(args.reps):
            start = time.perf_counter()
            jax.block_until_ready(fn())
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    # Calls are repeated inside one compiled loop, as the decoding loop makes them: timing single
    # calls from Python would add the dispatch of every parameter array to each.
    repeats = 10

    def compiled(t, xla_only=False):
        """A program making `repeats` calls on t tokens, compiled; with xla_only, traced with a
        config that names no kernels, so that every product and attention is XLA's (the engine
        before the kernels)."""
        @functools.partial(jax.jit, static_argnums=1)
        def repeated(params, config, tokens, positions, cache):
            def call(i, carry):
                total, cache = carry
                # A token that changes with i, so the call cannot be hoisted out of the loop;
                # the cache is carried, as the decoding loop carries it, so that its writes
                # are in place (a cache left unchanged would be copied by every call).
                logits, cache = forward(params, config, tokens + i, positions, cache)
                return total + jnp.max(logits), cache  # uses every logit, so none is skipped
            return jax.lax.fori_loop(0, repeats, call, (jnp.zeros((), jnp.float32), cache))[0]

        tokens = jnp.zeros((1, t), jnp.int32)
        positions = half + jnp.arange(t)[None]
        traced = config.replace(kernels=None) if xla_only else config
        run = lambda: repeated(params, traced, tokens, positions, cache)  # noqa: E731
        jax.block_until_ready(run())
        return run

    def timed(t):
        return median_time(compiled(t)) / repeats

    # What a step reads: every parameter's bytes (int8: values and scales), the embeddings
    # counted once (a tied head reads them; an untied one is its own).
    # A q8_0 matrix's packed copy (`Q8_0Weight.tiles`) is the same weights again: a call reads
    # one of the two.
    weight_bytes = sum(a.nbytes for a in jax.tree.leaves(jax.tree.map(
        lambda w: (w.values, w.scales) if isinstance(w, Int8Weight) else w, params,
        is_leaf=lambda w: isinstance(w, Int8Weight))))
    decode, verify = timed(1), timed(args.k + 1)
    numpy_time = median_time(numpy_matvecs(params, config))
    print(f"config: {config.n_layers} layers, D={config.d_model}, N={config.n_heads}, "
          f"K={config.n_kv_heads}, V={config.vocab_size}, {count_params(params) / 1e6:.1f}M params "
          f"({args.dtype}), cache {args.context} slots, {half} filled; {jax.devices()[0].device_kind}")
    for name, seconds in (("decode step (1 token)", decode),
                          (f"verify call ({args.k + 1} tokens)", verify),
                          ("numpy mat-vecs, same weights", numpy_time)):
        print(f"{name:30s} {seconds * 1e3:8.2f} ms   {weight_bytes / seconds / 1e9:6.2f} GB/s of weights")
    print(f"verify / decode = {verify / decode:.2f}  (the price of checking K={args.k} drafts)")
    print(f"decode step at {numpy_time / decode:.2f} of numpy's bandwidth")
    if args.sizes:
        print_sizes([int(t) for t in args.sizes.split(",")], compiled, args.reps)
    if args.medusa:
        heads_time = time_heads(args.medusa, model, repeats, median_time)
        print(f"{'medusa heads (one step)':30s} {heads_time * 1e3:8.2f} ms   "
              f"c = {heads_time / decode:.3f} of the decode step")
    if args.eagle:
        for pairs, seconds in time_drafter(args.eagle, model, repeats, median_time, args.context,
                                           half).items():
            print(f"{f'eagle drafter call ({pairs} pairs)':30s} {seconds * 1e3:8.2f} ms   "
                  f"c = {seconds / decode:.3f} of the decode step")


def print_sizes(sizes, compiled, rounds):
    """The cost of a call on each number of tokens, in one-token steps of the same formulation:
    specjax's (`model.linear`: the few-row kernels where they apply) and XLA's for every product
    and attention (a config naming no kernels, the engine before them), side by side. Each round
    times every call once, so that a machine's drift moves them together; medians of the
    rounds' ratios."""
    sizes = sorted(set(sizes) | {1})
    calls = {(t, xla_only): compiled(t, xla_only) for t in sizes for xla_only in (False, True)}
    ratios = {key: [] for key in calls}
    xla_step = []
    for _ in range(rounds):
        times = {key: seconds(run) for key, run in calls.items()}
        for (t, xla_only), time_ in times.items():
            ratios[t, xla_only].append(time_ / times[1, xla_only])
        xla_step.append(times[1, True] / times[1, False])
    print(f"call of n tokens / the same formulation's one-token step, median of {rounds} rounds:")
    print(f"{'n':>4s} {'specjax':>8s} {'XLA':>8s}")
    for t in sizes:
        print(f"{t:4d} {statistics.median(ratios[t, False]):8.2f} "
              f"{statistics.median(ratios[t, True]):8.2f}")
    print(f"XLA's one-token step / specjax's: {statistics.median(xla_step):.2f}")


def seconds(run) -> float:
    start = time.perf_counter()
    jax.block_until_ready(run())
    return time.perf_counter() - start


def time_heads(directory, model, repeats, median_time):
    """Seconds for one step of the heads on one hidden state, as many heads as their shipped
    tree is deep: what Medusa decoding adds to each target call."""
    from specjax.heads import medusa

    heads = specjax.load(directory)
    weights = medusa.runtime_weights(heads, model)
    depth = heads.tree.max_depth if heads.tree else heads.config.num_heads

    @jax.jit
    def repeated(weights, h):
        def call(i, total):
            return total + jnp.max(medusa.subset_logits(weights, h + i, depth,
                                                        kernels=kernels.plugin()))
        return jax.lax.fori_loop(0, repeats, call, jnp.zeros((), jnp.float32))

    h = jnp.ones((1, heads.config.hidden_size), jnp.float32)
    return median_time(lambda: repeated(weights, h)) / repeats


def time_drafter(directory, model, repeats, median_time, slots, filled):
    """Seconds for one drafter call on 1, 4 and 8 pairs over a cache with `filled` slots
    written: the features in, the subset logits out (what a level of a tree costs)."""
    from specjax.heads import eagle

    drafter = specjax.load(directory)
    weights = eagle.runtime_weights(drafter, model)
    config = with_kernels(drafter.config, kernels.plugin())
    embed = model.params["embed"]
    cache = KVCache.init(config.layer, 1, slots)

    @functools.partial(jax.jit, static_argnums=0)
    def repeated(t, weights, cache):
        features = jnp.ones((1, t, config.hidden_size), jnp.float32)
        positions = filled + jnp.arange(t)[None]

        def call(i, total):
            out, _ = eagle.draft_features(weights, config, embed, features + i,
                                          jnp.zeros((1, t), jnp.int32), positions, cache)
            return total + jnp.max(eagle.draft_logits(weights, config, out))
        return jax.lax.fori_loop(0, repeats, call, jnp.zeros((), jnp.float32))

    return {t: median_time(lambda t=t: repeated(t, weights, cache)) / repeats for t in (1, 4, 8)}


def numpy_matvecs(params, config):
    """One vector through every weight matrix, as [out, in] float32 numpy arrays (8-bit ones
    dequantised), and through the LM head (embeddings are a lookup, so the head is their only
    mat-vec)."""
    def as_matrix(name, a):      # [out, in]: wq/wk/wv are [heads, H, D], wo is [D, N, H]
        a = np.asarray(dequantize(a) if isinstance(a, Int8Weight) else a, np.float32)
        return a.reshape(-1, a.shape[-1]) if name in ("wq", "wk", "wv") else a.reshape(a.shape[0], -1)

    matrices = [as_matrix(name, a) for layer in unstack_layers(params["layers"])
                for name, a in sorted(layer.items()) if name.startswith("w")]
    inputs = [np.ones(w.shape[1], np.float32) for w in matrices]
    head = as_matrix("head", params["embed"] if config.tie_embeddings
                     else params["lm_head"])                                    # [V, D]
    x = np.ones(config.d_model, np.float32)

    def run():
        for w, v in zip(matrices, inputs):
            w @ v
        return head @ x
    return run


if __name__ == "__main__":
    main()
