"""A drafter's teacher-forced predictions: what training, evaluation and the parity tests read.

`drafter_log_probs(target, drafter, tokens)` runs the target over a sequence, hands its
features (EAGLE-1's final-normed states, EAGLE-3's taps) to the drafter pair by pair, exactly as
decoding does after a prefill, and returns the drafter's log-probabilities of each next token.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax.api.checks import GenerationError, check_taps, check_trained_on
from specjax.api.forward import kernels_of
from specjax.api.methods import Eagle
from specjax.decoding.loop import with_kernels
from specjax.heads import eagle
from specjax.model.cache import KVCache
from specjax.model.transformer import Model, hidden_states, tapped_states

__all__ = ["drafter_log_probs"]


def drafter_log_probs(target: Model, drafter: eagle.Drafter, tokens) -> jax.Array:
    """The drafter's teacher-forced next-token log-probabilities at every position.

    Pair s is (f_{s-1}, x_s): the target's feature at s - 1 (zeros for s = 0) and token s, in
    the drafter's slot s, attending to the pairs before it as in decoding (published drafters
    read slot 0 only from itself: `KVCache.first`). Its output predicts x_{s+1}.

    Args:
      target: the model the drafter serves. drafter: an EAGLE drafter from `specjax.load`.
      tokens: [B, T] token ids (a list of equal-length lists, or an array).
    Returns:
      [B, T, V] float32: entry [b, s] is the log-probability of each token id as x_{s+1};
      -inf for ids the drafter cannot propose (outside its subset or draft vocabulary).
    """
    Eagle(drafter)                     # an EAGLE drafter, as the method takes it
    check_trained_on(drafter, target)
    check_taps(drafter, target)
    drafter = eagle.resolve_taps(drafter, target.config)
    tokens = np.asarray(tokens)
    if tokens.ndim != 2 or tokens.shape[1] < 1 or tokens.dtype.kind not in "iu":
        raise GenerationError(f"tokens must be a [B, T] array of token ids, got shape "
                              f"{tokens.shape} of {tokens.dtype}")
    if tokens.min() < 0 or tokens.max() >= target.config.vocab_size:
        raise GenerationError(f"tokens must be ids in [0, {target.config.vocab_size})")
    # The kernels as decoding uses them, named by both static configs (`ModelConfig.kernels`).
    kernels = kernels_of()
    return _log_probs(with_kernels(drafter.config, kernels),
                      with_kernels(target.config, kernels),
                      eagle.runtime_weights(drafter, target), target.params,
                      jnp.asarray(tokens, jnp.int32))


@functools.partial(jax.jit, static_argnums=(0, 1))
def _log_probs(config, target_config, weights, target_params, tokens):
    b, t = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    if config.taps:     # the tapped states (not the final-normed ones; no cache)
        features = tapped_states(target_params, target_config, tokens, positions,
                                 taps=config.taps)[1]
    else:
        features = hidden_states(target_params, target_config, tokens, positions)[0]
    features = eagle.from_target(weights, config, features)                    # [B, T, D]
    shifted = jnp.concatenate([jnp.zeros_like(features[:, :1]), features[:, :-1]], axis=1)
    cache = KVCache.init(config.layer, b, t, first=config.first_slot)
    out = eagle.draft_features(weights, config, eagle.embedding(weights, target_params),
                               shifted, tokens, positions, cache)[0]            # not the cache
    logits = eagle.full_logits(weights, eagle.draft_logits(weights, config, out),
                               target_config.vocab_size)
    return jax.nn.log_softmax(logits, axis=-1)
