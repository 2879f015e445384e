"""Autoregressive sampling: one target call per token. The reference the other methods equal."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp

from specjax.decoding.config import MethodSpec
from specjax.decoding.extras import any_nan, target_probs
from specjax.decoding.prefill import prefill
from specjax.decoding.state import DecodeState, commit, last_tokens, position_keys
from specjax.model.transformer import forward
from specjax.sampling.logits import sample_rows


@dataclasses.dataclass(frozen=True, kw_only=True)
class AutoregressiveSpec(MethodSpec):
    """Plain decoding has nothing static of its own."""
    name: ClassVar[str] = "autoregressive"


def init(spec, weights, prompts, prompt_length):
    """Prefill: the target reads the prompts [B, P]. Returns its cache and no carry (nothing
    but the shared state goes from one step to the next)."""
    return prefill(weights.target, spec.target_config, prompts, prompt_length,
                   spec.buffer_length, shards=spec.data_shards).cache, None


def layout(spec, rows, cache) -> None:
    """The carry's layout on a device mesh (`decoding.sharding`): there is none."""
    return None


def step(spec, weights, state: DecodeState) -> DecodeState:
    """Feeds each row's last token, samples the next one from the target with the key of its
    position (`state.position_keys`): the draw every method's coupled rule reproduces."""
    token, position = last_tokens(state, 1)                            # [B, 1]
    logits, cache = forward(weights.target, spec.target_config, token, position, state.target_cache)
    probs, scores = target_probs(spec, state, logits)                  # [B, 1, V] each
    next_token = sample_rows(position_keys(state, 1)[:, 0], probs[:, 0])   # [B]
    return commit(spec, state, next_token[:, None], jnp.zeros_like(state.length), cache,
                  nan=any_nan(logits), scores=scores)
