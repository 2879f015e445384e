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
(`transformer._project`, wo) reshape an `Int8Weight` as they reshape an array.

A value times a float16 scale is exact in float32 (8 + 11 significant bits), so the dequantised
weights are exact float32 numbers, and the few-row kernel's product with them has the bits of
the float32 kernel's product with `dequantize(w)` (`specjax.model.linear`).

What is quantised (`quantize_params`): every matrix the model multiplies by, the embeddings and
an untied LM head included (llama.cpp's Q8_0 files hold them in Q8_0 too). Norms and biases,
vectors, stay float32, and so do the activations, the KV cache and every sum.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["BLOCK", "MATRICES", "Int8Weight", "convert", "dequantize", "quantize",
           "quantize_params", "rows"]

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
        return Int8Weight(values, self.scales.reshape(*values.shape[:-1], -1))


def quantize(w, input_axes: int = 1) -> Int8Weight:
    """w [..., I] (float) -> its 8-bit form, block by block of the inputs (the last
    `input_axes` axes, flattened): scale = max |w| / 127 in float32, value = w / scale rounded
    half away from zero, then the scale stored as float16. This is ggml's Q8_0 reference
    quantiser (and the `gguf` package's), to the bit, so the values and scales equal a Q8_0
    file's made from the same float32 weights. Runs on the host (numpy): it is part of loading."""
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


def dequantize(w: Int8Weight) -> jax.Array:
    """The float32 weights w stands for: each value times its block's scale (exact)."""
    blocks = w.values.reshape(*w.scales.shape, -1).astype(jnp.float32)      # [O..., I'/B, B]
    return (blocks * w.scales.astype(jnp.float32)[..., None]).reshape(w.shape)


def rows(table, ids: jax.Array) -> jax.Array:
    """table[ids] for an embedding-like table [V, D]: for an `Int8Weight`, the rows dequantised
    to float32 (only those rows are read)."""
    if not isinstance(table, Int8Weight):
        return table[ids]
    picked = Int8Weight(table.values[ids], table.scales[ids])
    return dequantize(picked)


def quantize_params(params: dict) -> dict:
    """A parameter tree (`specjax.model.transformer`) with every matrix in `MATRICES` as an
    `Int8Weight`; other parameters as float32."""
    return convert(params, "int8")


def convert(tree, dtype: str, matrices=MATRICES):
    """A tree of weights in `dtype`: "float32" or "bfloat16" casts every floating leaf (an
    `Int8Weight` dequantised first); "int8" quantises the leaves whose dict key is in
    `matrices` (an `Int8Weight` kept as it is) and casts the other floating leaves to float32.
    Integer leaves (token ids) are kept. Drafters use it to follow their target's dtype with
    their own matrix names (`specjax.heads.shared.in_dtype`)."""
    def leaf_of(path, leaf):
        name = path[-1].key if path and isinstance(path[-1], jax.tree_util.DictKey) else None
        if isinstance(leaf, Int8Weight):
            return leaf if dtype == "int8" else dequantize(leaf).astype(dtype)
        if not jnp.issubdtype(jnp.asarray(leaf).dtype, jnp.floating):
            return leaf
        if dtype == "int8":
            if name in matrices:
                return quantize(leaf, 2 if name in _TWO_INPUT_AXES else 1)
            return jnp.asarray(leaf, jnp.float32)
        return jnp.asarray(leaf, dtype)
    return jax.tree_util.tree_map_with_path(leaf_of, tree,
                                            is_leaf=lambda a: isinstance(a, Int8Weight))
