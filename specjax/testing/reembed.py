"""A pair's models at a larger head size with the same logits, for engines that refuse the pairs'
head size of 8 (vLLM's CPU attention takes 32 and up).

    wide_heads = reembedded(testing.pair("close"), head_dim=32)

Why the logits are the same. Half-split RoPE (`model.layers.apply_rope`, the Hugging Face Llama
layout) rotates the pair (i, i + H/2) of a head of size H by the angle position * theta^(-2i/H).
Put a head of size h into one of size H = f h with component j of each half at slot f j of the
same half: slot f j turns at theta^(-2 f j / (f h)) = theta^(-2j / h), the frequency component j
had, and the rational 2j / h is the same float in both (float32 division rounds it once), so each
nonzero pair turns by the same angle; the other slots are zero in q and k, stay zero under any
rotation and add nothing to q . k. The attention divides q . k by sqrt(H) instead of sqrt(h):
scaling q by sqrt(f) puts that back, exactly when f is a power of 4 (a power-of-two scale; f = 4
from 8 to 32). The values take the same slots, and the output projection reads them there.
Everything else (norms, MLP, embeddings, the head) is untouched.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from specjax.model.transformer import Model
from specjax.testing.law import Pair

__all__ = ["reembedded", "reembedded_model"]


def reembedded(pair: Pair, head_dim: int = 32) -> Pair:
    """`pair` with its target and draft at head size `head_dim` (a multiple of theirs by a
    power of 4), their logits unchanged (module docstring); its name and prompt kept."""
    return dataclasses.replace(
        pair, target=reembedded_model(pair.target, head_dim),
        draft=reembedded_model(pair.draft, head_dim),
        about=f"{pair.about} (re-embedded at head size {head_dim})")


def reembedded_model(model: Model, head_dim: int) -> Model:
    """One float32 Llama of `reembedded`, its head size made `head_dim`."""
    config = model.config
    h = config.head_dim
    if config.arch != "llama" or config.qk_norm or config.dtype != "float32":
        raise ValueError("reembedded takes a float32 Llama without q/k norms (an RMSNorm over "
                         "the head would see the new zero slots)")
    factor = head_dim // h if isinstance(head_dim, int) and head_dim % h == 0 else 0
    if factor < 1 or factor & (factor - 1) or (factor.bit_length() - 1) % 2:
        raise ValueError(f"head_dim must be the model's head size {h} times a power of 4 (so "
                         f"that q's scale sqrt(head_dim / {h}) is exact), got {head_dim!r}")
    half = np.arange(h // 2) * factor
    slots = np.concatenate([half, head_dim // 2 + half])                # [h] of [0, head_dim)
    return _spread(model, head_dim, slots, q_scale=np.sqrt(factor))


def _spread(model: Model, head_dim: int, slots: np.ndarray, q_scale: float) -> Model:
    """`model` with each head's component i moved to slot `slots[i]` of a head of `head_dim`,
    zeros elsewhere, and q (weights and bias) times `q_scale`. The test's negative control calls
    it with slots that keep the components together (the wrong frequencies)."""
    layers = dict(model.params["layers"])

    def placed(array, axis, scale=1.0):
        array = np.asarray(array, np.float32)
        shape = list(array.shape)
        shape[axis] = head_dim
        out = np.zeros(shape, np.float32)
        index = [slice(None)] * len(shape)
        index[axis] = slots
        out[tuple(index)] = array * np.float32(scale)
        return out

    # wq [L, N, H, D], wk and wv [L, K, H, D]: H is axis 2; wo [L, D, N, H]: the last.
    layers["wq"] = placed(layers["wq"], 2, q_scale)
    layers["wk"], layers["wv"] = placed(layers["wk"], 2), placed(layers["wv"], 2)
    layers["wo"] = placed(layers["wo"], 3)
    if model.config.qkv_bias:                           # bq [L, N, H], bk and bv [L, K, H]
        layers["bq"] = placed(layers["bq"], 2, q_scale)
        layers["bk"], layers["bv"] = placed(layers["bk"], 2), placed(layers["bv"], 2)
    return Model(model.config.replace(head_dim=head_dim), dict(model.params, layers=layers))
