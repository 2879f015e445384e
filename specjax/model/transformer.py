"""The forward pass of GPT-2 and Llama-family models, one pure function for prefill and decode.

Dimension letters, used in the einsums and beside each `linear()` call of the package:

    B batch    T query length    S key/cache length    D model width    F MLP width
    N query heads    K key/value heads    G = N / K    H head size    V vocab    L layers

Parameters are a plain dict pytree:

    embed        [V, D]            token embeddings (also the LM head when tied)
    pos_embed    [P, D]            GPT-2 only: learned absolute positions
    layers       a list of L dicts, one per layer:
      attn_norm, mlp_norm          {"scale": [D]} (+ "bias": [D] for GPT-2's LayerNorm)
      wq [N, H, D]  wk, wv [K, H, D]  wo [D, N, H]     (+ bq [N, H], bk, bv [K, H], bo [D])
      q_norm, k_norm               Qwen3 only: {"scale": [H]}, RMSNorm of each head before RoPE
      GPT-2:  w_in [F, D], w_out [D, F]                (+ b_in [F], b_out [D])
      Llama:  w_gate, w_up [F, D], w_down [D, F]       (+ b_gate, b_up [F], b_down [D])
    final_norm   {"scale": [D]} (+ "bias")
    lm_head      [V, D]            only when the embeddings are not tied

Every matrix is stored [out, in], as torch.nn.Linear stores it (and the embedding, which the
tied LM head reads the same way): each product contracts the activations' last axis with the
weight's last axis. XLA's CPU dot is faster that way for the few-row products of decoding.

Why a list of layers and a Python loop, not weights stacked along L under `lax.scan`: a scan
slices each layer's weights out of the stacked arrays, and XLA materialises that slice as a copy
on every call. Decoding a token reads every weight once, so the copy doubled the memory traffic
of a step. The price is compile time that grows with depth. The KV cache is split per layer for
the same reason (`specjax.model.cache`). docs/benchmarks.md, "The model's layouts, measured",
has the timings behind each choice.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
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
    positions = positions.astype(jnp.int32)
    x = lookup(params["embed"], tokens)                                 # [B, T, D]
    if config.arch == "gpt2":
        x = x + lookup(params["pos_embed"], positions)
    x, cache = decoder_layers(params["layers"], config, x, positions, cache, tree)
    return _norm(config, params["final_norm"], x), cache


def tapped_states(params: Params, config: ModelConfig, tokens: jax.Array, positions: jax.Array,
                  cache: KVCache | None = None, tree: TreeAttention | None = None,
                  taps: tuple[int, ...] = ()) -> tuple[jax.Array, jax.Array, KVCache | None]:
    """`hidden_states`, and the residual stream after the first n decoder layers for each n in
    `taps`, concatenated: [B, T, len(taps) * D] (EAGLE-3's low, middle and high features,
    `specjax.heads.eagle`). Returns (final-normed states, tapped states, cache)."""
    positions = positions.astype(jnp.int32)
    x = lookup(params["embed"], tokens)                                 # [B, T, D]
    if config.arch == "gpt2":
        x = x + lookup(params["pos_embed"], positions)
    tapped, keys, values, done = [], [], [], 0
    for n in (*taps, config.n_layers):
        if n > done:            # layers done .. n - 1, with their part of the cache
            part = None if cache is None else dataclasses.replace(
                cache, k=cache.k[done:n], v=cache.v[done:n])
            x, part = decoder_layers(params["layers"][done:n], config, x, positions, part, tree)
            if part is not None:
                keys, values, length = keys + list(part.k), values + list(part.v), part.length
        tapped.append(x)
        done = n
    if cache is not None:
        cache = KVCache(tuple(keys), tuple(values), length, cache.first)
    features = jnp.concatenate(tapped[:-1], axis=-1) if taps else None
    return _norm(config, params["final_norm"], x), features, cache


def decoder_layers(layers: list, config: ModelConfig, x: jax.Array, positions: jax.Array,
                   cache: KVCache | None = None, tree: TreeAttention | None = None,
                   attn_input: jax.Array | None = None) -> tuple[jax.Array, KVCache | None]:
    """The decoder layers on input vectors x [B, T, D] (embeddings, for the model itself; an
    EAGLE drafter feeds its fused features, `specjax.heads.eagle`): the residual stream after
    the last layer, before the final norm, and the cache (one layer's buffers per layer, in
    order). Arguments as in `forward`; `attn_input` [B, T, E], if given, is what the first
    layer's attention reads instead of its normed residual (EAGLE drafters: the fused features
    without a norm, or EAGLE-3's [norm(embedding) ; norm(feature)], E = 2D)."""
    positions = positions.astype(jnp.int32)
    slots = positions if tree is None else tree.slots(x.shape[1])         # [B, T]
    if config.arch == "llama":
        rope = rope_tables(positions, jnp.asarray(rope_frequencies(config)))

    new_k, new_v = [], []
    for i, p in enumerate(layers):
        h = attn_input if i == 0 and attn_input is not None else _norm(config, p["attn_norm"], x)
        q, k, v = (_project(h, p[name]) for name in ("wq", "wk", "wv"))  # [B, T, heads, H]
        if config.qkv_bias:
            q, k, v = q + p["bq"], k + p["bk"], v + p["bv"]
        if config.qk_norm:                      # Qwen3: each head's q and k, over H
            q = rms_norm(q, p["q_norm"]["scale"], config.norm_eps)
            k = rms_norm(k, p["k_norm"]["scale"], config.norm_eps)
        if config.arch == "llama":
            q, k = apply_rope(q, k, rope)
        if cache is None:
            keys, values = jnp.transpose(k, (0, 2, 3, 1)), jnp.transpose(v, (0, 2, 1, 3))
            attn = attend(q, keys, values, kv.attention_mask(slots, slots, tree))  # [B, T, N, H]
        else:
            layer_k, layer_v = kv.write(cache.k[i], cache.v[i], k, v, slots)
            new_k.append(layer_k)
            new_v.append(layer_v)
            attn = attend_cache(q, layer_k, layer_v, slots, tree, cache.first)   # [B, T, N, H]
        # One flat product over (N, H): as a two-axis einsum, XLA on a CPU copied wo every call.
        b, t, n, h_ = attn.shape
        wo = p["wo"].reshape(-1, n * h_)                                # [D, N*H]
        out = linear(attn.reshape(b, t, n * h_), wo)             # BT(NH),D(NH)->BTD
        if config.out_bias:
            out = out + p["bo"]
        x = x + out
        x = x + _mlp(config, p, _norm(config, p["mlp_norm"], x))
    if cache is not None:
        cache = KVCache(tuple(new_k), tuple(new_v), slots[:, -1] + 1, cache.first)
    return x, cache


def final_norm(params: Params, config: ModelConfig, x: jax.Array) -> jax.Array:
    """The model's final norm on residual vectors [..., D]."""
    return _norm(config, params["final_norm"], x)


def _project(x, w):
    """x [B, T, D] through w [heads, H, D] -> [B, T, heads, H], as one flat product with
    [heads * H, D]: written as an einsum over (heads, H), XLA on a CPU transposed w every call."""
    heads, h, d = w.shape
    # BTD,(XH)D->BT(XH)->BTXH, X the query or key/value heads
    return linear(x, w.reshape(heads * h, d)).reshape(*x.shape[:2], heads, h)


def lm_head(params: Params, config: ModelConfig, x: jax.Array) -> jax.Array:
    """Hidden states [B, T, D] -> logits [B, T, V] in float32."""
    head = params["embed"] if config.tie_embeddings else params["lm_head"]        # [V, D]
    return linear(x, head, out_dtype=jnp.float32)                       # BTD,VD->BTV


def _norm(config: ModelConfig, p, x):
    if config.arch == "gpt2":
        return layer_norm(x, p["scale"], p["bias"], config.norm_eps)
    return rms_norm(x, p["scale"], config.norm_eps)


def _mlp(config: ModelConfig, p, x):
    if config.arch == "gpt2":
        h = linear(x, p["w_in"])                                        # BTD,FD->BTF
        if config.mlp_bias:
            h = h + p["b_in"]
        out = linear(activation(config.activation, h), p["w_out"])       # BTF,DF->BTD
        return out + p["b_out"] if config.mlp_bias else out
    gate, up = linear(x, p["w_gate"]), linear(x, p["w_up"])              # BTD,FD->BTF each
    if config.mlp_bias:
        gate, up = gate + p["b_gate"], up + p["b_up"]
    out = linear(activation(config.activation, gate) * up, p["w_down"])  # BTF,DF->BTD
    return out + p["b_down"] if config.mlp_bias else out


# -- Parameter shapes and random initialisation -------------------------------------------------

def param_shapes(config: ModelConfig) -> Params:
    """The shape of every parameter: the single source for init, loading and saving."""
    c = config
    L, V, D, F, N, K, H = (c.n_layers, c.vocab_size, c.d_model, c.d_ff, c.n_heads,
                           c.n_kv_heads, c.head_dim)
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
    shapes = {"embed": (V, D), "layers": [layer] * L, "final_norm": norm}
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

    Each per-layer parameter is drawn once for all layers, as an [L, ...] array, and then split:
    a seed gives the same weights as it did when the layers were stored stacked.
    """
    shapes = param_shapes(config)
    is_shape = lambda s: isinstance(s, tuple)  # noqa: E731
    shapes["layers"] = jax.tree.map(lambda s: (config.n_layers, *s), shapes["layers"][0],
                                    is_leaf=is_shape)
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
    params = dict(params, layers=unstack_layers(params["layers"], config.n_layers))
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


def unstack_layers(stacked: dict, n_layers: int) -> list[dict]:
    """A tree of [L, ...] arrays -> the list of L per-layer trees that `forward` takes."""
    return [jax.tree.map(lambda a: a[i], stacked) for i in range(n_layers)]


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
