"""The q8_0 dtype (issue 62): llama.cpp's Q8_0 x Q8_0 product as a model, to the bit.

Each product quantises its activations per row and per block of the weights' inputs, sums the
block products in integers and combines the blocks in float32 in one written order
(`specjax.model.linear.q8_0_law`). The reference here is a NumPy transcription of ggml's own
reference code, written from its description, not from specjax's: `quantize_row_q8_0_ref`
(scale = max |x| / 127, value = round(x * (1 / scale)) half away from zero, the scale stored as
float16) and the generic `ggml_vec_dot_q8_0_q8_0` (`sumf += sumi * (d_w * d_x)` block by block,
each operation rounded on its own; NumPy fuses nothing). Every path must give its bits exactly:
the kernel for 1 to 32 rows (on weights packed in its order when they load, `quant.pack_tiles`;
else a VNNI tile path for 16 outputs at a time and a per-output path for the rest), XLA's law
past 32 rows and with the kernels off.

Negative controls: the same comparison tells apart an fma in the accumulation (one rounding
less per block) and the weight-only int8 product, so exact equality here is not vacuous.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import kernels as specjax_kernels
from specjax.model import linear, quant

pytestmark = [pytest.mark.fast,                  # every test of the module: the fast tier
              pytest.mark.skipif(not specjax_kernels.ensure(),
                                 reason="needs the CPU kernels (a C++ compiler)")]


def ggml_quantize(x: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """quantize_row_q8_0_ref per row: (values int8 [T, I], scales float16 [T, I / block])."""
    values = np.zeros(x.shape, np.int8)
    scales = np.zeros((x.shape[0], x.shape[1] // block), np.float16)
    for t in range(x.shape[0]):
        for b in range(x.shape[1] // block):
            chunk = x[t, b * block:(b + 1) * block].astype(np.float32)
            amax = np.float32(np.max(np.abs(chunk)))
            d = np.float32(amax / np.float32(127))
            inverse = np.float32(1) / d if d != 0 else np.float32(0)
            for i, v in enumerate(chunk):
                scaled = float(np.float32(v * inverse))
                # C's roundf, half away from zero (|scaled| + 0.5 is exact in a Python float).
                values[t, b * block + i] = int(math.copysign(math.floor(abs(scaled) + 0.5),
                                                             scaled))
            scales[t, b] = np.float16(d)
    return values, scales


def ggml_dot(xq, dx, values, scales, fused=False) -> np.ndarray:
    """ggml_vec_dot_q8_0_q8_0 (generic) for every row and output, float32; `fused` makes the
    accumulation an fma (the negative control)."""
    T, I = xq.shape
    O, blocks = scales.shape
    block = I // blocks
    y = np.zeros((T, O), np.float32)
    for b in range(blocks):
        sumi = (xq[:, b * block:(b + 1) * block].astype(np.int64)
                @ values[:, b * block:(b + 1) * block].astype(np.int64).T)
        d = dx[:, b].astype(np.float32)[:, None] * scales[:, b].astype(np.float32)[None, :]
        if fused:
            y = (sumi.astype(np.float64) * d.astype(np.float64) + y).astype(np.float32)
        else:
            y = y + sumi.astype(np.float32) * d
    return y


def weights(o, i, seed):
    w = np.random.default_rng(seed).standard_normal((o, i)).astype(np.float32)
    return quant.as_dtype(quant.quantize(w), "q8_0")


def product(x, w, kernels=True):
    """`linear` with the CPU kernels, or with XLA's formulation (the config's `kernels` None)."""
    plugin = specjax_kernels.plugin() if kernels else None
    return np.asarray(jax.jit(lambda x, w: linear.linear(x, w, kernels=plugin))(jnp.asarray(x), w))


# (outputs, inputs): blocks of 32 with 16-output tiles; a tail of outputs past the last tile;
# one block of the whole row (inputs not a multiple of 32); SmolLM2's shape.
SHAPES = [(64, 64), (37, 96), (48, 40), (576, 576)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_every_path_is_ggmls_reference_product_to_the_bit(shape):
    o, i = shape
    w = weights(o, i, seed=o + i)
    rng = np.random.default_rng(i)
    for rows in (1, 2, 7, 17, 32, 40):
        x = (rng.standard_normal((rows, i)) * rng.uniform(0.1, 30, (rows, 1))).astype(np.float32)
        xq, dx = ggml_quantize(x, w.block)
        want = ggml_dot(xq, dx, np.asarray(w.values), np.asarray(w.scales))
        np.testing.assert_array_equal(product(x, w), want, err_msg=f"{shape}, {rows} rows")
        np.testing.assert_array_equal(product(x, w, kernels=False), want,
                                      err_msg=f"{shape}, {rows} rows, XLA")


def test_the_activation_quantiser_is_ggmls_on_ties_zeros_and_extremes():
    # A block whose max is 127 has scale 1 exactly, so x.5 values are ties: half away from zero.
    ties = np.arange(-15.5, 16.5, 1.0, dtype=np.float32)[:32]
    ties[0] = 127.0
    zeros = np.zeros(32, np.float32)
    tiny = np.full(32, 1e-30, np.float32) * np.arange(32)        # a scale below float16's range
    huge = np.linspace(-3e6, 3e6, 32, dtype=np.float32)          # a scale past float16's range
    x = np.stack([ties, zeros, tiny, huge])
    values, scales = jax.jit(quant.quantize_rows, static_argnums=1)(jnp.asarray(x), 32)
    want_values, want_scales = ggml_quantize(x, 32)
    np.testing.assert_array_equal(np.asarray(values), want_values)
    np.testing.assert_array_equal(np.asarray(scales), want_scales.astype(np.float32))
    assert list(np.asarray(values)[0, 1:5]) == [-15, -14, -13, -12]      # -14.5 -> -15 ...
    assert np.asarray(values)[0, 17] == 2 and np.asarray(values)[0, 16] == 1   # 1.5 -> 2
    # And the kernel quantises as this does: its products equal the reference on these rows.
    w = weights(16, 32, seed=3)
    want = ggml_dot(want_values, want_scales, np.asarray(w.values), np.asarray(w.scales))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(product(x, w)[finite], want[finite])


def test_negative_controls_an_fma_and_weight_only_int8_are_told_apart():
    w = weights(576, 576, seed=1)
    x = np.random.default_rng(2).standard_normal((9, 576)).astype(np.float32)
    xq, dx = ggml_quantize(x, 32)
    ours = product(x, w)
    fused = ggml_dot(xq, dx, np.asarray(w.values), np.asarray(w.scales), fused=True)
    assert np.mean(ours != fused) > 0.01, "an fma in the accumulation went unseen"
    int8 = product(x, quant.as_dtype(w, "int8"))
    assert np.mean(ours != int8) > 0.5


def test_q8_0_is_its_own_dtype_and_keeps_its_weights_type_through_reshapes_and_heads():
    w = weights(64, 64, seed=4)
    assert isinstance(w, quant.Q8_0Weight) and isinstance(w.reshape(64, 2, 32), quant.Q8_0Weight)
    tree = quant.convert({"wq": np.ones((64, 64), np.float32)}, "q8_0")
    assert type(tree["wq"]) is quant.Q8_0Weight
    assert type(quant.convert(tree, "int8")["wq"]) is quant.Int8Weight
    np.testing.assert_array_equal(quant.convert(tree, "int8")["wq"].values, tree["wq"].values)


def test_packed_tiles_hold_the_weights_in_the_kernels_order_and_give_the_laws_bits():
    from specjax.kernels import ffi
    w = weights(48, 96, seed=5)
    tiles = np.asarray(w.tiles)
    assert tiles.shape == (3, 3 * quant.TILE_BYTES)
    # The layout, read by hand: output 16 + 5, input 32 + 4 * 3 + 2 is tile 1, block 1, group 3,
    # lane 5, byte 2, its sign bit flipped; its scale, lane 5 of the block's float16s.
    block = tiles[1, quant.TILE_BYTES:2 * quant.TILE_BYTES]
    assert (int(block[3 * 64 + 5 * 4 + 2]) ^ -128) == np.asarray(w.values)[21, 46]
    assert block[512:].view(np.float16)[5] == np.asarray(w.scales)[21, 1]
    rng = np.random.default_rng(6)
    for rows in (1, 2, 5, 8, 9, 16, 17, 32):
        x = (rng.standard_normal((rows, 96)) * 4).astype(np.float32)
        xq, dx = ggml_quantize(x, 32)
        want = ggml_dot(xq, dx, np.asarray(w.values), np.asarray(w.scales))
        packed = jax.jit(ffi.product_q8_0_tiles)(jnp.asarray(x), w.tiles, w.values, w.scales)
        unpacked = jax.jit(ffi.product_q8_0)(jnp.asarray(x), w.values, w.scales)
        np.testing.assert_array_equal(np.asarray(packed), want, err_msg=f"{rows} rows, packed")
        np.testing.assert_array_equal(np.asarray(unpacked), want, err_msg=f"{rows} rows")


def test_tiles_follow_the_models_reshapes_or_are_none_where_the_shape_has_no_tiles():
    tree = quant.convert({"wq": np.ones((2, 3, 64, 96), np.float32),      # [L, N, H, D]
                          "wo": np.ones((2, 96, 3, 64), np.float32)}, "q8_0")
    flat_q = tree["wq"].reshape(2, 192, 96)
    flat_o = tree["wo"].reshape(2, 96, 192)
    assert flat_q.tiles.shape == (2, 12, 3 * quant.TILE_BYTES)
    assert flat_o.tiles.shape == (2, 6, 6 * quant.TILE_BYTES)
    for flat in (flat_q, flat_o):       # the stack's tiles are each layer's own, packed
        for layer in range(2):
            own = quant.pack_tiles(flat.values[layer], flat.scales[layer])
            np.testing.assert_array_equal(np.asarray(flat.tiles[layer]), np.asarray(own))
    assert weights(37, 96, seed=1).tiles is None          # outputs not in tiles of 16
    assert weights(48, 40, seed=1).tiles is None          # a block of 40 inputs
    assert tree["wq"].reshape(2, 3, 64, 3, 32).tiles is None   # rows of one block
    assert quant.as_dtype(flat_q, "int8").__class__ is quant.Int8Weight
