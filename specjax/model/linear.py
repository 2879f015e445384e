"""Every weight product of the model, and the one interface between the model and a CPU
plug-in: products, RoPE and attention to the cache are XLA's formulations unless the call is
given a plug-in's kernels (`Kernels`, its config's `kernels`), and this module alone decides
which calls they serve.

The model multiplies activations x [..., I] by weights w [O, I] (stored [out, in], as
`specjax.model.transformer` explains): `linear(x, w)`. How that product is best computed
depends on how many rows x has, which is static under `jit`:

| rows                      | who calls                                      | formulation       |
|---------------------------|------------------------------------------------|-------------------|
| 1-32                      | decoding steps, verify calls (a chain or tree of drafts) | the few-row kernel |
| 33-1,024, of 1-32 tokens each | the same calls on a large batch            | the kernel, in calls of at most 32 rows (`kernel_chunks`) |
| more, of longer rows, or a prefill's | prefill, training, huge batches     | XLA's dot (a GEMM) |

Decoding a small batch is bound by reading the weights, and a verify call reads the same
weights as a one-token step, so it should cost about one step; the few-row kernel reads each
weight once whatever the rows. It sums each output in one written order whatever the call's
width, so a one-token step takes it too: a verify call's row and the step at that position get
the same bits. A large batch's decoding calls take the kernel too, in calls of at most 32 rows,
so that a row's bits never depend on the batch it decodes in. A prefill is compute-bound, and
XLA's GEMM, which packs and tiles for that, is the better one there: a forward call says it
reads a prompt by its `prefill` argument (`linear`'s, `transformer.hidden_states`'), and its
calls of more than 32 rows then take the GEMM whatever their tokens per row.

bfloat16 weights halve the bytes a step reads, where XLA's CPU products on them run far below
the memory's speed. With bfloat16 activations too (the bfloat16 dtype's model), the kernel
multiplies bfloat16 pairs where the CPU has the instruction (AVX512_BF16's VDPBF16PS: two exact
products added to a float32 lane, no widening; `Kernels.product_bf16_pairs`), and elsewhere
widens each operand to float32 as it loads it and sums in float32, as it does for float32
activations; the result is cast to the output dtype (`FEW_ROWS`). Either way a row's sums are
the same operations whatever the call's width.

RoPE of a call on at most 32 tokens is the kernels' too (`rope_uses_kernel`; the reason is in
`layers.apply_rope`).

8-bit weights (`specjax.model.quant.Int8Weight`: int8 values, a float16 scale per block of 32
inputs) read a quarter of float32's bytes. The kernel takes them as it takes float32's,
dequantising each value as it loads it; XLA has no such product, so for prefill, and wherever
the kernel does not run, XLA's dot multiplies the dequantised weights.

The q8_0 dtype's matrices (`quant.Q8_0Weight`, the same values and scales) multiply by another
law, llama.cpp's Q8_0 x Q8_0: the activations rounded to 8 bits per row and block
(`quant.quantize_rows`), integer block sums, the blocks combined in float32 in ggml's reference
order (`q8_0_law`). Its kernel (1-32 rows) and its XLA form (every other width, the kernels
off, other platforms) give the same bits, so a q8_0 product does not depend on who computes it.

Attention to the KV cache (`layers.attend_cache`) of a call on at most 32 tokens (`FEW_QUERIES`:
decoding steps and verify calls, one token included) uses the few-query attention kernel,
which reads the cache in place and only up to the slots in use, where XLA's attention reads a
static window of the cache (a copy of it). Prefill chunks keep XLA's windows. The measurements
behind these choices are in docs/benchmarks.md ("The engine, and what limits it on a CPU").

The decoder compiles one layer for all layers (`transformer.decoder_layers`, a scan over L), so
a layer's weights are a slice of arrays stacked along L. A slice is a copy under XLA on a CPU,
which would double a step's memory traffic; so every kernel call takes the whole stack and the
layer's index (`linear`'s `stacked`, the attention kernel's `layer`) and reads the layer where
it lies. XLA's formulations read the slice.

The kernels are a plug-in (`Kernels`): `specjax.kernels` builds its C++ and registers it with
XLA, outside the model layer, and its `Kernels` is data a program carries: the `kernels` field of
the `ModelConfig` a function is traced with (`transformer.lawful` sets it, where the programs
are built: `decoding.loop`, `specjax.forward`). This module reads no state of its own. A kernel
is used only when all of these hold:

- the call is given a plug-in (`kernels`, from its config; None: XLA's formulations);
- the operands are float32 or bfloat16 and the program is lowered for a CPU
  (`lax.platform_dependent`: a program lowered for a GPU or a TPU never contains them, and
  there XLA's own bfloat16 products run).

Otherwise XLA's formulation runs; the two give the same results up to float32 rounding
(summation order), and for bfloat16 up to where XLA rounds to bfloat16 in between. A device
mesh turns them off: XLA cannot split a custom call across devices.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from specjax.model.config import Kernels
from specjax.model.quant import Int8Weight, Q8_0Weight, dequantize, quantize_rows, unfused

__all__ = ["CHUNKED_ROWS", "FEW_QUERIES", "FEW_ROWS", "KERNEL_BLOCK", "KERNEL_DTYPES", "Kernels",
           "attention_uses_kernel", "in_chunks", "in_place", "kernel_chunks", "layer_of",
           "linear", "q8_0_law", "rope_uses_kernel"]

# The numbers of rows (all leading axes of x together) that the few-row kernel computes, in
# every dtype: one row too, so that a step sums as a verify call's rows do.
FEW_ROWS = range(1, 33)
# The numbers of tokens per row of a call whose attention to the cache is the kernel's.
FEW_QUERIES = range(1, 33)
# The most rows a decoding call computes in calls of at most 32 rows (`kernel_chunks`): a batch
# of 32 rows verifying 32 tokens each, or 1,024 rows stepping. Past it, XLA's GEMM, which is
# faster on huge batches (the distribution tests' 100,000 rows).
CHUNKED_ROWS = 1024

# The dtypes of weights and caches the kernels read; activations of either are cast to float32.
KERNEL_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))

# 8-bit weights' blocks must be whole vectors of the widest kernel (16 floats, AVX-512).
KERNEL_BLOCK = 16


def linear(x: jax.Array, w: jax.Array | Int8Weight, out_dtype=None,
           stacked: tuple | None = None, prefill: bool = False, *,
           kernels: Kernels | None) -> jax.Array:
    """x [..., I] times w [O, I] over I -> [..., O] (in out_dtype, else x's dtype). w may be
    an `Int8Weight` (`specjax.model.quant`): its dequantised weights; or a `Q8_0Weight`: the
    q8_0 law (`q8_0_law`).

    `stacked`, when w is one layer of a stack (the decoder's loop over its layers,
    `transformer.decoder_layers`): (every layer's matrix [L, O, I], w's index in it [] int32).
    A kernel then reads the layer where it lies in the stack, where a slice would be a copy of
    it on every call; XLA's dot reads w. `prefill`: the call reads a prompt, and more than 32
    rows take XLA's GEMM (`kernel_chunks`). `kernels`: the plug-in the call may use (its
    config's `kernels`), None for XLA's formulation at every width."""
    if isinstance(w, Q8_0Weight):
        return _linear_q8_0(x, w, out_dtype, stacked, kernels)
    if isinstance(w, Int8Weight):
        return _linear_int8(x, w, out_dtype, stacked, prefill, kernels)
    chunks = kernel_chunks(x.shape, prefill)
    if chunks and _kernels_apply(kernels, x.dtype, w.dtype, out_dtype or x.dtype):
        whole, layer = in_place(w, stacked)
        pairs = x.dtype == jnp.bfloat16 and w.dtype == jnp.bfloat16
        product = kernels.product_bf16_pairs if pairs else kernels.product

        def kernel(x, w, whole, layer):
            y = in_chunks(lambda rows: product(rows if pairs else rows.astype(jnp.float32),
                                               whole, layer), x, chunks)
            return y.astype(out_dtype or x.dtype)
        return lax.platform_dependent(x, w, whole, layer, cpu=kernel,
                                      default=lambda x, w, *_: _dot(x, w, out_dtype))
    return _dot(x, w, out_dtype)


def in_place(w, stacked: tuple | None) -> tuple:
    """What a kernel reads for the matrix w: (the stack it lies in, its index) when it is a
    layer of one (`linear`'s `stacked`), else (w, 0)."""
    if stacked is None:
        return w, jnp.zeros((), jnp.int32)
    whole, layer = stacked
    return whole, jnp.asarray(layer, jnp.int32)


def layer_of(stack, layer) -> jax.Array:
    """Layer `layer` ([] int, traced or not) of arrays stacked along a leading axis: a slice,
    which XLA copies on a CPU unless its consumer fuses it."""
    return jax.tree.map(lambda a: lax.dynamic_index_in_dim(a, layer, keepdims=False), stack)


def kernel_chunks(shape, prefill: bool = False) -> tuple[int, ...]:
    """The rows of each few-row kernel call that computes the product of x of this shape
    ([..., T, I]), or () where XLA's dot does: one call for 1-32 rows (`FEW_ROWS`); for more
    rows of at most 32 tokens each (`FEW_QUERIES`: decoding steps and verify calls of a large
    batch), up to `CHUNKED_ROWS` in all, calls of at most 32 rows, as even as they divide. A
    row's bits do not depend on the call it is in, so every such decoding call is the kernel's
    law, as its RoPE and attention are. Longer rows (prefill, training) take XLA's GEMM, and
    so does every call of more than 32 rows of a `prefill`: a prefill's products need not match
    anything (every method reads the same prompt the same way), and a large batch's prefill is
    compute-bound, XLA's GEMM's ground."""
    rows = math.prod(shape[:-1])
    if rows in FEW_ROWS:
        return (rows,)
    tokens = shape[-2] if len(shape) >= 3 else 1
    if rows > CHUNKED_ROWS or tokens not in FEW_QUERIES or prefill:
        return ()
    calls = -(-rows // FEW_ROWS[-1])
    return tuple(rows // calls + (i < rows % calls) for i in range(calls))


def in_chunks(product_rows, x: jax.Array, chunks: tuple[int, ...]) -> jax.Array:
    """product_rows(rows [r, I]) -> [r, O] applied to x [..., I]'s rows in calls of the sizes
    `chunks` (`kernel_chunks`), the results put back together -> [..., O]. Several calls are
    one loop (`lax.map`) over blocks of the largest size, the last padded with zero rows, so a
    batch of 100,000 rows compiles to one call in a loop, not to 3,000 calls."""
    lead, inputs = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, inputs)
    if len(chunks) == 1:
        y = product_rows(rows)
    else:
        size, total = max(chunks), rows.shape[0]
        padded = jnp.pad(rows, ((0, len(chunks) * size - total), (0, 0)))
        y = lax.map(product_rows, padded.reshape(len(chunks), size, inputs))
        y = y.reshape(len(chunks) * size, y.shape[-1])[:total]
    return y.reshape(*lead, y.shape[-1])


def _linear_int8(x, w: Int8Weight, out_dtype, stacked, prefill, kernels):
    """`linear` with 8-bit weights: the few-row kernel where it takes the call
    (`kernel_chunks`; it dequantises as it reads, a quarter of float32's bytes), else XLA's dot
    on the dequantised weights (prefill, which is compute-bound; and every width without the
    kernels, where a step pays for writing and reading the float32 copy)."""
    dtype = out_dtype or x.dtype
    chunks = kernel_chunks(x.shape, prefill)
    if chunks and w.block % KERNEL_BLOCK == 0 and _kernels_apply(kernels, x.dtype, dtype):
        whole, layer = in_place(w, stacked)
        product_int8 = kernels.product_int8

        def kernel(x, values, scales, whole, layer):
            y = in_chunks(lambda rows: product_int8(rows.astype(jnp.float32), whole.values,
                                                    whole.scales, layer), x, chunks)
            return y.astype(dtype)

        def default(x, values, scales, *_):
            return _dot(x, dequantize(Int8Weight(values, scales)), out_dtype)
        return lax.platform_dependent(x, w.values, w.scales, whole, layer, cpu=kernel,
                                      default=default)
    return _dot(x, dequantize(w), out_dtype)


def _linear_q8_0(x, w: Q8_0Weight, out_dtype, stacked, kernels):
    """`linear` in the q8_0 dtype: x quantised per row and block (`quantize_rows`), then the
    q8_0 law (`q8_0_law`), the few-row kernel's for 1-32 rows, XLA's elsewhere: the same bits
    either way, so a prefill's calls need no rule of their own."""
    dtype = out_dtype or x.dtype
    lead, inputs = x.shape[:-1], x.shape[-1]
    x = x.reshape(-1, inputs).astype(jnp.float32)
    values, scales = w.values.reshape(-1, inputs), w.scales.reshape(-1, inputs // w.block)

    def law(x, values, scales, *_):
        return q8_0_law(*quantize_rows(x, w.block), values, scales)
    if math.prod(lead) in FEW_ROWS and _kernels_apply(kernels, dtype):
        whole, layer = in_place(w, stacked)
        product_q8_0, product_tiles = kernels.product_q8_0, kernels.product_q8_0_tiles

        def kernel(x, values, scales, whole, layer):
            if whole.tiles is not None:      # the weights in the kernel's order: streamed
                return product_tiles(x, whole.tiles, whole.values, whole.scales, layer)
            return product_q8_0(x, whole.values, whole.scales, layer)
        y = lax.platform_dependent(x, values, scales, whole, layer, cpu=kernel, default=law)
    else:
        y = law(x, values, scales)
    return y.reshape(*lead, values.shape[0]).astype(dtype)


def q8_0_law(xq: jax.Array, dx: jax.Array, values: jax.Array, scales: jax.Array) -> jax.Array:
    """The q8_0 product, its law written in JAX: xq [T, I] int8 and dx [T, I / B] float32 (the
    activations, `quantize_rows`), values [O, I] int8 and scales [O, I / B] float16 -> y [T, O]
    float32, where for each block b in order

        acc = acc + float(sum over the block of values * xq) * (float(scales[:, b]) * dx[:, b])

    starting from 0: ggml's reference Q8_0 x Q8_0 dot product (vec_dot_q8_0_q8_0), each
    operation rounded on its own. The block sums are integers (exact); `quant.unfused` keeps XLA
    from fusing each block's product into the add (an fma of them, rounded once). The plug-in's
    `Kernels.product_q8_0` computes the same operations in the same order."""
    t, inputs = xq.shape
    blocks = dx.shape[-1]
    block = inputs // blocks

    def add_block(b, acc):
        xb = lax.dynamic_slice_in_dim(xq, b * block, block, axis=1)
        wb = lax.dynamic_slice_in_dim(values, b * block, block, axis=1)
        sums = jnp.einsum("ti,oi->to", xb, wb, preferred_element_type=jnp.int32)
        scale = (lax.dynamic_index_in_dim(scales, b, axis=1, keepdims=False)
                 .astype(jnp.float32)[None, :]
                 * lax.dynamic_index_in_dim(dx, b, axis=1, keepdims=True))
        return acc + unfused(sums.astype(jnp.float32) * scale, b >= blocks)
    return lax.fori_loop(0, blocks, add_block, jnp.zeros((t, values.shape[0]), jnp.float32))


def attention_uses_kernel(q, cache_k, cache_v, kernels: Kernels | None) -> bool:
    """Whether attention of q [B, T, N, H] to this cache is the few-query kernel's of the
    plug-in `kernels` (the caller, `layers.attend_cache`, still puts it behind
    `lax.platform_dependent`)."""
    return (q.shape[1] in FEW_QUERIES and cache_k.dtype == cache_v.dtype
            and _kernels_apply(kernels, q.dtype, cache_k.dtype))


def rope_uses_kernel(tokens: int, kernels: Kernels | None, dtype=jnp.float32) -> bool:
    """Whether RoPE on a call of `tokens` tokens per row is the kernels' (`Kernels.rope_tables`,
    `Kernels.rope`): exactly when its attention is (`FEW_QUERIES`), so a call's keys go into the
    cache and its queries into the attention kernel rotated by the same written operations
    whatever the call's width (`layers.apply_rope` says why)."""
    return tokens in FEW_QUERIES and _kernels_apply(kernels, dtype)


def _kernels_apply(kernels: Kernels | None, *dtypes) -> bool:
    return kernels is not None and all(jnp.dtype(d) in KERNEL_DTYPES for d in dtypes)


def _dot(x, w, out_dtype):
    """XLA's product, summed in float32 whatever the operands (as the kernels sum): left to
    itself, XLA's CPU product of bfloat16 operands rounds partial sums to bfloat16 in a way
    that depends on the shapes, so a row's numbers would change with the batch it runs in."""
    out = out_dtype or jnp.result_type(x, w)
    return jnp.einsum("...I,OI->...O", x, w, preferred_element_type=jnp.float32).astype(out)
