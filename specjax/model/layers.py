"""The few pieces GPT-2 and Llama share: norms, rotary embeddings, attention and MLPs.

Dimension letters (as in `specjax.model`): B batch, T query length, S key length, D model
width, F MLP width, N query heads, K key/value heads, G = N / K, H head size.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from specjax.model.cache import (BITS, TreeAttention, as_bits, attention_mask, branch_layout,
                                 windows)
from specjax.model.config import ModelConfig
from specjax.model.linear import Kernels, attention_uses_kernel, layer_of, rope_uses_kernel
from specjax.model.quant import Int8Weight, rows, unfused


def lookup(table: jax.Array, ids: jax.Array) -> jax.Array:
    """table[ids]: rows of an embedding table. A 16-bit float table is read as its integer
    bits: XLA's CPU backend has no bfloat16 gather, so it would convert the whole table to
    float32 first, and in a decoding loop hoist that out, making one float32 copy of the table
    per call. The bits, and so the values, are the same. An 8-bit table
    (`specjax.model.quant.Int8Weight`) gives its rows dequantised to float32."""
    if isinstance(table, Int8Weight):
        return rows(table, ids)
    if jnp.dtype(table.dtype).itemsize != 2 or not jnp.issubdtype(table.dtype, jnp.floating):
        return table[ids]
    return lax.bitcast_convert_type(lax.bitcast_convert_type(table, jnp.uint16)[ids],
                                    table.dtype)


# The lanes of `row_sum`: a row's sum is accumulated in this many partial sums.
LANES = 16


def row_sum(v: jax.Array) -> jax.Array:
    """Sum over the last axis [..., D] -> [..., 1], in one order for every shape of the other
    axes: LANES partial sums, block by block of D, then halved pairwise. XLA's own reduction
    picks its order by the shape (a norm of one row and of nine rows summed the same 576 squares
    in different orders: a verify call and one-token steps differed in the last bit), and it
    does not reorder the explicit adds written here."""
    d = v.shape[-1]
    padded = -(-d // LANES) * LANES
    if padded != d:              # zeros add nothing
        v = jnp.pad(v, [(0, 0)] * (v.ndim - 1) + [(0, padded - d)])
    blocks = v.reshape(*v.shape[:-1], padded // LANES, LANES)
    acc = blocks[..., 0, :]
    for i in range(1, padded // LANES):
        acc = acc + blocks[..., i, :]
    width = LANES
    while width > 1:
        width //= 2
        acc = acc[..., :width] + acc[..., width:]
    return acc


def rounded(product: jax.Array, unfused_products: bool) -> jax.Array:
    """`product` as the add it feeds takes it: with `unfused_products` (XLA's path at the one
    law's width), rounded on its own, never fused into that add (`quant.unfused`; a NaN
    product stays NaN). XLA contracts a multiply and the add it feeds into one fma or not by
    the fusion they land in, so the same row could round two ways in two programs."""
    return unfused(product, jnp.isnan(product)) if unfused_products else product


def layer_norm(x, scale, bias, eps: float, *, unfused_products: bool = False):
    """LayerNorm over D, computed in float32 whatever the activation dtype (its means by
    `row_sum`, so a row's numbers do not depend on the call's width; `unfused_products`: each
    product that feeds an add rounded on its own, `rounded`)."""
    x32 = x.astype(jnp.float32)
    d = np.float32(x.shape[-1])
    mean = row_sum(x32) / d
    var = row_sum(rounded(jnp.square(x32 - mean), unfused_products)) / d
    y = (x32 - mean) * jax.lax.rsqrt(var + eps)
    return (rounded(y * scale, unfused_products) + bias).astype(x.dtype)


def rms_norm(x, scale, eps: float, *, unfused_products: bool = False):
    """RMSNorm over D in float32; like transformers, cast back before applying the scale. The
    mean of squares by `row_sum`: a row's numbers do not depend on the call's width
    (`unfused_products`: each square rounded before the sum, `rounded`)."""
    x32 = x.astype(jnp.float32)
    squares = rounded(jnp.square(x32), unfused_products)
    y = x32 * jax.lax.rsqrt(row_sum(squares) / np.float32(x.shape[-1]) + eps)
    return y.astype(x.dtype) * scale


def activation(name: str, x, *, unfused_products: bool = False):
    """The MLP's activation (`unfused_products`: GPT-2's gelu_new with its cubic term rounded
    before the add, `rounded`; the others add no product)."""
    if name == "gelu_tanh" and unfused_products:     # jax.nn.gelu's numbers, the add unfused
        cubic = rounded(0.044715 * x ** 3, True)
        return x * (0.5 * (1.0 + jnp.tanh(np.sqrt(2 / np.pi).astype(x.dtype) * (x + cubic))))
    if name == "gelu_tanh":      # GPT-2's gelu_new
        return jax.nn.gelu(x, approximate=True)
    if name == "gelu":
        return jax.nn.gelu(x, approximate=False)
    return jax.nn.silu(x)


# -- Rotary position embeddings ----------------------------------------------------------------

def rope_frequencies(config: ModelConfig) -> np.ndarray:
    """Inverse frequencies [H/2] (float32), with `linear` or `llama3` scaling applied.

    Computed once, in numpy: they depend only on the (static) config.
    """
    h = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, h, 2, dtype=np.float32) / np.float32(h)))
    inv_freq = inv_freq.astype(np.float32)
    scaling = config.rope_scaling_dict
    if scaling is None:
        return inv_freq
    if scaling["rope_type"] == "linear":
        return (inv_freq / np.float32(scaling["factor"])).astype(np.float32)
    # llama3 (Llama 3.1/3.2): long wavelengths are slowed down by `factor`, short ones kept, and
    # the band between is interpolated smoothly.
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_context / high) & (wavelen <= old_context / low)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_tables(positions, inv_freq, *, kernels: Kernels | None):
    """cos and sin of every position's rotation angles: [2, B, T, H/2] float32, the cosines
    then the sines, each angle once (the rotation uses it for both halves of a head).

    Computed once per forward call and shared by every layer's queries and keys; on a CPU with
    the kernels on, for calls of at most 32 tokens, by the tables kernel (`apply_rope`).

    Args:
      positions: [B, T] int; inv_freq: [H/2] (`rope_frequencies`); kernels: the CPU plug-in
      (the config's `kernels`), None for XLA's formulation.
    """
    if rope_uses_kernel(positions.shape[1], kernels):   # decoding steps and verify calls
        return lax.platform_dependent(positions, inv_freq, cpu=kernels.rope_tables,
                                      default=_rope_tables)
    return _rope_tables(positions, inv_freq)


def _rope_tables(positions, inv_freq):
    angles = positions.astype(jnp.float32)[..., None] * inv_freq       # [B, T, H/2]
    return jnp.stack([jnp.cos(angles), jnp.sin(angles)])


def apply_rope(q, k, tables, *, kernels: Kernels | None, unfused_products: bool = False):
    """Half-split ("rotate_half") RoPE, the Hugging Face Llama layout.

    A call on at most 32 tokens (decoding steps, verify calls) on a CPU with the kernels on
    rotates by the RoPE kernel (`specjax.model.linear.Kernels.rope`), as its tables come from
    the tables kernel (`rope_tables`). Why: XLA fuses this arithmetic into its consumers, and
    the keys' consumer is the cache write, a transpose whose code differs with the call's
    width; a key rotated in a 9-token call and in a one-token step can come out a rounding
    apart (the logits then differ in the fifth decimal), so greedy speculation could leave
    greedy decoding at a near-tie. The kernel computes every value by the same written
    operations whatever the call (specjax/kernels/few_rows.cc gives them), queries and keys in
    one call.

    XLA's rotation has the same hazard on XLA's path, where no kernel serves: left to itself,
    XLA contracts x * cos + rotated * sin into an fma (rounded once, not twice) or not,
    depending on the fusion it lands in, and a tree call's queries are consumed elsewhere than
    a step's (`attend_cache`'s `by_branch`): with XLA's default (MLIR) fusion emitters, a tree
    node's query on a model with several key/value heads came out a rounding apart from the
    step's (SmolLM2 in q8_0, where an 8-bit rounding of the activations then flipped, parted
    from greedy decoding at 4 of 21 prompts: bench/xla-one-law/). `unfused_products` (XLA's
    path at the one law's width, `transformer._layer`) rounds each product on its own
    (`rounded`) before the add, one written order whatever the fusion.

    Args:
      q: [B, T, N, H]; k: [B, T, K, H]; tables: [2, B, T, H/2] from `rope_tables`; kernels:
      as `rope_tables`'; unfused_products: as above (XLA's formulation only).
    Returns:
      (q, k) rotated, in their dtypes.
    """
    def xla(q, k, tables):
        return (_apply_rope(q, tables, unfused_products),
                _apply_rope(k, tables, unfused_products))
    if rope_uses_kernel(q.shape[1], kernels, q.dtype):  # decoding steps and verify calls
        rope = kernels.rope

        def kernel(q, k, tables):
            rq, rk = rope(q, k, tables)
            return rq.astype(q.dtype), rk.astype(k.dtype)
        return lax.platform_dependent(q, k, tables, cpu=kernel, default=xla)
    return xla(q, k, tables)


def rotate(x, tables):
    """RoPE of one tensor x [B, T, heads, H] by tables [2, B, T, H/2] (`rope_tables`), XLA's
    formulation at every width: for what is not a model's own query or key (a DFlash drafter's
    context keys), where no verify call has to match a step."""
    return _apply_rope(x, tables)


def _apply_rope(x, tables, unfused_products: bool = False):
    """XLA's rotation of x [B, T, heads, H] by tables [2, B, T, H/2]. `unfused_products`: each
    of the two products rounded on its own, then added (`apply_rope` says why); else XLA may
    fuse either into the add."""
    cos, sin = (jnp.concatenate([t, t], axis=-1)[:, :, None, :] for t in tables)  # [B, T, 1, H]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    straight = rounded(x.astype(jnp.float32) * cos, unfused_products)
    turned = rounded(rotated * sin, unfused_products)
    return (straight + turned).astype(x.dtype)


# -- Attention ----------------------------------------------------------------------------------

def attend(q, k, v, mask):
    """Grouped-query attention.

    Args:
      q: [B, T, N, H]; k: [B, K, H, S] and v: [B, K, S, H] (the cache's layouts, see
      `specjax.model.cache`); mask: [B, T, S] bool, which keys each query reads
      (`cache.attention_mask`).
    Returns:
      [B, T, N, H]

    Both products are batched over (B, K) with those axes leading in every operand, and the
    queries of one key/value head, its G = N / K heads at the T positions, are the M rows of
    one matrix product [T*G, H] @ [H, S]. Written as einsums with T and G as separate axes, XLA
    on a CPU transposed the small operands around every product (docs/benchmarks.md, "The
    model's layouts, measured").
    """
    b, t, n, h = q.shape
    kv_heads = k.shape[1]
    g = n // kv_heads
    # Queries of one group share a key/value head: regroup instead of repeating K and V.
    q = q.reshape(b, t, kv_heads, g, h).transpose(0, 2, 1, 3, 4).reshape(b, kv_heads, t * g, h)
    batched = ((0, 1), (0, 1))                                          # (B, K) in both
    # The softmax is in float32; the product stays in the cache's dtype (XLA's CPU dot has no
    # bfloat16 x bfloat16 -> float32 kernel for this shape).
    scores = lax.dot_general(q, k, (((3,), (2,)), batched)).astype(jnp.float32)  # [B, K, TG, S]
    scores = scores / np.float32(math.sqrt(h))
    mask = jnp.repeat(mask, g, axis=1)[:, None]                          # [B, 1, TG, S]
    # Every query sees at least its own slot, so no row of the softmax is all -inf. The softmax
    # is normalised after the product with the values, on [.., TG, H] rather than [.., TG, S]:
    # the same numbers, one pass less over the scores.
    scores = jnp.where(mask, scores, -jnp.inf)
    weights = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))  # [B, K, TG, S]
    total = jnp.sum(weights, axis=-1, keepdims=True)                     # [B, K, TG, 1]
    out = lax.dot_general(weights.astype(v.dtype), v, (((3,), (2,)), batched))  # [B, K, TG, H]
    out = out.astype(jnp.float32) / total
    out = out.reshape(b, kv_heads, t, g, h).transpose(0, 2, 1, 3, 4)     # [B, T, K, G, H]
    return out.astype(v.dtype).reshape(b, t, n, h)


# The smallest prefix of the cache that XLA's path reads for a call with few queries (a decoding
# step, where the few-query kernel does not apply) and for one with many (a prefill chunk); see
# `attend_cache`.
STEP_WINDOW, CHUNK_WINDOW, CHUNK_QUERIES = 1024, 128, 64


def attend_cache(q, cache_k, cache_v, query_slots, tree: TreeAttention | None = None,
                 first: int = 0, layer=0, *, kernels: Kernels | None,
                 by_branch: bool = False):
    """Attention of queries to layer `layer` of a cache, reading only the prefix they can see.

    A call on few tokens (a decoding step, a verify call) uses the few-query kernel, which
    reads the cache in place up to the last slot any query sees (`specjax.model.linear`
    decides, `Kernels.attention` computes). The
    rest of this docstring is about XLA's path, for prefill chunks:

    The queries in `query_slots` see keys in slots <= their own, so slots past the batch's
    largest query slot are never needed. Shapes are static under `jit`, so the
    prefix read is the shortest of a few static windows (`cache.windows`) that covers them,
    picked at run time by `lax.switch`: a long prompt's chunks and the steps after it cost
    what the tokens in the cache cost, not what the buffer could hold.

    A decoding step's smallest window is 1,024 slots, not less, because taking a prefix is a
    copy under XLA, and on a CPU that copy costs about what attention over the unused slots
    would (docs/benchmarks.md, "The model's layouts, measured"). A prefill
    chunk of 256 queries does 256 times the arithmetic per key read, so its windows start at
    128 slots.

    Args:
      q: [B, T, N, H]; cache_k: [L, B, K, H, S] and cache_v: [L, B, K, S, H], every layer's
      buffers, with this call's keys already written; query_slots: [B, T] (their positions,
      except in a token tree); tree: the token tree the queries belong to, if any
      (`cache.attention_mask`); first: the cache's `KVCache.first`; layer: [] int, the layer
      whose buffers the queries read (the kernel reads them where they lie in the stack);
      kernels: the CPU plug-in (the config's `kernels`), None for XLA's windows.
      by_branch: on XLA's path at the one law's width (`ModelConfig.law_width` > 1), each tree
        node reads its branch's keys laid out as in one-token steps (`_attend_by_branch`).
    Returns:
      [B, T, N, H]
    """
    layer = jnp.asarray(layer, jnp.int32)
    windowed = functools.partial(_attend_windows, first=first,
                                 by_branch=by_branch and tree is not None)
    if attention_uses_kernel(q, *(_as_float(c) for c in (cache_k, cache_v)), kernels):
        in_place = functools.partial(_attend_in_place, first=first, kernels=kernels)  # a few
        return lax.platform_dependent(q, cache_k, cache_v, query_slots, tree, layer,   # tokens
                                      cpu=in_place, default=windowed)
    return windowed(q, cache_k, cache_v, query_slots, tree, layer)


def _as_float(buffer):
    """A cache buffer carried as bfloat16's bits (`cache.as_bits`) as bfloat16 again: a copy
    where it is computed, so it is taken of the few slots read, or as an abstract value."""
    if isinstance(buffer, jax.ShapeDtypeStruct) or buffer.dtype != BITS:
        return buffer
    return lax.bitcast_convert_type(buffer, jnp.bfloat16)


def _attend_in_place(q, cache_k, cache_v, query_slots, tree, layer, first=0, *, kernels):
    """`attend_cache` by the few-query kernel: the layer's buffer read in place, up to the slots
    in use."""
    b, slots = q.shape[0], cache_v.shape[-2]
    key_slots = jnp.broadcast_to(jnp.arange(slots, dtype=jnp.int32), (b, slots))
    limit = jnp.max(query_slots, axis=1) + 1                                  # [B]
    dtype = _as_float(cache_v).dtype
    cache_k, cache_v = as_bits(cache_k)[0], as_bits(cache_v)[0]    # bfloat16 as its bits
    return kernels.attention(q, cache_k, cache_v,
                             attention_mask(query_slots, key_slots, tree, first), limit,
                             layer).astype(dtype)


def _attend_windows(q, cache_k, cache_v, query_slots, tree, layer, first=0, by_branch=False):
    """`attend_cache` by XLA: the shortest static window of the layer's buffers that covers the
    queries (each tree node over its branch's layout with `by_branch`)."""
    cache_k, cache_v = layer_of((cache_k, cache_v), layer)
    cache_k, cache_v = _as_float(cache_k), _as_float(cache_v)
    b, t = q.shape[:2]
    sizes = windows(cache_v.shape[2], CHUNK_WINDOW if t >= CHUNK_QUERIES else STEP_WINDOW)

    def attend_prefix(size):
        def branch(q, cache_k, cache_v, query_slots, tree):
            key_slots = jnp.broadcast_to(jnp.arange(size, dtype=jnp.int32), (b, size))
            keys, values = cache_k[..., :size], cache_v[:, :, :size]
            if by_branch:
                return _attend_by_branch(q, keys, values, query_slots, key_slots, tree, first)
            return attend(q, keys, values, attention_mask(query_slots, key_slots, tree, first))
        return branch

    if len(sizes) == 1:
        return attend_prefix(sizes[0])(q, cache_k, cache_v, query_slots, tree)
    needed = jnp.max(query_slots) + 1
    index = jnp.searchsorted(jnp.asarray(sizes, jnp.int32), needed)   # first window >= needed
    return lax.switch(index, [attend_prefix(size) for size in sizes],
                      q, cache_k, cache_v, query_slots, tree)


def _attend_by_branch(q, k, v, query_slots, key_slots, tree, first):
    """`attend` for the nodes of a token tree, each over its branch's keys laid out as one-token
    steps along the branch find them (`cache.branch_layout`): the ancestor at depth j in slot
    root + j, masked past the node's position.

    Why: XLA sums a softmax's slots, and the weighted values', in an order that depends on
    where the unmasked slots lie, and a tree node's ancestors lie among its siblings' slots. So
    each node t is one `attend` of the call's shape, the one a step runs, over its own layout
    (a loop over the T nodes: T times a call's attention, on XLA's path's tree calls only), and
    keeps its row; its sums then run over the slots a step's do, in the same places.

    Args:
      q: [B, T, N, H]; k: [B, K, H, S], v: [B, K, S, H] (a window of the cache); query_slots:
      [B, T]; key_slots: [B, S]; tree; first: as in `attend_cache`.
    Returns:
      [B, T, N, H]
    """
    sources, positions = branch_layout(query_slots, key_slots, tree)     # [B, T, S], [B, T]
    mask = attention_mask(positions, key_slots, None, first)             # [B, T, S]

    def node(t):                                                        # -> [B, N, H]
        at = lax.dynamic_index_in_dim(sources, t, axis=1, keepdims=False)   # [B, S]
        keys = jnp.take_along_axis(k, at[:, None, None, :], axis=3)         # [B, K, H, S]
        values = jnp.take_along_axis(v, at[:, None, :, None], axis=2)       # [B, K, S, H]
        return lax.dynamic_index_in_dim(attend(q, keys, values, mask), t, axis=1, keepdims=False)
    return jnp.moveaxis(lax.map(node, jnp.arange(q.shape[1])), 0, 1)
