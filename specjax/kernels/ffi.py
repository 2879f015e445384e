"""The C++ kernels' calls (`few_rows.cc`), as XLA FFI custom calls by target name: the
`specjax.model.linear.Kernels` that a program's config names (`specjax.kernels.plugin`).

Each call runs only in a program lowered for a CPU, once the targets are registered with XLA's
CPU backend (`load`); `specjax.model.linear` decides which calls of the model take them. Every
call takes a stack's layer index, [] int32, so that a layer of the decoder's stacked weights or
cache is read where it lies.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from specjax.model.linear import Kernels, layer_of

__all__ = ["ATTENTION_TARGET", "BF16_PAIRS_TARGET", "INT8_TARGET", "KERNELS", "PRODUCT_TARGET",
           "Q8_0_TARGET", "Q8_0_TILES_TARGET", "ROPE_TABLES_TARGET", "ROPE_TARGET", "TARGETS",
           "few_query_attention", "product", "product_bf16_pairs", "product_int8", "product_q8_0",
           "product_q8_0_tiles", "rope", "rope_tables"]

# The kernels' XLA FFI targets (few_rows.cc), the float32 ones and their bfloat16 twins (the
# target's name plus "_bf16").
PRODUCT_TARGET = "specjax_few_rows"
ATTENTION_TARGET = "specjax_few_query_attention"
INT8_TARGET = PRODUCT_TARGET + "_q8"
Q8_0_TARGET = PRODUCT_TARGET + "_q8_0"
Q8_0_TILES_TARGET = Q8_0_TARGET + "_tiles"
BF16_PAIRS_TARGET = PRODUCT_TARGET + "_bf16_pairs"
ROPE_TARGET = "specjax_rope"
ROPE_TABLES_TARGET = "specjax_rope_tables"
TARGETS = (PRODUCT_TARGET, PRODUCT_TARGET + "_bf16", BF16_PAIRS_TARGET, INT8_TARGET, Q8_0_TARGET,
           Q8_0_TILES_TARGET,
           ATTENTION_TARGET,
           ATTENTION_TARGET + "_bf16", ROPE_TARGET, ROPE_TABLES_TARGET)


def _index(layer) -> jax.Array:
    """A layer index as the kernels take it: [] int32."""
    return jnp.asarray(layer, jnp.int32).reshape(())


def _target(name: str, dtype) -> str:
    return name + "_bf16" if jnp.dtype(dtype) == jnp.bfloat16 else name


def _xlas_derivative(kernel):
    """`kernel(x, w, layer)`, a product on w [(L,) O, I], made differentiable with XLA's product
    as its derivative (the kernels have no transpose)."""
    kernel = jax.custom_jvp(kernel)

    @kernel.defjvp
    def jvp(primals, tangents):
        (x, w, layer), (dx, dw, _) = primals, tangents
        if w.ndim == 3:
            w, dw = layer_of(w, layer), layer_of(dw, layer)
        f32 = jnp.float32
        return kernel(x, w), (jnp.einsum("...I,OI->...O", dx, w, preferred_element_type=f32)
                              + jnp.einsum("...I,OI->...O", x, dw, preferred_element_type=f32))
    return kernel


@_xlas_derivative
def product(x: jax.Array, w: jax.Array, layer=0) -> jax.Array:
    """The few-row kernel: x [..., I] float32, w [O, I] float32 or bfloat16, or every layer's
    [L, O, I] and the one to use, `layer` -> [..., O] float32. Differentiable: its derivative
    is XLA's (the kernel has no transpose)."""
    out = jax.ShapeDtypeStruct((*x.shape[:-1], w.shape[-2]), jnp.float32)
    return jax.ffi.ffi_call(_target(PRODUCT_TARGET, w.dtype), out,
                            vmap_method="sequential")(x, w, _index(layer))


@_xlas_derivative
def product_bf16_pairs(x: jax.Array, w: jax.Array, layer=0) -> jax.Array:
    """The few-row kernel on bfloat16 activations and weights: x [..., I] bfloat16, w [(L,) O,
    I] bfloat16 -> [..., O] float32, summed in pairs where the CPU multiplies bfloat16 pairs
    (AVX512_BF16's VDPBF16PS; `specjax.kernels.paths()` names it), else `product` on x widened
    (exact), the bfloat16 kernel's law as before. Differentiable: its derivative is XLA's."""
    out = jax.ShapeDtypeStruct((*x.shape[:-1], w.shape[-2]), jnp.float32)
    return jax.ffi.ffi_call(BF16_PAIRS_TARGET, out, vmap_method="sequential")(
        x, w, _index(layer))


def product_int8(x: jax.Array, values: jax.Array, scales: jax.Array, layer=0) -> jax.Array:
    """The few-row kernel on 8-bit weights: x [..., I] float32, values [(L,) O, I] int8, scales
    [(L,) O, I / B] float16 (B a multiple of `linear.KERNEL_BLOCK`; with L, layer `layer`) ->
    [..., O] float32, the float32 kernel's bits on the dequantised weights (not
    differentiable: 8-bit weights are for inference)."""
    out = jax.ShapeDtypeStruct((*x.shape[:-1], values.shape[-2]), jnp.float32)
    return jax.ffi.ffi_call(INT8_TARGET, out, vmap_method="sequential")(
        x, values, scales, _index(layer))


def product_q8_0(x: jax.Array, values: jax.Array, scales: jax.Array, layer=0) -> jax.Array:
    """The few-row kernel's q8_0 product: x [T, I] float32 quantised as `quant.quantize_rows`
    does, then `linear.q8_0_law`, in one call, to the same bits (not differentiable).
    values [(L,) O, I] and scales [(L,) O, I / B]: with L, layer `layer`."""
    out = jax.ShapeDtypeStruct((x.shape[0], values.shape[-2]), jnp.float32)
    return jax.ffi.ffi_call(Q8_0_TARGET, out, vmap_method="sequential")(
        x, values, scales, _index(layer))


def product_q8_0_tiles(x: jax.Array, tiles: jax.Array, values: jax.Array, scales: jax.Array,
                       layer=0) -> jax.Array:
    """`product_q8_0` on the weights in the kernel's order (`quant.pack_tiles`): x [T, I]
    float32, tiles [(L,) O / 16, I / 32 * 544] int8 (with L, layer `layer`) -> [T, O] float32,
    the same bits; the weights are streamed as they lie. The same weights' values and scales
    come too: a CPU without AVX-512 VNNI multiplies from them (`product_q8_0`). Not
    differentiable."""
    out = jax.ShapeDtypeStruct((x.shape[0], tiles.shape[-2] * 16), jnp.float32)
    return jax.ffi.ffi_call(Q8_0_TILES_TARGET, out, vmap_method="sequential")(
        x, tiles, values, scales, _index(layer))


def few_query_attention(q: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array,
                        limit: jax.Array, layer=0) -> jax.Array:
    """The few-query attention kernel: grouped-query attention of q [B, T, N, H] to a cache's
    keys [B, K, H, S] and values [B, K, S, H] (float32, or bfloat16 passed as its bits, uint16;
    q cast to float32), or to layer `layer` of every layer's [L, B, ...], where mask [B, T, S]
    says which slots each query reads and no slot at or past limit [B] is read:
    `layers.attend` on the prefix, without copying it. -> [B, T, N, H] in the cache's dtype, as
    `attend` gives. Not differentiable (decoding only)."""
    out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
    # A bfloat16 cache is passed as its bits (uint16, `model.cache.as_bits`).
    target = ATTENTION_TARGET if values.dtype == jnp.float32 else ATTENTION_TARGET + "_bf16"
    dtype = jnp.float32 if values.dtype == jnp.float32 else jnp.bfloat16
    if values.dtype == jnp.bfloat16:
        keys, values = (lax.bitcast_convert_type(a, jnp.uint16) for a in (keys, values))
    return jax.ffi.ffi_call(target, out, vmap_method="sequential")(
        q.astype(jnp.float32), keys, values, mask, limit.astype(jnp.int32),
        _index(layer)).astype(dtype)


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


KERNELS = Kernels(product=product, product_bf16_pairs=product_bf16_pairs,
                  product_int8=product_int8, product_q8_0=product_q8_0,
                  product_q8_0_tiles=product_q8_0_tiles,
                  attention=few_query_attention, rope_tables=rope_tables, rope=rope)
