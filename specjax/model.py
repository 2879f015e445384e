"""The forward pass of GPT-2 and Llama-family models, one pure function for prefill and decode.

Dimension letters, used in every einsum of the package:

    B batch    T query length    S key/cache length    D model width    F MLP width
    N query heads    K key/value heads    G = N / K    H head size    V vocab    L layers

Parameters are a plain dict pytree. Per-layer weights are stacked along a leading L axis so
that the layers run under one `lax.scan`: compile time does not grow with depth.

    embed        [V, D]            token embeddings (also the LM head when tied)
    pos_embed    [P, D]            GPT-2 only: learned absolute positions
    layers/      every leaf has a leading [L]:
      attn_norm, mlp_norm          {"scale": [D]} (+ "bias": [D] for GPT-2's LayerNorm)
      wq [D, N, H]  wk, wv [D, K, H]  wo [N, H, D]     (+ bq [N, H], bk, bv [K, H], bo [D])
      GPT-2:  w_in [D, F], w_out [F, D]                (+ b_in [F], b_out [D])
      Llama:  w_gate, w_up [D, F], w_down [F, D]       (+ b_gate, b_up [F], b_down [D])
    final_norm   {"scale": [D]} (+ "bias")
    lm_head      [D, V]            only when the embeddings are not tied
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from specjax import cache as kv
from specjax.cache import KVCache
from specjax.config import ModelConfig
from specjax.layers import activation, apply_rope, attend, layer_norm, rms_norm, rope_frequencies

Params = dict


def forward(params: Params, config: ModelConfig, tokens: jax.Array, positions: jax.Array,
            cache: KVCache | None = None) -> tuple[jax.Array, KVCache | None]:
    """Runs the model on `tokens` at absolute `positions`.

    Args:
      params: the parameter tree described in the module docstring.
      config: static model config.
      tokens: [B, T] int token ids.
      positions: [B, T] int absolute positions, consecutive within each row.
      cache: a KVCache, or None to attend only among the given tokens (training, scoring).
    Returns:
      logits [B, T, V] float32, and the cache with the new keys/values written and each row's
      length set to positions[:, -1] + 1 (a padded row's caller sets its true length after).
    """
    positions = positions.astype(jnp.int32)
    x = params["embed"][tokens]                                         # [B, T, D]
    if config.arch == "gpt2":
        x = x + params["pos_embed"][positions]
    inv_freq = jnp.asarray(rope_frequencies(config)) if config.arch == "llama" else None

    if cache is None:
        key_positions = positions
        cache_kv = (jnp.zeros((config.n_layers, 0)), jnp.zeros((config.n_layers, 0)))
    else:
        b = tokens.shape[0]
        key_positions = jnp.broadcast_to(jnp.arange(cache.slots, dtype=jnp.int32), (b, cache.slots))
        cache_kv = (cache.k, cache.v)

    def layer(x, scanned):
        p, cache_k, cache_v = scanned
        h = _norm(config, p["attn_norm"], x)
        q = jnp.einsum("BTD,DNH->BTNH", h, p["wq"])
        k = jnp.einsum("BTD,DKH->BTKH", h, p["wk"])
        v = jnp.einsum("BTD,DKH->BTKH", h, p["wv"])
        if config.qkv_bias:
            q, k, v = q + p["bq"], k + p["bk"], v + p["bv"]
        if config.arch == "llama":
            q, k = apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq)
        if cache is None:
            keys, values = k, v
        else:
            cache_k, cache_v = kv.write(cache_k, cache_v, k, v, positions)
            keys, values = cache_k, cache_v
        attn = attend(q, keys, values, positions, key_positions)       # [B, T, N, H]
        out = jnp.einsum("BTNH,NHD->BTD", attn, p["wo"])
        if config.out_bias:
            out = out + p["bo"]
        x = x + out
        x = x + _mlp(config, p, _norm(config, p["mlp_norm"], x))
        return x, (cache_k, cache_v)

    x, (new_k, new_v) = lax.scan(layer, x, (params["layers"], *cache_kv))
    x = _norm(config, params["final_norm"], x)
    if config.tie_embeddings:
        logits = jnp.einsum("BTD,VD->BTV", x, params["embed"], preferred_element_type=jnp.float32)
    else:
        logits = jnp.einsum("BTD,DV->BTV", x, params["lm_head"], preferred_element_type=jnp.float32)
    if cache is not None:
        cache = KVCache(new_k, new_v, positions[:, -1] + 1)
    return logits.astype(jnp.float32), cache


def _norm(config: ModelConfig, p, x):
    if config.arch == "gpt2":
        return layer_norm(x, p["scale"], p["bias"], config.norm_eps)
    return rms_norm(x, p["scale"], config.norm_eps)


def _mlp(config: ModelConfig, p, x):
    if config.arch == "gpt2":
        h = jnp.einsum("BTD,DF->BTF", x, p["w_in"])
        if config.mlp_bias:
            h = h + p["b_in"]
        out = jnp.einsum("BTF,FD->BTD", activation(config.activation, h), p["w_out"])
        return out + p["b_out"] if config.mlp_bias else out
    gate = jnp.einsum("BTD,DF->BTF", x, p["w_gate"])
    up = jnp.einsum("BTD,DF->BTF", x, p["w_up"])
    if config.mlp_bias:
        gate, up = gate + p["b_gate"], up + p["b_up"]
    out = jnp.einsum("BTF,FD->BTD", activation(config.activation, gate) * up, p["w_down"])
    return out + p["b_down"] if config.mlp_bias else out


# -- Parameter shapes and random initialisation -------------------------------------------------

def param_shapes(config: ModelConfig) -> Params:
    """The shape of every parameter: the single source for init, loading and saving."""
    c = config
    L, V, D, F, N, K, H = (c.n_layers, c.vocab_size, c.d_model, c.d_ff, c.n_heads,
                           c.n_kv_heads, c.head_dim)
    norm = {"scale": (D,), "bias": (D,)} if c.arch == "gpt2" else {"scale": (D,)}
    layer = {"attn_norm": norm, "mlp_norm": norm,
             "wq": (D, N, H), "wk": (D, K, H), "wv": (D, K, H), "wo": (N, H, D)}
    if c.qkv_bias:
        layer.update(bq=(N, H), bk=(K, H), bv=(K, H))
    if c.out_bias:
        layer.update(bo=(D,))
    if c.arch == "gpt2":
        layer.update(w_in=(D, F), w_out=(F, D))
        if c.mlp_bias:
            layer.update(b_in=(F,), b_out=(D,))
    else:
        layer.update(w_gate=(D, F), w_up=(D, F), w_down=(F, D))
        if c.mlp_bias:
            layer.update(b_gate=(F,), b_up=(F,), b_down=(D,))
    shapes = {"embed": (V, D), "layers": jax.tree.map(lambda s: (L, *s), layer,
                                                       is_leaf=lambda s: isinstance(s, tuple)),
              "final_norm": norm}
    if c.arch == "gpt2":
        shapes["pos_embed"] = (c.max_positions, D)
    if not c.tie_embeddings:
        shapes["lm_head"] = (D, V)
    return shapes


def init_params(config: ModelConfig, key: jax.Array, std: float = 0.02) -> Params:
    """Random parameters: normal(0, std) weights, zero biases, unit norm scales."""
    shapes = param_shapes(config)
    leaves, treedef = jax.tree.flatten_with_path(shapes, is_leaf=lambda s: isinstance(s, tuple))
    keys = jax.random.split(key, len(leaves))
    dtype = jnp.dtype(config.dtype)

    def init(path, shape, k):
        name = jax.tree_util.keystr(path)
        if "scale" in name:
            return jnp.ones(shape, dtype)
        if "bias" in name or "['b" in name:
            return jnp.zeros(shape, dtype)
        return (std * jax.random.normal(k, shape, jnp.float32)).astype(dtype)

    return jax.tree.unflatten(treedef, [init(p, s, k) for (p, s), k in zip(leaves, keys)])


def cast_params(params: Params, dtype) -> Params:
    return jax.tree.map(lambda a: jnp.asarray(a, dtype), params)


def count_params(params: Params) -> int:
    return int(sum(np.prod(a.shape) for a in jax.tree.leaves(params)))
