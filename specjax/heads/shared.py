"""What Medusa heads and EAGLE drafters share: the subset projection and the target's identity.

Both propose tokens from S frequency-ranked ids of the target's vocabulary, through the rows of
the target's own LM head for those ids (`projection`): a drafter's logits are E_S z for its own
vector z, and a token outside S has draft probability 0 (`full_logits`), which tree
verification handles exactly. Both are bound to the target they were trained on by its identity
(`target_identity`: architecture fields, a digest of the tokenizer's vocabulary and the mean
absolute value of the projection rows), checked when they meet a target
(`specjax.io.sidecar.check_target`).
"""

from __future__ import annotations

import hashlib
import json

import jax
import jax.numpy as jnp
import numpy as np

from specjax.model.quant import EIGHT_BIT, MATRICES, Int8Weight, as_dtype, convert, rows
from specjax.model.transformer import Model

__all__ = ["DRAFTER_MATRICES", "PROJECTION", "TARGET_FIELDS", "full_logits", "in_dtype",
           "projection", "target_identity", "tokenizer_digest"]

PROJECTION = "target_lm_head_subset"
# Architecture fields of the target that a drafter is bound to.
TARGET_FIELDS = ("arch", "vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads",
                  "head_dim", "d_ff", "tie_embeddings")


def tokenizer_digest(tokenizer) -> str | None:
    """sha256 of the tokenizer's vocabulary (token -> id, added tokens included)."""
    if tokenizer is None:
        return None
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    return hashlib.sha256(json.dumps(vocab, sort_keys=True).encode()).hexdigest()


# The matrices of drafters' weight trees (`runtime_weights`): the model's, and Medusa's block
# and EAGLE's fusion "w", the head's rows "proj", DFlash's fusion "fc".
DRAFTER_MATRICES = (*MATRICES, "w", "proj", "fc")


def projection(target: Model, token_ids, dtype: str | None = None) -> jax.Array:
    """The target's LM-head rows for `token_ids`: [S, D], in `dtype` (default: the target's
    weights' own, float32 for an 8-bit target, its rows dequantised). An 8-bit target's rows
    in "int8" or "q8_0" are its own values and scales, not quantised again."""
    ids = jnp.asarray(token_ids)
    head = target.params["embed" if target.config.tie_embeddings else "lm_head"]
    if dtype in EIGHT_BIT and isinstance(head, Int8Weight):
        return as_dtype(Int8Weight(head.values[ids], head.scales[ids]), dtype)
    picked = rows(head, ids)
    return picked if dtype is None else in_dtype({"proj": picked}, dtype)["proj"]


def in_dtype(weights: dict, dtype: str) -> dict:
    """A drafter's weight tree in `dtype` (`specjax.model.quant.convert`): the target's dtype
    by default, so its products take the same kernels as the target's (`linear`)."""
    return convert(weights, dtype, DRAFTER_MATRICES)


def target_identity(target: Model, token_ids) -> dict:
    return {"name": target.name,
            "config": {f: getattr(target.config, f) for f in TARGET_FIELDS},
            "tokenizer_sha256": tokenizer_digest(target.tokenizer),
            "projection_mean_abs": float(np.mean(np.abs(
                np.asarray(projection(target, token_ids), np.float64))))}


def full_logits(weights: dict, sub_logits: jax.Array, vocab: int) -> jax.Array:
    """Subset logits [..., S] -> logits over the vocabulary [..., V], -inf outside the subset."""
    full = jnp.full((*sub_logits.shape[:-1], vocab), -jnp.inf, jnp.float32)
    return full.at[..., weights["ids"]].set(sub_logits)
