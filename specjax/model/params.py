"""The parameter tree of a model (its layout is in `specjax.model.transformer`'s docstring):
every parameter's shape (`param_shapes`, the single source for init, loading and saving), the
logical axes a device mesh may split (`PARAM_AXES`), random initialisation (`init_params`) and
the layers stacked along L and back (`stack_layers`, `unstack_layers`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specjax.model.config import ModelConfig
from specjax.model.quant import EIGHT_BIT, convert

# A parameter tree: nested dicts of arrays (8-bit matrices as `quant.Int8Weight`).
Params = dict


def param_shapes(config: ModelConfig) -> Params:
    """The shape of every parameter, each layer's stacked along L: the single source for init,
    loading and saving."""
    shapes = dict(layer_shapes(config))
    layer = shapes.pop("layer")
    is_shape = lambda s: isinstance(s, tuple)  # noqa: E731
    shapes["layers"] = jax.tree.map(lambda s: (config.n_layers, *s), layer, is_leaf=is_shape)
    return shapes


def layer_shapes(config: ModelConfig) -> Params:
    """`param_shapes` with one layer's shapes under "layer" (without the L axis) instead of the
    stacked "layers"."""
    c = config
    V, D, F, N, K, H = c.vocab_size, c.d_model, c.d_ff, c.n_heads, c.n_kv_heads, c.head_dim
    norm = {"scale": (D,), "bias": (D,)} if c.arch == "gpt2" else {"scale": (D,)}
    layer = {"attn_norm": norm, "mlp_norm": norm,
             "wq": (N, H, D), "wk": (K, H, D), "wv": (K, H, D), "wo": (D, N, H)}
    if c.qkv_bias:
        layer.update(bq=(N, H), bk=(K, H), bv=(K, H))
    if c.qk_norm:
        layer.update(q_norm={"scale": (H,)}, k_norm={"scale": (H,)})
    if c.out_bias:
        layer.update(bo=(D,))
    if c.arch == "gpt2":
        layer.update(w_in=(F, D), w_out=(D, F))
        if c.mlp_bias:
            layer.update(b_in=(F,), b_out=(D,))
    else:
        layer.update(w_gate=(F, D), w_up=(F, D), w_down=(D, F))
        if c.mlp_bias:
            layer.update(b_gate=(F,), b_up=(F,), b_down=(D,))
    shapes = {"embed": (V, D), "layer": layer, "final_norm": norm}
    if c.arch == "gpt2":
        shapes["pos_embed"] = (c.max_positions, D)
    if not c.tie_embeddings:
        shapes["lm_head"] = (V, D)
    return shapes


# The logical axis of each parameter that tensor parallelism may split, by name; parameters not
# named here (norms, output biases, GPT-2's positions) are never split. `specjax.mesh` maps
# "heads", "kv_heads", "ff" and "vocab" to the mesh's "model" axis: the Megatron pattern, where
# a layer's attention heads and MLP columns are computed where their weights live and the two
# products that leave them (wo, w_out/w_down) end in one sum over devices each.
PARAM_AXES = {
    "wq": ("heads", None, None), "wk": ("kv_heads", None, None), "wv": ("kv_heads", None, None),
    "wo": (None, "heads", None),
    "bq": ("heads", None), "bk": ("kv_heads", None), "bv": ("kv_heads", None),
    **dict.fromkeys(("w_in", "w_gate", "w_up"), ("ff", None)),
    **dict.fromkeys(("w_out", "w_down"), (None, "ff")),
    **dict.fromkeys(("b_in", "b_gate", "b_up"), ("ff",)),
    "embed": ("vocab", None), "lm_head": ("vocab", None),
}


def logical_sizes(config: ModelConfig) -> dict[str, int]:
    """The length of each logical axis of `PARAM_AXES` in this model."""
    return {"heads": config.n_heads, "kv_heads": config.n_kv_heads, "ff": config.d_ff,
            "vocab": config.vocab_size}


def init_params(config: ModelConfig, key: jax.Array, std: float = 0.02) -> Params:
    """Random parameters: normal(0, std) weights, zero biases, unit norm scales, each
    per-layer parameter drawn once for all layers, as the [L, ...] array it is stored as."""
    shapes = param_shapes(config)
    is_shape = lambda s: isinstance(s, tuple)  # noqa: E731
    leaves, treedef = jax.tree.flatten_with_path(shapes, is_leaf=is_shape)
    keys = jax.random.split(key, len(leaves))
    dtype = jnp.dtype(config.compute_dtype)

    def init(path, shape, k):
        name = jax.tree_util.keystr(path)
        if "scale" in name:
            return jnp.ones(shape, dtype)
        if "bias" in name or "['b" in name:
            return jnp.zeros(shape, dtype)
        return (std * draw_normal(path[-1].key, shape, k)).astype(dtype)

    params = jax.tree.unflatten(treedef, [init(p, s, k) for (p, s), k in zip(leaves, keys)])
    return convert(params, config.dtype) if config.dtype in EIGHT_BIT else params


# Matrices are drawn [in, out] and their axes moved to the stored [out, in], so that a seed's
# model does not depend on the layout weights are stored in: per name, the drawn shape from the
# stored one, and the move from drawn to stored (any leading L axis kept).
_DRAWN = {
    **dict.fromkeys(("wq", "wk", "wv"), (lambda s: (*s[:-3], s[-1], s[-3], s[-2]),   # [D, X, H]
                                         lambda a: jnp.moveaxis(a, -3, -1))),
    "wo": (lambda s: (*s[:-3], s[-2], s[-1], s[-3]),                                # [N, H, D]
           lambda a: jnp.moveaxis(a, -1, -3)),
    **dict.fromkeys(("w_in", "w_out", "w_gate", "w_up", "w_down", "lm_head"),
                    (lambda s: (*s[:-2], s[-1], s[-2]), lambda a: jnp.swapaxes(a, -1, -2))),
}


def draw_normal(name: str, shape: tuple, key: jax.Array) -> jax.Array:
    """Standard normal float32 values for the parameter `name` of `shape` (as stored), drawn in
    the layout `_DRAWN` names."""
    drawn_shape, to_stored = _DRAWN.get(name, (lambda s: s, lambda a: a))
    return to_stored(jax.random.normal(key, drawn_shape(shape), jnp.float32))


def layer_params(layers: dict, i: int) -> dict:
    """Layer i of stacked layers (`params["layers"]`): its own tree, 8-bit matrices included."""
    return jax.tree.map(lambda a: a[i], layers)


def unstack_layers(layers: dict) -> list[dict]:
    """Stacked layers -> the list of their L per-layer trees (for writing them out one by one)."""
    n_layers = jax.tree.leaves(layers)[0].shape[0]
    return [layer_params(layers, i) for i in range(n_layers)]


def stack_layers(layers: list[dict]) -> dict:
    """A list of L per-layer trees -> the stacked tree that `forward` takes (numpy stays numpy:
    loaders stack in numpy before placing the weights on devices)."""
    def stack(*leaves):
        return np.stack(leaves) if isinstance(leaves[0], np.ndarray) else jnp.stack(leaves)
    return jax.tree.map(stack, *layers)
