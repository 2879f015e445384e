"""Speculative sampling with a draft model (Chen et al. 2023, Algorithm 2; Leviathan et al.
2023, Algorithm 1). Letters follow Chen et al.: p is the draft, q the target.

One step, for every row at once:

  1. The draft proposes K tokens x_1..x_K autoregressively, each sampled from its own
     distribution p_i, which is kept.
  2. The target scores the row's last token and x_1..x_K in one call: K + 1 distributions q_i.
  3. `rejection.verify` accepts a prefix of the drafts and samples one more token, from the
     residual at the first rejection or from q_{K+1} when all K were accepted.

Both caches roll back by length. The draft never makes an extra call: when all K drafts were
accepted it has not yet seen x_K, so each step's first draft call feeds the last two tokens of
the row (rewriting one cache slot with the same token when the draft is not behind).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from specjax.decoding.state import DecodeState, any_nan, append, count_call, last_tokens, step_keys
from specjax.logits import probs_from_logits, sample
from specjax.model import forward


def propose(key, logits, sampling):
    """Draws one draft token per row and returns it with the distribution it was drawn from.

    Args:
      key: [B] keys; logits: [B, V]. Returns token [B] int32 and p [B, V] float32.
    """
    p = probs_from_logits(logits, sampling)
    return jax.vmap(sample)(key, p), p


def pad_vocab(logits, vocab: int):
    """Pads [..., V'] logits with -inf up to `vocab`: a token outside a model's vocabulary has
    probability 0 under it. Lets a draft and target whose vocabularies differ only by padding
    share one id space without changing either distribution."""
    extra = vocab - logits.shape[-1]
    if extra == 0:
        return logits
    padding = jnp.full((*logits.shape[:-1], extra), -jnp.inf, logits.dtype)
    return jnp.concatenate([logits, padding], axis=-1)


def draft(spec, params, state: DecodeState, keys):
    """Step 1: K draft tokens [B, K] and their distributions [B, K, V], and the draft's cache."""
    vocab = spec.vocab_size
    # The first call feeds the last two tokens (see the module docstring) and reads the logits
    # of the row's last real position: index 1, or 0 for a row of a single token.
    window, positions = last_tokens(state, 2)
    logits, cache = forward(params.draft, spec.draft_config, window, positions, state.draft_cache)
    last = state.length - 1 - positions[:, 0]
    logits = jnp.take_along_axis(logits, last[:, None, None], axis=1)[:, 0]   # [B, V']

    def draft_one(carry, xs):
        logits, cache = carry                                          # [B, V'], draft cache
        key, offset = xs
        token, p = spec.propose_fn(key, pad_vocab(logits, vocab), spec.sampling)
        # Feed x_i at position length + i to get the logits of p_{i+1}.
        out, cache = forward(params.draft, spec.draft_config, token[:, None],
                             (state.length + offset)[:, None], cache)
        return (out[:, 0], cache), (token, p, any_nan(out))

    # x_1..x_{K-1} each need a draft call to produce the next distribution; x_K does not.
    offsets = jnp.arange(spec.k - 1, dtype=jnp.int32)
    (logits_k, cache), (tokens, probs, nans) = lax.scan(
        draft_one, (logits, cache), (jnp.swapaxes(keys[:, :-1], 0, 1), offsets))
    token_k, p_k = spec.propose_fn(keys[:, -1], pad_vocab(logits_k, vocab), spec.sampling)
    tokens = jnp.concatenate([jnp.swapaxes(tokens, 0, 1), token_k[:, None]], axis=1)  # [B, K]
    probs = jnp.concatenate([jnp.swapaxes(probs, 0, 1), p_k[:, None]], axis=1)        # [B, K, V]
    return tokens, probs, cache, any_nan(logits) | nans.any()


def score_and_verify(spec, params, state: DecodeState, draft_tokens, draft_probs, keys,
                     num_drafted=None):
    """Steps 2 and 3, shared with n-gram decoding.

    The target scores [last token, x_1..x_K] at positions length-1 .. length-1+K in one call,
    then `verify` accepts a prefix and draws one more token.

    Returns:
      new tokens [B, K + 1] (the accepted drafts, then the residual or bonus token; the rest is
      padding), n_accepted [B], the target's cache, and whether its logits had a NaN.
    """
    k = draft_tokens.shape[1]
    last, last_position = last_tokens(state, 1)
    target_in = jnp.concatenate([last, draft_tokens], axis=1)          # [B, K + 1]
    positions = last_position + jnp.arange(k + 1, dtype=jnp.int32)      # [B, K + 1]
    logits, cache = forward(params.target, spec.target_config, target_in, positions,
                            state.target_cache)
    target_probs = probs_from_logits(pad_vocab(logits, spec.vocab_size), spec.sampling)
    n_accepted, next_token = spec.verify_fn(draft_tokens, draft_probs, target_probs, keys,
                                            num_drafted=num_drafted)
    new = jnp.concatenate([draft_tokens, jnp.zeros_like(draft_tokens[:, :1])], axis=1)
    new = new.at[jnp.arange(new.shape[0]), n_accepted].set(next_token)
    return new, n_accepted, cache, any_nan(logits)


def step(spec, params, state: DecodeState) -> DecodeState:
    k = spec.k
    keys = step_keys(state)                                            # [B]
    split = jax.vmap(lambda key: jax.random.split(key, k + 1))(keys)   # [B, K + 1]
    draft_keys, verify_keys = split[:, :k], split[:, k]

    # Step 1: draft x_1..x_K ~ p_1..p_K.
    draft_tokens, draft_probs, draft_cache, draft_nan = draft(spec, params, state, draft_keys)
    # Steps 2 and 3: score with the target, accept a prefix, draw the residual or bonus token.
    new, n_accepted, target_cache, target_nan = score_and_verify(
        spec, params, state, draft_tokens, draft_probs, verify_keys)

    old_length = state.length
    state = count_call(state, drafted=k, accepted=n_accepted, draft_calls=k,
                       nan=draft_nan | target_nan)
    state = append(state, new, n_accepted + 1, spec.max_new_tokens, spec.eos_ids)
    # Roll back: the target holds everything before the new last token; the draft has seen the
    # fed tokens up to x_{K-1}, so it may be one behind (the next step catches up).
    return state.replace(target_cache=target_cache.with_length(state.length - 1),
                         draft_cache=draft_cache.with_length(
                             jnp.minimum(state.length - 1, old_length + k - 1)))
