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
weight's last axis, the layout XLA's CPU dot reads best for the few-row products of decoding.

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
from specjax.model.linear import Kernels, linear
from specjax.model.params import Params
from specjax.model.quant import EIGHT_BIT, Int8Weight, convert


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
                  cache: KVCache | None = None, tree: TreeAttention | None = None,
                  prefill: bool = False) -> tuple[jax.Array, KVCache | None]:
    """`forward` without the LM head: the final-normed hidden states [B, T, D] and the cache.

    Prefill needs only the cache, and the LM head is a fifth of a small model's weights
    (SmolLM2-135M: 28M of its 135M parameters), so prefill stops here. `prefill`: the tokens
    are a prompt's, and the call's wide products take XLA's GEMM (`linear.kernel_chunks`).
    """
    final, _, cache = tapped_states(params, config, tokens, positions, cache, tree,
                                    prefill=prefill)
    return final, cache


def tapped_states(params: Params, config: ModelConfig, tokens: jax.Array, positions: jax.Array,
                  cache: KVCache | None = None, tree: TreeAttention | None = None,
                  taps: tuple[int, ...] = (),
                  prefill: bool = False) -> tuple[jax.Array, jax.Array, KVCache | None]:
    """`hidden_states`, and the residual stream after the first n decoder layers for each n in
    `taps`, concatenated: [B, T, len(taps) * D] (EAGLE-3's low, middle and high features,
    `specjax.heads.eagle`; None without taps). Returns (final-normed states, tapped states,
    cache)."""
    width = config.law_width or 1
    if cache is not None and not prefill and width > 1 and tokens.shape[1] != width:
        return _at_law_width(params, config, tokens, positions, cache, tree, taps)
    positions = positions.astype(jnp.int32)
    x = lookup(params["embed"], tokens)                                 # [B, T, D]
    if config.arch == "gpt2":
        x = x + lookup(params["pos_embed"], positions)
    x, tapped, cache = _layers(params["layers"], config, x, positions, cache, tree, taps=taps,
                               prefill=prefill)
    features = jnp.concatenate(list(tapped), axis=-1) if taps else None  # [B, T, len(taps) * D]
    return _norm(config, params["final_norm"], x), features, cache


# The one law's width on XLA's path (`ModelConfig.law_width`): every call on the cache is fed
# 16 tokens a row at a time, a one-token step padded, a tree of 40 nodes in three parts.
LAW_WIDTH = 16


def lawful(config: ModelConfig, kernels: Kernels | None) -> ModelConfig:
    """The config a program runs: with the CPU plug-in `kernels` (None: XLA's formulations at
    every width), its `law_width` chosen where it is None: 1 with the kernels (their own law,
    one order of sums at 1 to 32 rows), LAW_WIDTH without. The one place a program's products
    are chosen (`decoding.loop` and `specjax.forward` call it). Where the kernels do not
    serve, XLA picks its products' algorithms by shape, and a product of one row sums in
    another order than one of several (bench/xla-one-law/), so every call on the cache takes
    LAW_WIDTH rows and a verify call gives the bits of one-token steps (DESIGN.md, "One law on
    every backend")."""
    width = config.law_width or (1 if kernels is not None else LAW_WIDTH)
    return config.replace(kernels=kernels, law_width=width)


def xla_law(config: ModelConfig) -> bool:
    """Whether a program runs XLA's path at the one law's width (`law_width` > 1): there each
    call is fed W tokens a row, a tree node attends over its branch's layout, and every product
    that feeds an add (RoPE's, the norms', gelu_new's cubic term) is rounded before it
    (`layers.rounded`), whatever fusion XLA puts them in."""
    return (config.law_width or 1) > 1


def _at_law_width(params, config, tokens, positions, cache, tree, taps):
    """`tapped_states` as calls of exactly `config.law_width` (W) tokens a row: the T tokens
    padded to a multiple of W (`_padded`), then fed W at a time, each part writing the cache
    the next reads (a tree's parts by its `first`), and the first T rows kept. So every call
    on the cache is one shape, and each row's sums run in one order."""
    t, width = tokens.shape[1], config.law_width
    length = (positions if tree is None else tree.slots(t))[:, -1] + 1             # [B]
    rows = -(-t // width) * width
    tokens, positions, tree = _padded(tokens, positions, tree, rows)
    finals, tapped = [], []
    for start in range(0, rows, width):         # each part a call of W tokens: no recursion
        part = slice(start, start + width)
        fed = None if tree is None else dataclasses.replace(tree, first=tree.first + start)
        final, features, cache = tapped_states(params, config, tokens[:, part],
                                               positions[:, part], cache, fed, taps)
        finals.append(final)
        tapped.append(features)
    features = None if not taps else jnp.concatenate(tapped, axis=1)[:, :t]
    return jnp.concatenate(finals, axis=1)[:, :t], features, cache.with_length(length)


def _padded(tokens, positions, tree, rows: int):
    """A call of T tokens a row made `rows` long: the last token repeated at the positions after
    the last (no NaN reaches a cache slot, which XLA's attention would multiply by 0), and a
    tree's new nodes related only to themselves, so no real node attends to them. Their keys and
    values land in slots past the call's, which no query of it reads, and which the next call
    writes before it reads them (a slot past the buffer is dropped). -> (tokens, positions,
    tree)."""
    pad = rows - tokens.shape[1]
    tokens = jnp.concatenate([tokens, jnp.repeat(tokens[:, -1:], pad, axis=1)], axis=1)
    after = positions[:, -1:] + 1 + jnp.arange(pad, dtype=positions.dtype)           # [B, pad]
    positions = jnp.concatenate([positions, after], axis=1)
    if tree is not None:
        n = tree.ancestors.shape[-1]
        grown = max(n, tree.first + rows)
        edge = [(0, 0)] * (tree.ancestors.ndim - 2) + [(0, grown - n), (0, grown - n)]
        new_node = jnp.arange(grown) >= n                                          # [grown]
        ancestors = jnp.pad(tree.ancestors, edge) | (new_node & jnp.eye(grown, dtype=bool))
        tree = dataclasses.replace(tree, ancestors=ancestors)
    return tokens, positions, tree


def decoder_layers(layers: dict, config: ModelConfig, x: jax.Array, positions: jax.Array,
                   cache: KVCache | None = None, tree: TreeAttention | None = None,
                   attn_input: jax.Array | None = None,
                   prefill: bool = False) -> tuple[jax.Array, KVCache | None]:
    """The decoder layers (`layers`, stacked as `params["layers"]`) on input vectors x [B, T, D]
    (embeddings, for the model itself; an EAGLE drafter feeds its fused features,
    `specjax.heads.eagle`): the residual stream after the last layer, before the final norm, and
    the cache. Arguments as in `forward`; `attn_input` [B, T, E], if given, is what the layer's
    attention reads instead of its normed residual, for a one-layer stack (EAGLE drafters: the
    fused features without a norm, or EAGLE-3's [norm(embedding) ; norm(feature)], E = 2D);
    `prefill` as in `hidden_states`."""
    x, _, cache = _layers(layers, config, x, positions.astype(jnp.int32), cache, tree,
                          attn_input, prefill=prefill)
    return x, cache


# Layers per iteration of the scan: two halve the loop's own cost per layer (its bookkeeping
# between bodies) for a second copy of the body to compile (bench/compile-once-per-layer/).
UNROLL = 2


def _layers(layers: dict, config: ModelConfig, x, positions, cache, tree, attn_input=None,
            taps: tuple[int, ...] = (), prefill: bool = False):
    """The decoder layers as one compiled body in a `lax.scan` over L -> (the residual stream
    after the last layer, the stream after the first n layers for each n in `taps` [n_taps, B,
    T, D], the cache).

    The scan's slices of the weights are what XLA's products read; the kernels read the stacked
    weights (`flat`, closed over) at the layer's index instead, in place (`linear`'s `stacked`),
    and the layer's part of the stacked cache, carried by the scan, is written and read in place
    by its index too (`cache.write`, `layers.attend_cache`). `prefill`: as in
    `hidden_states`."""
    slots = positions if tree is None else tree.slots(x.shape[1])         # [B, T]
    rope = (rope_tables(positions, jnp.asarray(rope_frequencies(config)),
                        kernels=config.kernels) if config.arch == "llama" else None)
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

        def product(h, name):                  # BTI,OI->BTO with layer `index` of `name`
            return linear(h, p[name], stacked=(flat[name], index), prefill=prefill,
                          kernels=config.kernels)
        x, buffers = _layer(config, p, product, index, x, slots, rope, buffers, first, tree,
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


def _layer(config: ModelConfig, p: dict, product, index, x, slots, rope, buffers, first,
           tree, attn_input):
    """Decoder layer `index` ([] int32): p its weights (the scan's slices), product(h, name)
    h's product with its matrix `name` (`_layers`) -> (the residual stream after it, the cache
    buffers)."""
    h = attn_input if attn_input is not None else _norm(config, p["attn_norm"], x)
    b, t = x.shape[:2]
    q, k, v = (product(h, name).reshape(b, t, -1, config.head_dim)
               for name in ("wq", "wk", "wv"))                           # [B, T, heads, H]
    if config.qkv_bias:
        q, k, v = q + p["bq"], k + p["bk"], v + p["bv"]
    if config.qk_norm:                          # Qwen3: each head's q and k, over H
        q = rms_norm(q, p["q_norm"]["scale"], config.norm_eps, unfused_products=xla_law(config))
        k = rms_norm(k, p["k_norm"]["scale"], config.norm_eps, unfused_products=xla_law(config))
    if config.arch == "llama":
        q, k = apply_rope(q, k, rope, kernels=config.kernels, unfused_products=xla_law(config))
    if buffers is None:
        keys, values = jnp.transpose(k, (0, 2, 3, 1)), jnp.transpose(v, (0, 2, 1, 3))
        attn = attend(q, keys, values, kv.attention_mask(slots, slots, tree))  # [B, T, N, H]
    else:
        buffers = kv.write(*buffers, k, v, slots, index)
        attn = attend_cache(q, *buffers, slots, tree, first, index,
                            kernels=config.kernels,
                            by_branch=xla_law(config))                 # [B, T, N, H]
    # One flat product over (N, H): as a two-axis einsum, XLA on a CPU copied wo every call.
    out = product(attn.reshape(b, t, -1), "wo")                        # BT(NH),D(NH)->BTD
    if config.out_bias:
        out = out + p["bo"]
    x = x + out
    return x + _mlp(config, p, product, _norm(config, p["mlp_norm"], x)), buffers


def final_norm(params: Params, config: ModelConfig, x: jax.Array) -> jax.Array:
    """The model's final norm on residual vectors [..., D]."""
    return _norm(config, params["final_norm"], x)


def lm_head(params: Params, config: ModelConfig, x: jax.Array) -> jax.Array:
    """Hidden states [B, T, D] -> logits [B, T, V] in float32 (at `config.law_width` rows a
    product where the config has one, `tapped_states`)."""
    head = params["embed"] if config.tie_embeddings else params["lm_head"]        # [V, D]
    width, t = config.law_width or 1, x.shape[1]
    if width == 1:
        return linear(x, head, out_dtype=jnp.float32, kernels=config.kernels)   # BTD,VD->BTV
    # At the one law's width, as the layers were: W rows a product, the last W padded.
    rows = -(-t // width) * width
    x = jnp.concatenate([x, jnp.zeros((x.shape[0], rows - t, x.shape[2]), x.dtype)], axis=1)
    return jnp.concatenate([linear(x[:, i:i + width], head, out_dtype=jnp.float32,
                                   kernels=config.kernels)
                            for i in range(0, rows, width)], axis=1)[:, :t]


def _norm(config: ModelConfig, p, x):
    if config.arch == "gpt2":
        return layer_norm(x, p["scale"], p["bias"], config.norm_eps,
                          unfused_products=xla_law(config))
    return rms_norm(x, p["scale"], config.norm_eps, unfused_products=xla_law(config))


def _mlp(config: ModelConfig, p, product, x):
    if config.arch == "gpt2":
        h = product(x, "w_in")                                          # BTD,FD->BTF
        if config.mlp_bias:
            h = h + p["b_in"]
        out = product(activation(config.activation, h, unfused_products=xla_law(config)),
                      "w_out")                                          # BTF,DF->BTD
        return out + p["b_out"] if config.mlp_bias else out
    gate, up = product(x, "w_gate"), product(x, "w_up")                  # BTD,FD->BTF each
    if config.mlp_bias:
        gate, up = gate + p["b_gate"], up + p["b_up"]
    out = product(activation(config.activation, gate) * up, "w_down")  # BTF,DF->BTD
    return out + p["b_down"] if config.mlp_bias else out


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
