"""Every weight product of the model, and the one place that picks how it and attention to
the cache are computed.

The model multiplies activations x [..., I] by weights w [O, I] (stored [out, in], as
`specjax.model.transformer` explains): `linear(x, w)`. How that product is best computed
depends on how many rows x has, which is static under `jit`:

| rows   | who calls                                     | formulation                          |
|--------|-----------------------------------------------|--------------------------------------|
| 1      | a decoding step                               | XLA's dot (its mat-vec)              |
| 2-32   | verify calls (a chain or tree of drafts)      | the few-row kernel (`few_rows`)      |
| more   | prefill, training, large batches              | XLA's dot (a GEMM)                   |

Decoding a small batch is bound by reading the weights, and a verify call reads the same
weights as a one-token step, so it should cost about one step. XLA's CPU dot does not: with
SmolLM2-135M, a call on 5 tokens cost 1.76 one-token steps and 9 tokens 2.01 (2-core AMD EPYC,
AVX2). The kernel reads each weight once whatever the rows (`few_rows.cc`): 1.22 and 1.30 on a
2-core Zen 5 (`bench/smollm2-forward-engine/`). One row stays XLA's: its mat-vec streamed a
113-226 MB matrix at 52-62 GB/s there, the kernel's one-row case at 41-47. Past 32 rows the
product is compute-bound and XLA's GEMM, which packs and tiles for that, is the better one
(at 48 rows they cost the same).

Attention to the KV cache (`layers.attend_cache`) of a call on at most 32 tokens (`FEW_QUERIES`:
decoding steps and verify calls, one token included) uses the few-query attention kernel,
which reads the cache in place and only up to the slots in use. XLA's attention reads a static
window of the cache (a copy of it) and runs its few-row products slowly: with SmolLM2 and a
2,048-slot cache, a one-token step cost 34 ms attending to the whole buffer, 20 ms through the
smallest window, 14 ms with a 512-slot cache. Prefill chunks keep XLA's windows.

The kernels need float32 operands and a CPU; anything else, and a program traced inside
`xla_products()` (a device mesh: XLA cannot split a custom call across devices, see
`specjax.decoding.loop`), uses XLA throughout. Both give the same results up to float32
rounding (summation order).
"""

from __future__ import annotations

import contextlib
import math

import jax
import jax.numpy as jnp
from jax import lax

from specjax.model import few_rows

# The numbers of rows (all leading axes of x together) that the few-row kernel computes.
FEW_ROWS = range(2, 33)
# The numbers of tokens per row of a call whose attention to the cache is the kernel's.
FEW_QUERIES = range(1, 33)

_xla_only = False


@contextlib.contextmanager
def xla_products():
    """Within it, `linear` and `layers.attend_cache` trace XLA's formulations for every width:
    for programs partitioned over a device mesh, and for comparing the two. It acts when a
    function is traced: a jitted function already traced outside it keeps its trace (JAX's
    cache does not know this setting), so trace a fresh function inside it."""
    global _xla_only
    before, _xla_only = _xla_only, True
    try:
        yield
    finally:
        _xla_only = before


def linear(x: jax.Array, w: jax.Array, out_dtype=None) -> jax.Array:
    """x [..., I] times w [O, I] over I -> [..., O] (in out_dtype, else x's dtype)."""
    if _uses_kernel(x, w, out_dtype):
        return lax.platform_dependent(x, w, cpu=few_rows.product,
                                      default=lambda x, w: _dot(x, w, out_dtype))
    return _dot(x, w, out_dtype)


def _uses_kernel(x, w, out_dtype) -> bool:
    return (math.prod(x.shape[:-1]) in FEW_ROWS
            and _kernels_apply(x.dtype, w.dtype, out_dtype or x.dtype))


def attention_uses_kernel(q, cache_k, cache_v) -> bool:
    """Whether attention of q [B, T, N, H] to this cache is the few-query kernel's."""
    return q.shape[1] in FEW_QUERIES and _kernels_apply(q.dtype, cache_k.dtype, cache_v.dtype)


def _kernels_apply(*dtypes) -> bool:
    """Whether a few-row kernel may compute in these dtypes: all float32, outside
    `xla_products()`, and the kernels built here."""
    return (not _xla_only and all(jnp.dtype(d) == jnp.float32 for d in dtypes)
            and few_rows.available())


def _dot(x, w, out_dtype):
    return jnp.einsum("...I,OI->...O", x, w, preferred_element_type=out_dtype)
