"""DFlash drafters (arXiv 2602.06036; z-lab/dflash): a block drafter that proposes a whole block
of tokens in one call.

The drafter is a small stack of Qwen3-style decoder layers beside a frozen target. It reads two
things:

- the context: the target's residual streams after the layers `taps` names (the published
  `dflash_config.target_layer_ids`, each + 1: hidden state id + 1 is the output of layer id),
  concatenated and reduced once by `fc` (no bias) and `hidden_norm`. Every draft layer projects
  these fused features to its keys and values (with its k_norm and RoPE at their positions, but
  no input norm), so the context is the drafter's KV cache, written once per position;
- the block: the row's last committed token followed by `block_size - 1` copies of
  `mask_token_id`, embedded by the target's embeddings (times `input_embedding_scale`). The
  block's states run through the layers as usual (input norm, q/k/v with q_norm / k_norm,
  RoPE at their positions, o, MLP); their keys and values sit after the context's.

Attention: every block query reads the whole context and every position of the block, before
and after itself (not causal), unless the config says `causal`. The final norm, then the
target's LM head (times `output_multiplier`, soft-capped by `final_logit_softcapping` if set),
gives block position j's logits for the token at position j itself: the draft for the j-th
masked slot. One call gives all `block_size - 1` drafts, independently given the past; the
target verifies them as a chain (`specjax.decoding.dflash`).

Written from the published description and the reference forward (z-lab/dflash,
`dflash/model.py`); checkpoints in that layout are read and written by `specjax.io.dflash`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specjax.heads.shared import in_dtype, target_identity
from specjax.model import cache as kv
from specjax.model.cache import KVCache
from specjax.model.config import ModelConfig
from specjax.model.layers import (activation, apply_rope, attend, attend_cache, lookup, rms_norm,
                                  rope_frequencies, rope_tables, rotate)
from specjax.model.linear import linear
from specjax.model.params import init_params, layer_shapes, unstack_layers
from specjax.model.transformer import Model, lm_head

__all__ = ["MODEL_TYPE", "BlockDrafter", "DFlashConfig", "blocks_states", "context_kv",
           "default_taps", "draft_block", "draft_logits", "init_block_drafter", "param_shapes",
           "runtime_weights", "with_dtype"]

MODEL_TYPE = "dflash"


def default_taps(target_layers: int, draft_layers: int) -> tuple[int, ...]:
    """The published default of `target_layer_ids` (z-lab/dflash's `build_target_layer_ids`)
    as layer counts: the middle layer for one draft layer, else draft_layers ids spread evenly
    from 1 to target_layers - 3, rounded; + 1 each."""
    if draft_layers == 1:
        ids = [target_layers // 2]
    else:
        start, end = 1, target_layers - 3
        ids = [int(round(start + i * (end - start) / (draft_layers - 1)))
               for i in range(draft_layers)]
    return tuple(i + 1 for i in ids)


@dataclasses.dataclass(frozen=True)
class DFlashConfig:
    """The static shape of a block drafter (hashable: part of the compiled spec)."""
    layer: ModelConfig          # its decoder layers: a Qwen3-shaped config (L its layer count,
    #                             D the target's width, V the target's vocabulary)
    block_size: int             # the block: the last token and block_size - 1 drafts
    mask_token_id: int          # the token the masked slots are embedded as
    taps: tuple[int, ...]       # the target's layer counts whose outputs it reads (ids + 1)
    target_layers: int = 0      # the target's depth it was made for (0: not recorded)
    causal: bool = False        # attention inside the block causal (the published default: not)
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None

    def __post_init__(self):
        if self.layer.arch != "llama":
            raise ValueError(f"DFlash draft layers are Llama/Qwen3 layers, not "
                             f"{self.layer.arch!r}")
        b = self.block_size
        if isinstance(b, bool) or not isinstance(b, int) or b < 2:
            raise ValueError(f"block_size must be an integer >= 2, got {b!r}")
        m = self.mask_token_id
        if isinstance(m, bool) or not isinstance(m, int) or not 0 <= m < self.layer.vocab_size:
            raise ValueError(f"mask_token_id must be a token id in [0, "
                             f"{self.layer.vocab_size}), got {m!r}")
        t = self.taps
        if not isinstance(t, tuple) or not t or any(
                isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in t):
            raise ValueError(f"taps must be a non-empty tuple of layer counts >= 1, got {t!r}")
        for name in ("input_embedding_scale", "output_multiplier"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or \
                    not np.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        cap = self.final_logit_softcapping
        if cap is not None and (not isinstance(cap, (int, float)) or isinstance(cap, bool)
                                or not np.isfinite(cap) or cap <= 0):
            raise ValueError(f"final_logit_softcapping must be a positive number or null, "
                             f"got {cap!r}")

    @property
    def hidden_size(self) -> int:
        return self.layer.d_model

    @property
    def drafts(self) -> int:
        """Tokens drafted per call: block_size - 1."""
        return self.block_size - 1

    @property
    def target_layer_ids(self) -> list[int]:
        """The published field: the target layers whose outputs it reads (taps - 1)."""
        return [n - 1 for n in self.taps]


@dataclasses.dataclass(frozen=True)
class BlockDrafter:
    """What `specjax.load` returns for a DFlash directory."""
    config: DFlashConfig
    params: dict                 # "fc" [D, n D], "hidden_norm" {"scale"}, "layers" [L dicts, the
    #                              model's names, with q_norm / k_norm], "final_norm" {"scale"}
    target: dict | None = None   # the identity of the target it was trained on, when known
    path: Path | None = None
    extra: dict = dataclasses.field(default_factory=dict)   # config.json fields kept as read

    @property
    def name(self) -> str:
        return self.path.name if self.path else "random-dflash-drafter"


def param_shapes(config: DFlashConfig, target_width: int | None = None) -> dict:
    """The shape of every parameter of a drafter of `config`."""
    d = config.hidden_size
    # A list of its layers' trees, run one by one (`draft_block`): a drafter has a few.
    layers = [layer_shapes(config.layer)["layer"]] * config.layer.n_layers
    return {"fc": (d, len(config.taps) * (target_width or d)), "hidden_norm": {"scale": (d,)},
            "layers": layers, "final_norm": {"scale": (d,)}}


def init_block_drafter(target: Model, layers: int = 1, block_size: int = 8,
                       mask_token_id: int | None = None, taps: tuple[int, ...] | None = None,
                       seed: int = 0, std: float = 0.02) -> BlockDrafter:
    """A new drafter for `target`: `layers` Qwen3-shaped layers of the target's width and
    heads, normal(0, std) matrices, unit norms; taps default as the published code's
    (`default_taps`); the mask token defaults to the target's last id."""
    t = target.config
    if t.arch != "llama":
        raise ValueError(f"DFlash drafters serve Llama-family targets, not {t.arch!r}")
    layer = dataclasses.replace(t, n_layers=layers, dtype="float32", qk_norm=True,
                                model_type="qwen3", bos_token_id=None, eos_token_ids=())
    if taps is None:
        taps = default_taps(t.n_layers, layers)
        if len(set(taps)) != len(taps) or not 1 <= min(taps) <= max(taps) <= t.n_layers:
            raise ValueError(f"a {t.n_layers}-layer target has no default taps for {layers} "
                             f"draft layers (the published rule gives {list(taps)}); name them")
    taps = tuple(taps)
    config = DFlashConfig(layer, block_size,
                          t.vocab_size - 1 if mask_token_id is None else mask_token_id,
                          taps, t.n_layers)
    key_fc, key_layers = jax.random.split(jax.random.key(seed))
    base = init_params(layer, key_layers, std=std)
    d = t.d_model
    n = len(taps)
    params = {"fc": jnp.tile(jnp.eye(d), (1, n)) / n
              + std * jax.random.normal(key_fc, (d, n * d)),
              "hidden_norm": {"scale": jnp.ones((d,))}, "layers": unstack_layers(base["layers"]),
              "final_norm": base["final_norm"]}
    return BlockDrafter(config, params, target_identity(target, np.arange(t.vocab_size)))


def with_dtype(drafter: BlockDrafter, dtype: str) -> BlockDrafter:
    """`drafter` running in `dtype` (the target's, by default: `decoding` picks it)."""
    if drafter.config.layer.dtype == dtype:
        return drafter
    layer = drafter.config.layer.replace(dtype=dtype)
    return dataclasses.replace(drafter, config=dataclasses.replace(drafter.config, layer=layer),
                               params=in_dtype(drafter.params, dtype))


def runtime_weights(drafter: BlockDrafter) -> dict:
    """What the compiled step reads: the drafter's weights (the target's embeddings and LM
    head are read from the target's own weights)."""
    return dict(drafter.params)


def _project(x, w, kernels, prefill: bool = False):
    """x [B, T, D] through w [heads, H, D] -> [B, T, heads, H]."""
    heads, h, d = w.shape
    y = linear(x, w.reshape(heads * h, d), prefill=prefill, kernels=kernels)
    return y.reshape(*x.shape[:2], heads, h)


def fuse_context(weights: dict, config: DFlashConfig, features: jax.Array,
                 prefill: bool = False) -> jax.Array:
    """The target's tapped states [B, T, n D] -> the fused context [B, T, D]:
    hidden_norm(fc(features))."""
    dtype = config.layer.compute_dtype
    fused = linear(features.astype(dtype), weights["fc"], prefill=prefill,
                   kernels=config.layer.kernels)                              # BTE,DE->BTD
    return rms_norm(fused, weights["hidden_norm"]["scale"], config.layer.norm_eps)


def _context_kv(p: dict, config: DFlashConfig, context: jax.Array, tables: jax.Array,
                prefill: bool = False):
    """One layer's keys and values of the fused context [B, T, D]: k_proj, its k_norm and
    RoPE; v_proj. No input norm: the context is already normed."""
    c = config.layer
    k, v = (_project(context, p[name], c.kernels, prefill)
            for name in ("wk", "wv"))                                            # [B, T, K, H]
    if c.qkv_bias:
        k, v = k + p["bk"], v + p["bv"]
    return rotate(rms_norm(k, p["k_norm"]["scale"], c.norm_eps), tables), v


def context_kv(weights: dict, config: DFlashConfig, features: jax.Array, slots: jax.Array,
               cache: KVCache, prefill: bool = False) -> KVCache:
    """Writes the context's keys and values for the target's tapped states [B, T, n D] at
    positions (= slots) [B, T], consecutive per row, into every layer of the drafter's cache:
    what the prefill does for the prompt (`prefill`: a prompt's, as in
    `transformer.hidden_states`)."""
    context = fuse_context(weights, config, features, prefill)
    tables = rope_tables(slots, jnp.asarray(rope_frequencies(config.layer)),
                         kernels=config.layer.kernels)
    keys, values = cache.k, cache.v
    for i, p in enumerate(weights["layers"]):
        k, v = _context_kv(p, config, context, tables, prefill)
        keys, values = kv.write(keys, values, k, v, slots, i)
    return KVCache(keys, values, cache.length, cache.first)


def _block_layer(p: dict, c: ModelConfig, x: jax.Array, tables: jax.Array, attention):
    """One draft layer on the block's states x [B, T, D]: the input norm, q/k/v with q_norm and
    k_norm, RoPE by `tables`, `attention(q, k, v)` -> [B, T, N, H] (which reads the context
    and the block's keys and values as its caller arranges them), o, and the MLP."""
    eps = c.norm_eps
    h = rms_norm(x, p["attn_norm"]["scale"], eps)
    q, k, v = (_project(h, p[name], c.kernels) for name in ("wq", "wk", "wv"))
    if c.qkv_bias:
        q, k, v = q + p["bq"], k + p["bk"], v + p["bv"]
    q = rms_norm(q, p["q_norm"]["scale"], eps)
    k = rms_norm(k, p["k_norm"]["scale"], eps)
    q, k = apply_rope(q, k, tables, kernels=c.kernels)
    attn = attention(q, k, v)                                                   # [B, T, N, H]
    b, t, n, h_ = attn.shape
    out = linear(attn.reshape(b, t, n * h_), p["wo"].reshape(-1, n * h_), kernels=c.kernels)
    if c.out_bias:
        out = out + p["bo"]
    x = x + out
    m = rms_norm(x, p["mlp_norm"]["scale"], eps)
    gate, up = (linear(m, p[name], kernels=c.kernels) for name in ("w_gate", "w_up"))
    if c.mlp_bias:
        gate, up = gate + p["b_gate"], up + p["b_up"]
    down = linear(activation(c.activation, gate) * up, p["w_down"], kernels=c.kernels)
    return x + (down + p["b_down"] if c.mlp_bias else down)


def draft_block(weights: dict, config: DFlashConfig, embed: jax.Array, features: jax.Array,
                context_slots: jax.Array, block: jax.Array, block_slots: jax.Array,
                cache: KVCache) -> tuple[jax.Array, KVCache]:
    """One drafter call: the context not yet read and the block.

    Args:
      weights: `runtime_weights`; embed: the target's embeddings [V, D].
      features: [B, W, n D] the target's tapped states at `context_slots` [B, W] (consecutive
        per row); entries past a row's real context are stale, and the block's slots must cover
        them (they are written first, then overwritten by the block's).
      block: [B, T] the last committed token, then mask tokens, at `block_slots` [B, T]
        (consecutive, positions = slots).
      cache: the drafter's: slot s holds the context's keys and values at position s.
    Returns:
      the block's final-normed states [B, T, D] (`draft_logits` reads them) and the cache.
    """
    c = config.layer
    eps = c.norm_eps
    dtype = c.compute_dtype
    inv_freq = jnp.asarray(rope_frequencies(c))
    context = fuse_context(weights, config, features)
    context_tables = rope_tables(context_slots, inv_freq, kernels=c.kernels)
    block_tables = rope_tables(block_slots, inv_freq, kernels=c.kernels)
    x = lookup(embed, block).astype(dtype)
    if config.input_embedding_scale != 1.0:
        x = x * jnp.asarray(config.input_embedding_scale, dtype)
    # Every query reads up to the block's last slot, unless the block is causal.
    queries = block_slots if config.causal else jnp.broadcast_to(block_slots[:, -1:],
                                                                  block_slots.shape)
    buffers = [cache.k, cache.v]
    for i, p in enumerate(weights["layers"]):
        k_context, v_context = _context_kv(p, config, context, context_tables)
        buffers[:] = kv.write(*buffers, k_context, v_context, context_slots, i)

        def attention(q, k, v, i=i):          # the block after them
            buffers[:] = kv.write(*buffers, k, v, block_slots, i)
            return attend_cache(q, *buffers, queries, None, cache.first, i, kernels=c.kernels)
        x = _block_layer(p, c, x, block_tables, attention)
    x = rms_norm(x, weights["final_norm"]["scale"], eps)
    return x, KVCache(*buffers, cache.length, cache.first)


def draft_logits(config: DFlashConfig, target_params: dict, target_config: ModelConfig,
                 states: jax.Array) -> jax.Array:
    """The block's states [..., T, D] -> logits [..., T, V] float32 through the target's LM
    head, times `output_multiplier`, soft-capped (cap * tanh(logits / cap)) if the config
    says so."""
    logits = lm_head(target_params, target_config, states)
    if config.output_multiplier != 1.0:
        logits = logits * jnp.float32(config.output_multiplier)
    cap = config.final_logit_softcapping
    if cap is not None:
        logits = jnp.float32(cap) * jnp.tanh(logits / jnp.float32(cap))
    return logits


def blocks_states(weights: dict, config: DFlashConfig, embed: jax.Array, features: jax.Array,
                  tokens: jax.Array, anchors: jax.Array) -> jax.Array:
    """Many blocks of one sequence batch at once, teacher-forced, without a cache: what
    training reads.

    Block a of row b starts at position anchors[b, a] with the token there, then mask tokens;
    it reads the context at every position before its anchor (the target's tapped states
    `features` [B, T, n D], fused) and its own block, as a decoding step's block does
    (`draft_block`), and no other block. Returns the blocks' final-normed states
    [B, A, block_size, D].
    """
    c = config.layer
    eps, dtype = c.norm_eps, c.compute_dtype
    b, t = tokens.shape
    a, size = anchors.shape[1], config.block_size
    inv_freq = jnp.asarray(rope_frequencies(c))
    context = fuse_context(weights, config, features)                          # [B, T, D]
    ctx_positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    ctx_tables = rope_tables(ctx_positions, inv_freq, kernels=c.kernels)
    positions = (anchors[:, :, None] + jnp.arange(size, dtype=jnp.int32)).reshape(b, a * size)
    tables = rope_tables(positions, inv_freq, kernels=c.kernels)
    block = jnp.full((b, a, size), config.mask_token_id, jnp.int32)
    block = block.at[:, :, 0].set(jnp.take_along_axis(tokens, anchors, axis=1))
    x = lookup(embed, block.reshape(b, a * size)).astype(dtype)
    if config.input_embedding_scale != 1.0:
        x = x * jnp.asarray(config.input_embedding_scale, dtype)
    # Query (a, j) reads the context before anchor a, and every position of block a (its own
    # positions up to its own, if the block is causal).
    query_block = jnp.repeat(jnp.arange(a), size)                               # [A*S]
    query_index = jnp.tile(jnp.arange(size), a)
    sees_context = jnp.arange(t)[None, None, :] < jnp.repeat(anchors, size, axis=1)[:, :, None]
    same = query_block[:, None] == query_block[None, :]
    if config.causal:
        same = same & (query_index[None, :] <= query_index[:, None])
    mask = jnp.concatenate([sees_context, jnp.broadcast_to(same, (b, a * size, a * size))],
                           axis=2)                                                # [B, AS, T+AS]
    # A query with no context (an anchor at 0) still sees its block: no row is empty.
    for p in weights["layers"]:
        k_context, v_context = _context_kv(p, config, context, ctx_tables)

        def attention(q, k, v, k_context=k_context, v_context=v_context):
            keys = jnp.concatenate([k_context, k], axis=1)                        # [B, S, K, H]
            values = jnp.concatenate([v_context, v], axis=1)
            return attend(q, jnp.transpose(keys, (0, 2, 3, 1)),
                          jnp.transpose(values, (0, 2, 1, 3)), mask)
        x = _block_layer(p, c, x, tables, attention)
    x = rms_norm(x, weights["final_norm"]["scale"], eps)
    return x.reshape(b, a, size, -1)
