"""The norms' sums (`layers.row_sum`): a row's RMSNorm and LayerNorm do not depend on how many
rows the call has. XLA's own reduction picked its summation order by shape, so one row of a
nine-row call and the same row alone differed in the last bit (measured: 9.5e-7 on SmolLM2's
width), which is one of the ways a verify call and one-token steps part (issue 62)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.model.layers import layer_norm, rms_norm, row_sum

# In the fast tier, every test of this module (tests/conftest.py, docs/tests.md).
pytestmark = pytest.mark.fast


@pytest.mark.parametrize("d", [576, 1536, 40])
def test_a_rows_norm_is_the_same_alone_and_in_a_call(d):
    rng = np.random.default_rng(d)
    x = rng.standard_normal((2, 9, d)).astype(np.float32) * 3
    scale, bias = rng.standard_normal(d).astype(np.float32), rng.standard_normal(d).astype(np.float32)
    for norm in (jax.jit(lambda x: rms_norm(x, scale, 1e-5)),
                 jax.jit(lambda x: layer_norm(x, scale, bias, 1e-5))):
        whole = np.asarray(norm(x))
        for b in range(2):
            for t in range(9):
                assert np.array_equal(whole[b, t], np.asarray(norm(x[b:b + 1, t:t + 1]))[0, 0])


def test_row_sum_is_the_sum_in_its_stated_order():
    # 16 partial sums over blocks of 16, then halved pairwise, written out in numpy: the same
    # bits; and a width that is no multiple of 16 sums as if padded with zeros.
    rng = np.random.default_rng(0)
    for d in (64, 40):
        v = rng.standard_normal((3, d)).astype(np.float32)
        padded = np.zeros((3, -(-d // 16) * 16), np.float32)
        padded[:, :d] = v
        acc = padded[:, :16].copy()
        for i in range(1, padded.shape[1] // 16):
            acc = (acc + padded[:, 16 * i:16 * i + 16]).astype(np.float32)
        while acc.shape[1] > 1:
            half = acc.shape[1] // 2
            acc = (acc[:, :half] + acc[:, half:]).astype(np.float32)
        assert np.array_equal(np.asarray(jax.jit(row_sum)(jnp.asarray(v))), acc)
