"""The forward pass of GPT-2 and Llama-family models, one pure function for prefill and decode.

Dimension letters, used in the einsums and beside each `linear()` call of the package:

    B batch    T query length    S key/cache length    D model width    F MLP width
    N query heads    K key/value heads    G = N / K    H head size    V vocab    L layers

Parameters are a plain dict pytree:

    embed        [V, D]            token embeddings (also the LM head when tied)
    pos_embed    [P, D]            GPT-2 only: learned absolute positions
    layers       one dict for all L layers, each leaf stacked along a leading L axis:
      attn_norm, mlp_norm          {"scale": [L, D]} (+ "bias": [L, D] for GPT-2's LayerNorm)
      wq [L, N, H, D]  wk, wv [L, K, H, D]  wo [L, D, N, H]
                                   (+ bq [L, N, H], bk, bv [L, K, H], bo [L, D])
      q_norm, k_norm               Qwen3 only: {"scale": [L, H]}, RMSNorm of each head before RoPE
      GPT-2:  w_in [L, F, D], w_out [L, D, F]          (+ b_in [L, F], b_out [L, D])
      Llama:  w_gate, w_up [L, F, D], w_down [L, D, F] (+ b_gate, b_up [L, F], b_down [L, D])
    final_norm   {"scale": [D]} (+ "bias")
    lm_head      [V, D]            only when the embeddings are not tied

Every matrix is stored [out, in], as torch.nn.Linear stores it (and the embedding, which the
tied LM head reads the same way): each product contracts the activations' last axis with the
weight's last axis. XLA's CPU dot is faster that way for the few-row products of decoding.

The layers are one compiled body in a loop over L (`decoder_layers`, a `lax.scan`), so a
program's size and its compile time do not grow with depth. A slice of a stacked array is a copy
under XLA on a CPU, and decoding a token reads every weight once, so a copied slice would double
a step's memory traffic: the few-token calls' kernels instead take the whole stack and the
layer's index and read the layer where it lies (`linear.linear`'s `stacked`), and the cache,
stacked the same way, is written and read in place (`specjax.model.cache`). XLA's products
(prefill, training, other platforms) read the scan's slice, which a GEMM's arithmetic dwarfs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from specjax.model import cache as kv
from specjax.model.cache import KVCache, TreeAttention
from specjax.model.config import ModelConfig
from specjax.model.layers import (
    activation,
    apply_rope,
    attend,
    attend_cache,
    layer_norm,
    lookup,
    rms_norm,
    rope_frequencies,
    rope_tables,
)
from specjax.model.linear import linear
from specjax.model.quant import EIGHT_BIT, Int8Weight, convert

Params = dict


@dataclasses.dataclass(frozen=True)
class Model:
    """What `specjax.load` returns: a static config, a parameter tree and a tokenizer."""
    config: ModelConfig
    params: Params
    tokenizer: object | None = None      # tokenizers.Tokenizer, or None if the dir has none
    path: Path | None = None
    chat_template: str | None = None

    @property
    def name(self) -> str:
        return self.path.name if self.path else f"random-{self.config.arch}"


def forward(params: Params, config: ModelConfig, tokens: jax.Array, positions: jax.Array,
            cache: KVCache | None = None,
            tree: TreeAttention | None = None) -> tuple[jax.Array, KVCache | None]:
    """Runs the model on `tokens` at absolute `positions`.

    Args:
      params: the parameter tree described in the module docstring.
      config: static model config.
      tokens: [B, T] int token ids.
      positions: [B, T] int absolute positions, consecutive within each row.
      cache: a KVCache, or None to attend only among the given tokens (training, scoring).
      tree: when the tokens are nodes of a token tree (`specjax.model.cache.TreeAttention`): they are
        written to consecutive slots after the tree's root, and each attends to its ancestors
        only. `positions` are then the nodes' positions, root + depth, not consecutive.
    Returns:
      logits [B, T, V] float32, and the cache with the new keys/values written and each row's
      length set to the last slot written + 1 (callers set the true length after: a padded
      row's, or the accepted part of a tree).
    """
    x, cache = hidden_states(params, config, tokens, positions, cache, tree)
    return lm_head(params, config, x), cache


def hidden_states(params: Params, config: ModelConfig, tokens: jax.Array, positions: jax.Array,
                  cache: KVCache | None = None,
                  tree: TreeAttention | None = None) -> tuple[jax.Array, KVCache | None]:
    """`forward` without the LM head: the final-normed hidden states [B, T, D] and the cache.

    Prefill needs only the cache, and the LM head is a fifth of a small model's work per token
    (SmolLM2-135M: 28M of its 135M parameters), so prefill stops here.
    """
    final, _, cache = tapped_states(params, config, tokens, positions, cache, tree)
    return final, cache


def tapped_states(params: Params, config: ModelConfig, tokens: jax.Array, positions: jax.Array,
                  cache: KVCache | None = None, tree: TreeAttention | None = None,
                  taps: tuple[int, ...] = ()) -> tuple[jax.Array, jax.Array, KVCache | None]:
    """`hidden_states`, and the residual stream after the first n decoder layers for each n in
    `taps`, concatenated: [B, T, len(taps) * D] (EAGLE-3's low, middle and high features,
    `specjax.heads.eagle`; None without taps). Returns (final-normed states, tapped states,
    cache)."""
    positions = positions.astype(jnp.int32)
    x = lookup(params["embed"], tokens)                                 # [B, T, D]
    if config.arch == "gpt2":
        x = x + lookup(params["pos_embed"], positions)
    x, tapped, cache = _layers(params["layers"], config, x, positions, cache, tree, None, taps)
    features = jnp.concatenate(list(tapped), axis=-1) if taps else None  # [B, T, len(taps) * D]
    return _norm(config, params["final_norm"], x), features, cache


def decoder_layers(layers: dict, config: ModelConfig, x: jax.Array, positions: jax.Array,
                   cache: KVCache | None = None, tree: TreeAttention | None = None,
                   attn_input: jax.Array | None = None) -> tuple[jax.Array, KVCache | None]:
    """The decoder layers (`layers`, stacked as `params["layers"]`) on input vectors x [B, T, D]
    (embeddings, for the model itself; an EAGLE drafter feeds its fused features,
    `specjax.heads.eagle`): the residual stream after the last layer, before the final norm, and
    the cache. Arguments as in `forward`; `attn_input` [B, T, E], if given, is what the layer's
    attention reads instead of its normed residual, for a one-layer stack (EAGLE drafters: the
    fused features without a norm, or EAGLE-3's [norm(embedding) ; norm(feature)], E = 2D)."""
    x, _, cache = _layers(layers, config, x, positions.astype(jnp.int32), cache, tree,
                          attn_input)
    return x, cache


# Layers per iteration of the scan: two halve the loop's own cost per layer (its bookkeeping
# between bodies) for a second copy of the body to compile (bench/compile-once-per-layer/).
UNROLL = 2


def _layers(layers: dict, config: ModelConfig, x, positions, cache, tree, attn_input=None,
            taps: tuple[int, ...] = ()):
    """The decoder layers as one compiled body in a `lax.scan` over L -> (the residual stream
    after the last layer, the stream after the first n layers for each n in `taps` [n_taps, B,
    T, D], the cache).

    The scan's slices of the weights are what XLA's products read; the kernels read the stacked
    weights (`flat`, closed over) at the layer's index instead, in place (`linear`'s `stacked`),
    and the layer's part of the stacked cache, carried by the scan, is written and read in place
    by its index too (`cache.write`, `layers.attend_cache`)."""
    slots = positions if tree is None else tree.slots(x.shape[1])         # [B, T]
    rope = (rope_tables(positions, jnp.asarray(rope_frequencies(config)))
            if config.arch == "llama" else None)
    flat = _flat(layers)
    n_layers = jax.tree.leaves(flat)[0].shape[0]
    if attn_input is not None and n_layers != 1:
        raise ValueError(f"attn_input is for a one-layer stack, not {n_layers} layers")
    # Where each layer's output goes among the taps: slot j for the layer after which taps[j]
    # layers are done, the spare last slot for the others (written and dropped).
    slot_of = np.full(n_layers + 1, len(taps), np.int32)
    for j, n in enumerate(taps):
        slot_of[n] = j
    tapped = jnp.zeros((len(taps) + 1, *x.shape), x.dtype) if taps else None
    if 0 in taps:
        tapped = tapped.at[taps.index(0)].set(x)
    # A bfloat16 cache is carried as its bits through the loop (`cache.as_bits`): one
    # conversion a call, where XLA would convert the whole stack at every layer's write.
    buffers = None if cache is None else (kv.as_bits(cache.k)[0], kv.as_bits(cache.v)[0])
    first = 0 if cache is None else cache.first

    def body(carry, layer):
        x, tapped, buffers = carry
        p, index = layer
        x, buffers = _layer(config, p, flat, index, x, slots, rope, buffers, first, tree,
                            attn_input)
        if taps:
            slot = jnp.asarray(slot_of)[index + 1]
            tapped = lax.dynamic_update_index_in_dim(tapped, x, slot, 0)
        return (x, tapped, buffers), None

    (x, tapped, buffers), _ = lax.scan(body, (x, tapped, buffers),
                                       (flat, jnp.arange(n_layers, dtype=jnp.int32)),
                                       unroll=UNROLL)
    if cache is not None:
        k, v = (kv.as_bits(c)[1](b) for c, b in zip((cache.k, cache.v), buffers))
        cache = KVCache(k, v, slots[:, -1] + 1, cache.first)
    return x, (tapped[:len(taps)] if taps else ()), cache


def _flat(layers: dict) -> dict:
    """The stacked layers with each attention matrix as the flat product takes it: wq, wk, wv
    [L, X * H, D], wo [L, D, N * H] (a reshape of a stacked array is free; written as an einsum
    over the heads, XLA on a CPU transposed the weights every call)."""
    flat = dict(layers)
    for name in ("wq", "wk", "wv"):
        layers_, heads, h, d = layers[name].shape
        flat[name] = layers[name].reshape(layers_, heads * h, d)
    layers_, d, n, h = layers["wo"].shape
    flat["wo"] = layers["wo"].reshape(layers_, d, n * h)
    return flat


def _layer(config: ModelConfig, p: dict, flat: dict, index, x, slots, rope, buffers, first,
           tree, attn_input):
    """Decoder layer `index` ([] int32): p its weights (the scan's slices), flat all the
    layers' (`_flat`, for the kernels) -> (the residual stream after it, the cache buffers)."""
    def linear_(h, name):                      # BTI,OI->BTO with layer `index` of `name`
        return linear(h, p[name], stacked=(flat[name], index))

    h = attn_input if attn_input is not None else _norm(config, p["attn_norm"], x)
    b, t = x.shape[:2]
    q, k, v = (linear_(h, name).reshape(b, t, -1, config.head_dim)
               for name in ("wq", "wk", "wv"))                           # [B, T, heads, H]
    if config.qkv_bias:
        q, k, v = q + p["bq"], k + p["bk"], v + p["bv"]
    if config.qk_norm:                          # Qwen3: each head's q and k, over H
        q = rms_norm(q, p["q_norm"]["scale"], config.norm_eps)
        k = rms_norm(k, p["k_norm"]["scale"], config.norm_eps)
    if config.arch == "llama":
        q, k = apply_rope(q, k, rope)
    if buffers is None:
        keys, values = jnp.transpose(k, (0, 2, 3, 1)), jnp.transpose(v, (0, 2, 1, 3))
        attn = attend(q, keys, values, kv.attention_mask(slots, slots, tree))  # [B, T, N, H]
    else:
        buffers = kv.write(*buffers, k, v, slots, index)
        attn = attend_cache(q, *buffers, slots, tree, first, index)     # [B, T, N, H]
    # One flat product over (N, H): as a two-axis einsum, XLA on a CPU copied wo every call.
    out = linear_(attn.reshape(b, t, -1), "wo")                        # BT(NH),D(NH)->BTD
    if config.out_bias:
        out = out + p["bo"]
    x = x + out
    return x + _mlp(config, p, flat, index, _norm(config, p["mlp_norm"], x)), buffers


def final_norm(params: Params, config: ModelConfig, x: jax.Array) -> jax.Array:
    """The model's final norm on residual vectors [..., D]."""
    return _norm(config, params["final_norm"], x)


def lm_head(params: Params, config: ModelConfig, x: jax.Array) -> jax.Array:
    """Hidden states [B, T, D] -> logits [B, T, V] in float32."""
    head = params["embed"] if config.tie_embeddings else params["lm_head"]        # [V, D]
    return linear(x, head, out_dtype=jnp.float32)                       # BTD,VD->BTV


def _norm(config: ModelConfig, p, x):
    if config.arch == "gpt2":
        return layer_norm(x, p["scale"], p["bias"], config.norm_eps)
    return rms_norm(x, p["scale"], config.norm_eps)


def _mlp(config: ModelConfig, p, flat, index, x):
    def linear_(h, name):                      # BTI,OI->BTO with layer `index` of `name`
        return linear(h, p[name], stacked=(flat[name], index))

    if config.arch == "gpt2":
        h = linear_(x, "w_in")                                          # BTD,FD->BTF
        if config.mlp_bias:
            h = h + p["b_in"]
        out = linear_(activation(config.activation, h), "w_out")         # BTF,DF->BTD
        return out + p["b_out"] if config.mlp_bias else out
    gate, up = linear_(x, "w_gate"), linear_(x, "w_up")                  # BTD,FD->BTF each
    if config.mlp_bias:
        gate, up = gate + p["b_gate"], up + p["b_up"]
    out = linear_(activation(config.activation, gate) * up, "w_down")  # BTF,DF->BTD
    return out + p["b_down"] if config.mlp_bias else out


# -- Parameter shapes and random initialisation -------------------------------------------------

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
    """Random parameters: normal(0, std) weights, zero biases, unit norm scales.

    Each per-layer parameter is drawn once for all layers, as the [L, ...] array it is stored
    as.
    """
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


# Matrices are drawn in the [in, out] layout specjax stored before it stored them [out, in], and
# their axes moved after, so that a seed gives the same model as it always did: per name, the
# drawn shape from the stored one, and the move from drawn to stored (any leading L axis kept).
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
    the layout `_DRAWN` names: the same numbers a key gave before weights were stored
    [out, in]."""
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
    loaders stack on the host before placing the weights)."""
    def stack(*leaves):
        return np.stack(leaves) if isinstance(leaves[0], np.ndarray) else jnp.stack(leaves)
    return jax.tree.map(stack, *layers)


def cast_params(params: Params, dtype) -> Params:
    """Every parameter in `dtype` ("int8" or "q8_0": the matrices quantised,
    `specjax.model.quant`; 8-bit matrices cast to a float dtype are dequantised first)."""
    return convert(params, dtype if dtype in EIGHT_BIT else str(jnp.dtype(dtype)))


def in_dtype(model: Model, dtype: str) -> Model:
    """`model` with its weights, activations and cache in `dtype` (itself when they are)."""
    if model.config.dtype == dtype:
        return model
    return dataclasses.replace(model, config=model.config.replace(dtype=dtype),
                               params=cast_params(model.params, dtype))


def count_params(params: Params) -> int:
    """The number of weights (an 8-bit matrix's values; its scales are not weights)."""
    leaves = jax.tree.leaves(params, is_leaf=lambda a: isinstance(a, Int8Weight))
    return int(sum(np.prod(a.shape) for a in leaves))
