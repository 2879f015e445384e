"""N-gram (prompt-lookup) decoding, exact under sampling as well as greedy.

Lookup policy (per row, on the whole sequence so far, prompt and generated tokens alike): for
n = max_n, max_n - 1, .., min_n, take the row's last n tokens and search for their most recent
earlier occurrence, one that starts before the suffix itself does. The first n that matches
wins, and the draft is the (up to) K tokens that followed that occurrence. A row with no match,
or one shorter than n + 1 tokens, drafts nothing at that step and the target emits one token.

Verification is the same `rejection.verify` as speculative sampling: a lookup is a
deterministic draft, that is a one-hot draft distribution p. Token x is then accepted with
probability q(x), and after a rejection the next token comes from q with x removed and the rest
renormalised. So the output is distributed exactly as the target's, at any temperature; at
temperature 0 it is the target's greedy output. (The reference implementations of prompt
lookup are greedy-only.) Positions past a row's lookup get p = 0 and are never accepted, so the
token after the last real draft is drawn from q itself.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from specjax.decoding.speculative import score_and_verify
from specjax.decoding.state import DecodeState, append, count_call, step_keys


def lookup(tokens, length, k: int, max_n: int, min_n: int):
    """Draft tokens for one row by prompt lookup.

    Args:
      tokens: [M] the row's token buffer; only tokens[:length] are real.
      length: [] the row's length.
    Returns:
      draft [K] int32 (garbage past `count`) and count [] int32 in 0..K.
    """
    m = tokens.shape[0]
    starts = jnp.arange(m, dtype=jnp.int32)
    found = jnp.zeros((), bool)
    continuation = jnp.zeros((), jnp.int32)
    for n in range(max_n, min_n - 1, -1):        # longest n-gram first
        suffix = lax.dynamic_slice(tokens, (jnp.maximum(length - n, 0),), (n,))
        match = jnp.ones((m,), bool)
        for i in range(n):                          # match[j]: tokens[j:j+n] == suffix
            match = match & (jnp.roll(tokens, -i) == suffix[i])
        # Strictly earlier than the suffix (j < length - n), so at least one token follows.
        match = match & (starts < length - n)
        hit = match.any() & ~found
        latest = m - 1 - jnp.argmax(match[::-1])    # the most recent occurrence
        continuation = jnp.where(hit, latest + n, continuation)
        found = found | hit
    count = jnp.where(found, jnp.minimum(k, length - continuation), 0)
    return lax.dynamic_slice(tokens, (continuation,), (k,)), count.astype(jnp.int32)


def step(spec, params, state: DecodeState) -> DecodeState:
    k, vocab = spec.k, spec.vocab_size
    draft_tokens, count = jax.vmap(lookup, in_axes=(0, 0, None, None, None))(
        state.tokens, state.length, k, spec.max_ngram, spec.min_ngram)          # [B, K], [B]
    drafted = jnp.arange(k) < count[:, None]                                     # [B, K]
    draft_probs = jax.nn.one_hot(draft_tokens, vocab) * drafted[..., None]       # [B, K, V]
    new, n_accepted, cache, nan = score_and_verify(spec, params, state, draft_tokens, draft_probs,
                                                   step_keys(state), num_drafted=count)
    state = count_call(state, drafted=count, accepted=n_accepted, nan=nan)
    state = append(state, new, n_accepted + 1, spec.max_new_tokens, spec.eos_ids)
    return state.replace(target_cache=cache.with_length(state.length - 1))
