"""Every weight product of the model, and the one place that picks how it and attention to
the cache are computed.

The model multiplies activations x [..., I] by weights w [O, I] (stored [out, in], as
`specjax.model.transformer` explains): `linear(x, w)`. How that product is best computed
depends on how many rows x has, which is static under `jit`:

| rows   | who calls                                     | formulation                          |
|--------|-----------------------------------------------|--------------------------------------|
| 1      | a decoding step                               | XLA's dot (its mat-vec)              |
| 2-32   | verify calls (a chain or tree of drafts)      | the few-row kernel                   |
| more   | prefill, training, large batches              | XLA's dot (a GEMM)                   |

Decoding a small batch is bound by reading the weights, and a verify call reads the same
weights as a one-token step, so it should cost about one step. XLA's CPU dot costs about twice
that for 2-32 rows; the kernel reads each weight once whatever the rows
(`specjax/kernels/few_rows.cc`). One row stays XLA's mat-vec, which streams faster than the
kernel's one-row case; past 32 rows the product is compute-bound and XLA's GEMM, which packs
and tiles for that, is the better one.

Attention to the KV cache (`layers.attend_cache`) of a call on at most 32 tokens (`FEW_QUERIES`:
decoding steps and verify calls, one token included) uses the few-query attention kernel,
which reads the cache in place and only up to the slots in use, where XLA's attention reads a
static window of the cache (a copy of it). Prefill chunks keep XLA's windows. The measurements
behind these choices are in docs/benchmarks.md ("The engine, round two").

The kernels are a CPU plug-in. This module holds the two calls by their XLA target names and
decides when to use them; building the C++ and registering it with XLA is `specjax.kernels`'s
job (`specjax.kernels.ensure()`), outside the model layer, and nothing else refers to them. A
kernel is used only when all of these hold while a function is traced:

- the kernels are registered in this process (`registered()`);
- the switch is on: `use_kernels(True)` around the trace, or, outside any `use_kernels`, by
  default once registered. `specjax.generate(kernels=...)`, `SPECJAX_KERNELS=off` and
  `--no-kernels` set it; `decoding.loop` traces each program inside `use_kernels(spec.kernels)`,
  so the switch is part of a compiled program's key and the caches cannot disagree with it;
- the operands are float32 and the program is lowered for a CPU (`lax.platform_dependent`: a
  program lowered for a GPU or a TPU never contains them).

Otherwise XLA's formulation runs; the two give the same results up to float32 rounding
(summation order). A device mesh turns them off: XLA cannot split a custom call across devices.
"""

from __future__ import annotations

import contextlib
import math

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["ATTENTION_TARGET", "FEW_QUERIES", "FEW_ROWS", "PRODUCT_TARGET",
           "attention_uses_kernel", "few_query_attention", "linear", "mark_registered",
           "registered", "switch", "use_kernels", "xla_products"]

# The numbers of rows (all leading axes of x together) that the few-row kernel computes.
FEW_ROWS = range(2, 33)
# The numbers of tokens per row of a call whose attention to the cache is the kernel's.
FEW_QUERIES = range(1, 33)

# The kernels' XLA FFI targets (specjax/kernels/few_rows.cc).
PRODUCT_TARGET = "specjax_few_rows"
ATTENTION_TARGET = "specjax_few_query_attention"

_registered = False
_switch: bool | None = None       # None: on once registered


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


def xla_products():
    """`use_kernels(False)`: XLA's formulations throughout (for comparing the two)."""
    return use_kernels(False)


def linear(x: jax.Array, w: jax.Array, out_dtype=None) -> jax.Array:
    """x [..., I] times w [O, I] over I -> [..., O] (in out_dtype, else x's dtype)."""
    if math.prod(x.shape[:-1]) in FEW_ROWS and _kernels_apply(x.dtype, w.dtype,
                                                              out_dtype or x.dtype):
        return lax.platform_dependent(x, w, cpu=product,
                                      default=lambda x, w: _dot(x, w, out_dtype))
    return _dot(x, w, out_dtype)


def attention_uses_kernel(q, cache_k, cache_v) -> bool:
    """Whether attention of q [B, T, N, H] to this cache is the few-query kernel's (the caller,
    `layers.attend_cache`, still puts it behind `lax.platform_dependent`)."""
    return q.shape[1] in FEW_QUERIES and _kernels_apply(q.dtype, cache_k.dtype, cache_v.dtype)


def _kernels_apply(*dtypes) -> bool:
    on = _registered if _switch is None else (_switch and _registered)
    return on and all(jnp.dtype(d) == jnp.float32 for d in dtypes)


def _dot(x, w, out_dtype):
    return jnp.einsum("...I,OI->...O", x, w, preferred_element_type=out_dtype)


@jax.custom_jvp
def product(x: jax.Array, w: jax.Array) -> jax.Array:
    """The few-row kernel: x [..., I] float32, w [O, I] float32 -> [..., O] float32 (CPU, the
    target registered). Differentiable: its derivative is XLA's (the kernel has no transpose)."""
    out = jax.ShapeDtypeStruct((*x.shape[:-1], w.shape[0]), jnp.float32)
    return jax.ffi.ffi_call(PRODUCT_TARGET, out, vmap_method="sequential")(x, w)


@product.defjvp
def _product_jvp(primals, tangents):
    (x, w), (dx, dw) = primals, tangents
    return product(x, w), (jnp.einsum("...I,OI->...O", dx, w)
                            + jnp.einsum("...I,OI->...O", x, dw))


def few_query_attention(q: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array,
                        limit: jax.Array) -> jax.Array:
    """The few-query attention kernel: grouped-query attention of q [B, T, N, H] to a cache's
    keys [B, K, H, S] and values [B, K, S, H] (float32), where mask [B, T, S] says which slots
    each query reads and no slot at or past limit [B] is read: `layers.attend` on the prefix,
    without copying it. -> [B, T, N, H] float32. CPU, the target registered; not
    differentiable (decoding only)."""
    out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
    return jax.ffi.ffi_call(ATTENTION_TARGET, out, vmap_method="sequential")(
        q, keys, values, mask, limit.astype(jnp.int32))
