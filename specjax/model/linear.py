"""Every weight product of the model, and the one place that picks how it is computed.

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
SmolLM2-135M, a call on 5 tokens cost 1.76 one-token steps and 9 tokens 2.01 (2-core AMD EPYC).
The kernel reads each weight once whatever the rows (`few_rows.cc`). One row stays XLA's: its
mat-vec streams the weights as fast as the kernel's one-row case, or faster. Past 32 rows the
product is compute-bound and XLA's GEMM, which packs and tiles for that, is the better one.

The kernel needs float32 operands and a CPU; anything else, and a program traced inside
`xla_products()` (a device mesh: XLA cannot split a custom call across devices, see
`specjax.decoding.loop`), uses XLA's dot throughout. Both give the same products up to float32
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

_xla_only = False


@contextlib.contextmanager
def xla_products():
    """Within it, `linear` traces XLA's dot for every width: for programs partitioned over a
    device mesh, and for comparing the two formulations."""
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
    float32 = jnp.dtype(jnp.float32)
    return (not _xla_only and math.prod(x.shape[:-1]) in FEW_ROWS
            and x.dtype == w.dtype == float32 and jnp.dtype(out_dtype or x.dtype) == float32
            and few_rows.available())


def _dot(x, w, out_dtype):
    return jnp.einsum("...I,OI->...O", x, w, preferred_element_type=out_dtype)
