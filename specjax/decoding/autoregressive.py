"""Autoregressive sampling: one target call per token. The reference the other methods equal."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.cache import KVCache
from specjax.decoding.state import DecodeState, any_nan, append, count_call, last_tokens, step_keys
from specjax.logits import probs_from_logits, sample
from specjax.model import forward


def prefill(params, config, prompts, prompt_length, slots: int) -> KVCache:
    """Runs the padded prompts [B, P] through a fresh cache.

    The cache is left holding every position before each row's last prompt token: the first
    decoding step feeds that token again (one position of repeated work, in exchange for one
    code path for every prompt length, including 1).
    """
    b, p = prompts.shape
    positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p))
    _, cache = forward(params, config, prompts, positions, KVCache.init(config, b, slots))
    return cache.with_length(prompt_length - 1)


def step(spec, params, state: DecodeState) -> DecodeState:
    """Feeds each row's last token, samples the next one from the target."""
    token, position = last_tokens(state, 1)                            # [B, 1]
    logits, cache = forward(params.target, spec.target_config, token, position, state.target_cache)
    probs = probs_from_logits(logits[:, 0], spec.sampling)              # [B, V]
    next_token = jax.vmap(sample)(step_keys(state), probs)              # [B]
    state = count_call(state, nan=any_nan(logits)).replace(target_cache=cache)
    state = append(state, next_token[:, None], jnp.ones_like(state.length), spec.max_new_tokens,
                   spec.eos_ids)
    return state.replace(target_cache=cache.with_length(state.length - 1))
