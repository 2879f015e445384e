"""Every weight product of the model, and the one place that picks how it and attention to
the cache are computed.

The model multiplies activations x [..., I] by weights w [O, I] (stored [out, in], as
`specjax.model.transformer` explains): `linear(x, w)`. How that product is best computed
depends on how many rows x has, which is static under `jit`:

| rows                      | who calls                                      | formulation       |
|---------------------------|------------------------------------------------|-------------------|
| 1-32                      | decoding steps, verify calls (a chain or tree of drafts) | the few-row kernel |
| 33-1,024, of 1-32 tokens each | the same calls on a large batch            | the kernel, in calls of at most 32 rows (`kernel_chunks`) |
| more, or of longer rows   | prefill, training, huge batches                | XLA's dot (a GEMM) |

Decoding a small batch is bound by reading the weights, and a verify call reads the same
weights as a one-token step, so it should cost about one step. XLA's CPU dot costs about twice
that for 2-32 rows; the kernel reads each weight once whatever the rows
(`specjax/kernels/few_rows.cc`). It sums each output in one written order whatever the call's
width, so a one-token step takes it too: a verify call's row and the step at that position get
the same bits (issue 62; float32's one-row step was XLA's mat-vec before, which sums in another
order; on the 2-core Zen 4 host the kernel's float32 step was faster, 24.0 against 26.4 ms on
SmolLM2, bench/smollm2-one-law). A large batch's decoding calls take the kernel too, in calls
of at most 32 rows, so that a row's bits never depend on the batch it decodes in. Prefill is
compute-bound, and XLA's GEMM, which packs and tiles for that, is the better one there.

bfloat16 weights halve the bytes a step reads (XLA's CPU products on them run far below the
memory's speed: its bf16 mat-vec is slower than its float32 one over twice the bytes). The
kernel widens each weight to float32 as it loads it and sums in float32; x is cast to float32
first and the result to the output dtype (`FEW_ROWS`).

RoPE of a call on at most 32 tokens is the kernels' too (`rope_tables`, `rope`; the reason is
in `layers.apply_rope`).

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
behind these choices are in docs/benchmarks.md ("The engine, round two").

The decoder compiles one layer for all layers (`transformer.decoder_layers`, a scan over L), so
a layer's weights are a slice of arrays stacked along L. A slice is a copy under XLA on a CPU,
which would double a step's memory traffic; so every kernel call takes the whole stack and the
layer's index (`linear`'s `stacked`, the attention kernel's `layer`) and reads the layer where
it lies. XLA's formulations read the slice.

The kernels are a CPU plug-in. This module holds the calls by their XLA target names and
decides when to use them; building the C++ and registering it with XLA is `specjax.kernels`'s
job (`specjax.kernels.ensure()`), outside the model layer, and nothing else refers to them. A
kernel is used only when all of these hold while a function is traced:

- the kernels are registered in this process (`registered()`);
- the switch is on: `use_kernels(True)` around the trace, or, outside any `use_kernels`, by
  default once registered. `specjax.generate(kernels=...)`, `SPECJAX_KERNELS=off` and
  `--no-kernels` set it; `decoding.loop` traces each program inside `use_kernels(spec.kernels)`,
  so the switch is part of a compiled program's key and the caches cannot disagree with it;
- the operands are float32 or bfloat16 and the program is lowered for a CPU
  (`lax.platform_dependent`: a program lowered for a GPU or a TPU never contains them, and
  there XLA's own bfloat16 products run).

Otherwise XLA's formulation runs; the two give the same results up to float32 rounding
(summation order), and for bfloat16 up to where XLA rounds to bfloat16 in between. A device
mesh turns them off: XLA cannot split a custom call across devices.
"""

from __future__ import annotations

import contextlib
import math

import jax
import jax.numpy as jnp
from jax import lax

from specjax.model.quant import Int8Weight, Q8_0Weight, dequantize, quantize_rows, unfused

__all__ = ["ATTENTION_TARGET", "CHUNKED_ROWS", "FEW_QUERIES", "FEW_ROWS", "INT8_TARGET",
           "KERNEL_BLOCK", "KERNEL_DTYPES", "PRODUCT_TARGET", "Q8_0_TARGET", "ROPE_TABLES_TARGET",
           "ROPE_TARGET", "TARGETS", "attention_uses_kernel", "few_query_attention",
           "in_chunks", "in_place", "kernel_chunks", "layer_of",
           "linear", "mark_registered", "prefill_products", "product_int8", "product_q8_0",
           "q8_0_law", "registered",
           "rope", "rope_tables", "rope_uses_kernel", "switch", "use_kernels", "xla_products"]

# The numbers of rows (all leading axes of x together) that the few-row kernel computes, in
# every dtype: one row too, so that a step sums as a verify call's rows do.
FEW_ROWS = range(1, 33)
# The numbers of tokens per row of a call whose attention to the cache is the kernel's.
FEW_QUERIES = range(1, 33)
# The most rows a decoding call computes in calls of at most 32 rows (`kernel_chunks`): a batch
# of 32 rows verifying 32 tokens each, or 1,024 rows stepping. Past it, XLA's GEMM: on a 2-core
# Zen 4, 100,000 rows (the distribution tests' batches) ran 1.4-1.7x slower in 32-row calls.
CHUNKED_ROWS = 1024

# The dtypes of weights and caches the kernels read; activations of either are cast to float32.
KERNEL_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))

# The kernels' XLA FFI targets (specjax/kernels/few_rows.cc), the float32 ones and their
# bfloat16 twins (the target's name plus "_bf16").
PRODUCT_TARGET = "specjax_few_rows"
ATTENTION_TARGET = "specjax_few_query_attention"
INT8_TARGET = PRODUCT_TARGET + "_q8"
Q8_0_TARGET = PRODUCT_TARGET + "_q8_0"
ROPE_TARGET = "specjax_rope"
ROPE_TABLES_TARGET = "specjax_rope_tables"
TARGETS = (PRODUCT_TARGET, PRODUCT_TARGET + "_bf16", INT8_TARGET, Q8_0_TARGET, ATTENTION_TARGET,
           ATTENTION_TARGET + "_bf16", ROPE_TARGET, ROPE_TABLES_TARGET)

# 8-bit weights' blocks must be whole vectors of the widest kernel (16 floats, AVX-512).
KERNEL_BLOCK = 16

_registered = False
_switch: bool | None = None       # None: on once registered
_chunked = True                   # off inside `prefill_products`


def mark_registered() -> None:
    """Called by `specjax.kernels` once both targets are registered with XLA's CPU backend."""
    global _registered
    _registered = True


def registered() -> bool:
    return _registered


def switch() -> bool | None:
    """The innermost `use_kernels` setting in force, or None outside any."""
    return _switch


@contextlib.contextmanager
def use_kernels(on: bool):
    """Within it, functions traced use the kernels (if registered) when `on`, XLA's
    formulations for every width when not. It acts when a function is traced: a jitted function
    already traced keeps its trace, which is why `decoding.loop` keys its programs by the
    switch."""
    global _switch
    before, _switch = _switch, bool(on)
    try:
        yield
    finally:
        _switch = before


@contextlib.contextmanager
def prefill_products():
    """Within it, functions traced compute calls of more than 32 rows by XLA's GEMM, whatever
    their tokens per row (`kernel_chunks`): what a prefill traces its calls in."""
    global _chunked
    before, _chunked = _chunked, False
    try:
        yield
    finally:
        _chunked = before


def xla_products():
    """`use_kernels(False)`: XLA's formulations throughout (for comparing the two)."""
    return use_kernels(False)


def linear(x: jax.Array, w: jax.Array | Int8Weight, out_dtype=None,
           stacked: tuple | None = None) -> jax.Array:
    """x [..., I] times w [O, I] over I -> [..., O] (in out_dtype, else x's dtype). w may be
    an `Int8Weight` (`specjax.model.quant`): its dequantised weights; or a `Q8_0Weight`: the
    q8_0 law (`q8_0_law`).

    `stacked`, when w is one layer of a stack (the decoder's loop over its layers,
    `transformer.decoder_layers`): (every layer's matrix [L, O, I], w's index in it [] int32).
    A kernel then reads the layer where it lies in the stack, where a slice would be a copy of
    it on every call; XLA's dot reads w."""
    if isinstance(w, Q8_0Weight):
        return _linear_q8_0(x, w, out_dtype, stacked)
    if isinstance(w, Int8Weight):
        return _linear_int8(x, w, out_dtype, stacked)
    chunks = kernel_chunks(x.shape)
    if chunks and _kernels_apply(x.dtype, w.dtype, out_dtype or x.dtype):
        whole, layer = in_place(w, stacked)

        def kernel(x, w, whole, layer):
            y = in_chunks(lambda rows: product(rows.astype(jnp.float32), whole, layer), x, chunks)
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


def kernel_chunks(shape) -> tuple[int, ...]:
    """The rows of each few-row kernel call that computes the product of x of this shape
    ([..., T, I]), or () where XLA's dot does: one call for 1-32 rows (`FEW_ROWS`); for more
    rows of at most 32 tokens each (`FEW_QUERIES`: decoding steps and verify calls of a large
    batch), up to `CHUNKED_ROWS` in all, calls of at most 32 rows, as even as they divide. A
    row's bits do not depend on the call it is in, so every such decoding call is the kernel's
    law, as its RoPE and attention are (issue 62). Longer rows (prefill, training) take XLA's
    GEMM, and so does every call of more than 32 rows traced inside `prefill_products()`: a
    prefill's products need not match anything (every method reads the same prompt the same
    way), and a large batch's prefill is compute-bound, XLA's GEMM's ground."""
    rows = math.prod(shape[:-1])
    if rows in FEW_ROWS:
        return (rows,)
    tokens = shape[-2] if len(shape) >= 3 else 1
    if rows > CHUNKED_ROWS or tokens not in FEW_QUERIES or not _chunked:
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


def _linear_int8(x, w: Int8Weight, out_dtype, stacked):
    """`linear` with 8-bit weights: the few-row kernel where it takes the call
    (`kernel_chunks`; it dequantises as it reads, a quarter of float32's bytes), else XLA's dot
    on the dequantised weights (prefill, which is compute-bound; and every width without the
    kernels, where a step pays for writing and reading the float32 copy)."""
    dtype = out_dtype or x.dtype
    chunks = kernel_chunks(x.shape)
    if chunks and w.block % KERNEL_BLOCK == 0 and _kernels_apply(x.dtype, dtype):
        whole, layer = in_place(w, stacked)

        def kernel(x, values, scales, whole, layer):
            y = in_chunks(lambda rows: product_int8(rows.astype(jnp.float32), whole.values,
                                                    whole.scales, layer), x, chunks)
            return y.astype(dtype)

        def default(x, values, scales, *_):
            return _dot(x, dequantize(Int8Weight(values, scales)), out_dtype)
        return lax.platform_dependent(x, w.values, w.scales, whole, layer, cpu=kernel,
                                      default=default)
    return _dot(x, dequantize(w), out_dtype)


def _linear_q8_0(x, w: Q8_0Weight, out_dtype, stacked):
    """`linear` in the q8_0 dtype: x quantised per row and block (`quantize_rows`), then the
    q8_0 law (`q8_0_law`), the few-row kernel's for 1-32 rows, XLA's elsewhere: the same bits
    either way."""
    dtype = out_dtype or x.dtype
    lead, inputs = x.shape[:-1], x.shape[-1]
    x = x.reshape(-1, inputs).astype(jnp.float32)
    values, scales = w.values.reshape(-1, inputs), w.scales.reshape(-1, inputs // w.block)

    def law(x, values, scales, *_):
        return q8_0_law(*quantize_rows(x, w.block), values, scales)
    if math.prod(lead) in FEW_ROWS and _kernels_apply(dtype):
        whole, layer = in_place(w, stacked)

        def kernel(x, values, scales, whole, layer):
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
    from fusing each block's product into the add (an fma of them, rounded once). The kernel (`product_q8_0`) computes the same operations in the same order."""
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


def product_q8_0(x: jax.Array, values: jax.Array, scales: jax.Array, layer=0) -> jax.Array:
    """The few-row kernel's q8_0 product: x [T, I] float32 quantised as `quantize_rows` does,
    then `q8_0_law`, in one call, to the same bits (CPU, the targets registered; not
    differentiable). values [(L,) O, I] and scales [(L,) O, I / B]: with L, layer `layer`."""
    out = jax.ShapeDtypeStruct((x.shape[0], values.shape[-2]), jnp.float32)
    return jax.ffi.ffi_call(Q8_0_TARGET, out, vmap_method="sequential")(
        x, values, scales, _index(layer))


def product_int8(x: jax.Array, values: jax.Array, scales: jax.Array, layer=0) -> jax.Array:
    """The few-row kernel on 8-bit weights: x [..., I] float32, values [(L,) O, I] int8, scales
    [(L,) O, I / B] float16 (B a multiple of `KERNEL_BLOCK`; with L, layer `layer`) ->
    [..., O] float32, the float32 kernel's bits on the dequantised weights (CPU, the targets
    registered; not differentiable: 8-bit weights are for inference)."""
    out = jax.ShapeDtypeStruct((*x.shape[:-1], values.shape[-2]), jnp.float32)
    return jax.ffi.ffi_call(INT8_TARGET, out, vmap_method="sequential")(
        x, values, scales, _index(layer))


def _index(layer) -> jax.Array:
    """A layer index as the kernels take it: [] int32."""
    return jnp.asarray(layer, jnp.int32).reshape(())


def attention_uses_kernel(q, cache_k, cache_v) -> bool:
    """Whether attention of q [B, T, N, H] to this cache is the few-query kernel's (the caller,
    `layers.attend_cache`, still puts it behind `lax.platform_dependent`)."""
    return (q.shape[1] in FEW_QUERIES and cache_k.dtype == cache_v.dtype
            and _kernels_apply(q.dtype, cache_k.dtype))


def rope_uses_kernel(tokens: int, dtype=jnp.float32) -> bool:
    """Whether RoPE on a call of `tokens` tokens per row is the kernels' (`rope_tables`,
    `rope`): exactly when its attention is (`FEW_QUERIES`), so a call's keys go into the cache
    and its queries into the attention kernel rotated by the same written operations whatever
    the call's width (`layers.apply_rope` says why)."""
    return tokens in FEW_QUERIES and _kernels_apply(dtype)


def rope_tables(positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """The RoPE tables kernel: positions [B, T] int32, inv_freq [H/2] float32 -> tables
    [2, B, T, H/2] float32, the cosines then the sines (`layers.rope_tables`' layout)."""
    b, t = positions.shape
    out = jax.ShapeDtypeStruct((2, b, t, inv_freq.shape[0]), jnp.float32)
    return jax.ffi.ffi_call(ROPE_TABLES_TARGET, out, vmap_method="sequential")(
        positions.astype(jnp.int32), inv_freq.astype(jnp.float32))


def rope(q: jax.Array, k: jax.Array, tables: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The RoPE kernel: a layer's queries q [B, T, N, H] and keys k [B, T, K, H] (cast to
    float32) rotated by tables [2, B, T, H/2] (`rope_tables`), in one call -> (q, k) float32."""
    out = (jax.ShapeDtypeStruct(q.shape, jnp.float32), jax.ShapeDtypeStruct(k.shape, jnp.float32))
    return jax.ffi.ffi_call(ROPE_TARGET, out, vmap_method="sequential")(
        q.astype(jnp.float32), k.astype(jnp.float32), tables)


def _kernels_apply(*dtypes) -> bool:
    on = _registered if _switch is None else (_switch and _registered)
    return on and all(jnp.dtype(d) in KERNEL_DTYPES for d in dtypes)


def _dot(x, w, out_dtype):
    """XLA's product, summed in float32 whatever the operands (as the kernels sum): left to
    itself, XLA's CPU product of bfloat16 operands rounds partial sums to bfloat16 in a way
    that depends on the shapes, so a row's numbers changed with the batch it ran in (seen by
    the bfloat16 distribution tests: 100,000 rows drawn at once against the law of 216)."""
    out = out_dtype or jnp.result_type(x, w)
    return jnp.einsum("...I,OI->...O", x, w, preferred_element_type=jnp.float32).astype(out)


@jax.custom_jvp
def product(x: jax.Array, w: jax.Array, layer=0) -> jax.Array:
    """The few-row kernel: x [..., I] float32, w [O, I] float32 or bfloat16, or every layer's
    [L, O, I] and the one to use, `layer` -> [..., O] float32 (CPU, the targets registered).
    Differentiable: its derivative is XLA's (the kernel has no transpose)."""
    out = jax.ShapeDtypeStruct((*x.shape[:-1], w.shape[-2]), jnp.float32)
    return jax.ffi.ffi_call(_target(PRODUCT_TARGET, w.dtype), out,
                            vmap_method="sequential")(x, w, _index(layer))


def _target(name: str, dtype) -> str:
    return name + "_bf16" if jnp.dtype(dtype) == jnp.bfloat16 else name


@product.defjvp
def _product_jvp(primals, tangents):
    (x, w, layer), (dx, dw, _) = primals, tangents
    if w.ndim == 3:
        w, dw = layer_of(w, layer), layer_of(dw, layer)
    f32 = jnp.float32
    return product(x, w), (jnp.einsum("...I,OI->...O", dx, w, preferred_element_type=f32)
                           + jnp.einsum("...I,OI->...O", x, dw, preferred_element_type=f32))


def few_query_attention(q: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array,
                        limit: jax.Array, layer=0) -> jax.Array:
    """The few-query attention kernel: grouped-query attention of q [B, T, N, H] to a cache's
    keys [B, K, H, S] and values [B, K, S, H] (float32, or bfloat16 passed as its bits, uint16;
    q cast to float32), or to
    layer `layer` of every layer's [L, B, ...], where mask [B, T, S] says which slots each
    query reads and no slot at or past limit [B] is read: `layers.attend` on the prefix,
    without copying it. -> [B, T, N, H] in the cache's dtype, as `attend` gives. CPU, the
    targets registered; not differentiable (decoding only)."""
    out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
    # A bfloat16 cache is passed as its bits (uint16, `model.cache.as_bits`).
    target = ATTENTION_TARGET if values.dtype == jnp.float32 else ATTENTION_TARGET + "_bf16"
    dtype = jnp.float32 if values.dtype == jnp.float32 else jnp.bfloat16
    if values.dtype == jnp.bfloat16:
        keys, values = (lax.bitcast_convert_type(a, jnp.uint16) for a in (keys, values))
    return jax.ffi.ffi_call(target, out, vmap_method="sequential")(
        q.astype(jnp.float32), keys, values, mask, limit.astype(jnp.int32),
        _index(layer)).astype(dtype)
