"""8-bit weights: int8 values with a float16 scale per block of consecutive inputs.

A matrix w [..., I] (the inputs last, as every matrix of `specjax.model` is stored) is held as

    values  [..., I]          int8
    scales  [O..., I' / B]    float16, one per block of B consecutive inputs

and stands for values * scales, each value times its block's scale. B is 32 where the inputs
split into blocks of 32: the layout of GGUF's Q8_0, so a Q8_0 file loads as it is
(`specjax.io.gguf`), and quantising here gives the bytes `gguf`'s and llama.cpp's quantisers
give. Where they do not split (small test models), B is the whole input axis: a scale per
output row. O... are the weight's output axes and I' its input axes flattened: one axis for
most matrices, two for the attention output wo [D, N, H], whose inputs are the heads and their
sizes together. `reshape` keeps the blocks with their values, so the model's flat products
(`transformer._flat`: wq, wk, wv and wo) reshape an `Int8Weight` as they reshape an array.

A value times a float16 scale is exact in float32 (8 + 11 significant bits), so the dequantised
weights are exact float32 numbers, and the few-row kernel's product with them has the bits of
the float32 kernel's product with `dequantize(w)` (`specjax.model.linear`).

What is quantised (`quantize_params`): every matrix the model multiplies by, the embeddings and
an untied LM head included (llama.cpp's Q8_0 files hold them in Q8_0 too). Norms and biases,
vectors, stay float32, and so do the activations, the KV cache and every sum.

Two dtypes hold such matrices (`EIGHT_BIT`). "int8" (`Int8Weight`) multiplies float32
activations by the dequantised weights. "q8_0" (`Q8_0Weight`, the same values and scales)
rounds the activations of each product to 8 bits as well (`quantize_rows`) and sums integers:
llama.cpp's Q8_0 model (`specjax.model.linear.q8_0_law`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specjax.model.config import EIGHT_BIT

__all__ = ["BLOCK", "EIGHT_BIT", "MATRICES", "TILE", "TILE_BYTES", "Int8Weight", "Q8_0Weight",
           "as_dtype", "convert", "dequantize", "pack_tiles", "quantize", "quantize_params",
           "quantize_rows", "rows", "unfused"]

BLOCK = 32
# Parameters whose last two axes are inputs (the rest: only the last).
_TWO_INPUT_AXES = ("wo",)
# Parameters that are quantised: the model's matrices (norms and biases stay float32).
MATRICES = ("embed", "lm_head", "wq", "wk", "wv", "wo", "w_in", "w_out", "w_gate", "w_up",
            "w_down")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Int8Weight:
    """A quantised matrix: `values` [..., I] int8 and `scales` [O..., I' / B] float16."""
    values: jax.Array
    scales: jax.Array

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)

    @property
    def dtype(self):
        return jnp.dtype(jnp.int8)

    @property
    def ndim(self) -> int:
        return len(self.values.shape)

    @property
    def block(self) -> int:
        """B: the inputs each scale covers."""
        inputs = int(np.prod(self.values.shape[self.scales.ndim - 1:]))
        return inputs // self.scales.shape[-1]

    def reshape(self, *shape) -> "Int8Weight":
        """The values reshaped to `shape`, whose last axis must hold whole blocks; the scales
        follow, one row of them per row of values."""
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple) else shape
        values = self.values.reshape(shape)
        if values.shape[-1] % self.block:
            raise ValueError(f"cannot reshape an Int8Weight of blocks of {self.block} to "
                             f"{values.shape}: the last axis must hold whole blocks")
        return dataclasses.replace(self, values=values,
                                   scales=self.scales.reshape(*values.shape[:-1], -1))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Q8_0Weight(Int8Weight):
    """The "q8_0" dtype's matrix: the same values and scales as an `Int8Weight`, but a product
    with it quantises the activations too, per row and per block of the weights' B inputs
    (`quantize_rows`), and sums integers: llama.cpp's Q8_0 x Q8_0 (`specjax.model.linear`,
    `linear`'s law for it). A different model from "int8", which multiplies float32 activations
    by the dequantised weights.

    `tiles`: the same weights again in the few-row kernel's order (`pack_tiles`), made with
    the matrix where its shape allows (blocks of 32, outputs in whole tiles of 16), else None.
    The kernel streams them as they lie; XLA's law and row look-ups read `values` and
    `scales`. They double the matrix's bytes in memory, not the bytes a step reads."""
    tiles: jax.Array | None = None

    def reshape(self, *shape) -> "Q8_0Weight":
        """As `Int8Weight.reshape`; the tiles follow where the outputs keep whole tiles of 16
        and each row its blocks (the model's flat products, `transformer._flat`), else None."""
        out = Int8Weight.reshape(self, *shape)
        tiles = self.tiles
        outer = out.scales.shape[:-1]
        if tiles is not None:
            same_rows = (out.scales.shape[-1] * TILE_BYTES == tiles.shape[-1]
                         and outer and outer[-1] % TILE == 0)
            tiles = (tiles.reshape(*outer[:-1], outer[-1] // TILE, tiles.shape[-1])
                     if same_rows else None)
        return dataclasses.replace(out, tiles=tiles)


# The kernel's order of a q8_0 matrix (`pack_tiles`): TILE outputs at a time, and for each
# block of 32 inputs TILE_BYTES bytes, its 512 values then its 16 float16 scales.
TILE = 16
TILE_BYTES = TILE * BLOCK + TILE * 2


def pack_tiles(values: jax.Array, scales: jax.Array) -> jax.Array | None:
    """A q8_0 matrix's values [O..., I'] and scales [O..., I' / 32] in the order the few-row
    kernel reads them (`Kernels.product_q8_0_tiles`, few_rows.cc): for each TILE = 16
    consecutive outputs (of the last output axis), block by block of 32 inputs, the block's
    values as 8 groups of 4 inputs, each group for the 16 outputs in turn (so one 64-byte
    vector holds one group for all 16: what VPDPBUSD multiplies, and an AMX tile's rows), each
    value's sign bit flipped (value + 128, an unsigned byte: VPDPBUSD's unsigned operand), then
    the 16 outputs' float16 scales of the block. -> int8 [O...[:-1], O_last / 16, blocks *
    TILE_BYTES], or None where the matrix has other blocks or its outputs do not split into
    tiles. One contiguous stream a tile: a step reads each weight's byte once, in order."""
    outer, blocks = scales.shape[:-1], scales.shape[-1]
    inputs = int(np.prod(values.shape[len(outer):]))
    if not outer or outer[-1] % TILE or inputs != blocks * BLOCK:
        return None
    lead, tiles = outer[:-1], outer[-1] // TILE
    v = jnp.asarray(values).reshape(*lead, tiles, TILE, blocks, BLOCK // 4, 4)
    v = jnp.moveaxis(v, -4, -2)                    # [..., tiles, blocks, groups, TILE, 4]
    v = v ^ jnp.int8(-128)                          # the sign bit flipped: value + 128
    s = jnp.asarray(scales, jnp.float16).reshape(*lead, tiles, TILE, blocks)
    s = jax.lax.bitcast_convert_type(jnp.moveaxis(s, -2, -1), jnp.int8)   # [.., blocks, 16, 2]
    block = jnp.concatenate([v.reshape(*lead, tiles, blocks, -1),
                             s.reshape(*lead, tiles, blocks, -1)], axis=-1)
    return block.reshape(*lead, tiles, blocks * TILE_BYTES)


def quantize(w, input_axes: int = 1) -> Int8Weight:
    """w [..., I] (float) -> its 8-bit form, block by block of the inputs (the last
    `input_axes` axes, flattened): scale = max |w| / 127 in float32, value = w / scale rounded
    half away from zero, then the scale stored as float16. This is ggml's Q8_0 reference
    quantiser (and the `gguf` package's), to the bit, so the values and scales equal a Q8_0
    file's made from the same float32 weights. Runs in numpy: it is part of loading."""
    w = np.asarray(w, np.float32)
    outputs, inputs = w.shape[:w.ndim - input_axes], int(np.prod(w.shape[w.ndim - input_axes:]))
    block = BLOCK if inputs % BLOCK == 0 else inputs
    blocks = w.reshape(-1, block)
    scale = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inverse = np.where(scale == 0, np.float32(0), np.float32(1) / scale)
    scaled = blocks * inverse
    magnitude = np.abs(scaled)
    whole = np.floor(magnitude)
    values = np.sign(scaled) * (whole + np.floor(2 * (magnitude - whole)))   # half away from 0
    return Int8Weight(jnp.asarray(values.astype(np.int8).reshape(w.shape)),
                      jnp.asarray(scale.astype(np.float16).reshape(*outputs, inputs // block)))


def quantize_rows(x: jax.Array, block: int) -> tuple[jax.Array, jax.Array]:
    """Activations x [..., I] (float32) -> (values [..., I] int8, scales [..., I / block]
    float32): `quantize`'s law, in JAX, per row and per block of `block` inputs (ggml's
    quantize_row_q8_0_ref: scale = max |x| / 127, value = x * (1 / scale) rounded half away
    from zero, the scale then rounded to float16; here given back as that float16's float32).
    Every operation is exact or rounded once on its own (`unfused` keeps XLA from fusing the
    product into the rounding's subtraction)."""
    x = x.astype(jnp.float32)
    blocks = x.reshape(*x.shape[:-1], -1, block)
    scale = jnp.max(jnp.abs(blocks), axis=-1, keepdims=True) / jnp.float32(127)
    inverse = jnp.where(scale == 0, jnp.float32(0), jnp.float32(1) / jnp.where(scale == 0, 1, scale))
    scaled = unfused(blocks * inverse, jnp.isnan(scale))
    whole = jnp.trunc(scaled)
    values = whole + jnp.where(jnp.abs(scaled - whole) >= 0.5, jnp.sign(scaled), 0)
    return (values.astype(jnp.int8).reshape(x.shape),
            scale[..., 0].astype(jnp.float16).astype(jnp.float32))


def unfused(product: jax.Array, false: jax.Array) -> jax.Array:
    """`product` (float32 or a 16-bit float), such that XLA cannot fuse it into an add or a
    subtraction it feeds: XLA's CPU and GPU code contracts a multiply and an add into one fma
    (rounded once, not twice), and it drops `lax.optimization_barrier` before it does. Here the
    product's bits pass through an integer xor with `false`, a traced boolean that is False for
    every input that matters but not known to XLA to be, so the add's operand is no longer a
    multiply."""
    integer = {2: jnp.int16, 4: jnp.int32}[product.dtype.itemsize]
    bits = jax.lax.bitcast_convert_type(product, integer) ^ false.astype(integer)
    return jax.lax.bitcast_convert_type(bits, product.dtype)


def dequantize(w: Int8Weight) -> jax.Array:
    """The float32 weights w stands for: each value times its block's scale (exact)."""
    blocks = w.values.reshape(*w.scales.shape, -1).astype(jnp.float32)      # [O..., I'/B, B]
    return (blocks * w.scales.astype(jnp.float32)[..., None]).reshape(w.shape)


def rows(table, ids: jax.Array) -> jax.Array:
    """table[ids] for an embedding-like table [V, D]: for an `Int8Weight`, the rows dequantised
    to float32 (only those rows are read)."""
    if not isinstance(table, Int8Weight):
        return table[ids]
    return dequantize(Int8Weight(table.values[ids], table.scales[ids]))


def quantize_params(params: dict) -> dict:
    """A parameter tree (`specjax.model.transformer`) with every matrix in `MATRICES` as an
    `Int8Weight`; other parameters as float32."""
    return convert(params, "int8")


def as_dtype(w: Int8Weight, dtype: str) -> Int8Weight:
    """The same values and scales as the 8-bit dtype `dtype`'s matrix ("int8": `Int8Weight`,
    "q8_0": `Q8_0Weight`)."""
    if dtype == "q8_0":
        return w if type(w) is Q8_0Weight else Q8_0Weight(w.values, w.scales,
                                                           pack_tiles(w.values, w.scales))
    return w if type(w) is Int8Weight else Int8Weight(w.values, w.scales)


def convert(tree, dtype: str, matrices=MATRICES):
    """A tree of weights in `dtype`: "float32" or "bfloat16" casts every floating leaf (an
    8-bit matrix dequantised first); "int8" or "q8_0" quantises the leaves whose dict key is in
    `matrices` (an 8-bit matrix keeps its values and scales) and casts the other floating
    leaves to float32. Integer leaves (token ids) are kept. Drafters use it to follow their
    target's dtype with their own matrix names (`specjax.heads.shared.in_dtype`)."""
    def leaf_of(path, leaf):
        name = path[-1].key if path and isinstance(path[-1], jax.tree_util.DictKey) else None
        if isinstance(leaf, Int8Weight):
            return as_dtype(leaf, dtype) if dtype in EIGHT_BIT else dequantize(leaf).astype(dtype)
        if not jnp.issubdtype(jnp.asarray(leaf).dtype, jnp.floating):
            return leaf
        if dtype in EIGHT_BIT:
            if name in matrices:
                return as_dtype(quantize(leaf, 2 if name in _TWO_INPUT_AXES else 1), dtype)
            return jnp.asarray(leaf, jnp.float32)
        return jnp.asarray(leaf, dtype)
    return jax.tree_util.tree_map_with_path(leaf_of, tree,
                                            is_leaf=lambda a: isinstance(a, Int8Weight))
