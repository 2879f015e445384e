"""Speculative sampling with a draft model (Chen et al. 2023, Algorithm 2; Leviathan et al.
2023, Algorithm 1), for a chain of K drafted tokens. Letters follow Chen et al.: p is the
draft, q the target (Leviathan et al. swap them).

One step, for every row at once, in Algorithm 2's Steps (docs/walkthrough.md):

  Step 1 (draft): the draft proposes x_1..x_K autoregressively, each sampled from its own
     distribution p_i, which is kept (up to K under a dynamic lookahead schedule: each row may
     stop earlier, `decoding.lookahead`).
  Step 2 (score): the target scores the row's last token and x_1..x_K in one call: K + 1
     distributions q_i.
  Steps 3 and 4 (accept or resample, bonus): `rejection.verify` accepts a prefix of the drafts
     and samples one more token, from the residual at the first rejection or from q_{K+1} when
     all K were accepted.
  Then commit: append what was accepted and roll both caches back by length (`state.commit`).

The draft never makes an extra call: when all K drafts were accepted it has not yet seen x_K,
so each step's first draft call feeds the last two tokens of the row (rewriting one cache slot
with the same token when the draft is not behind).

Beside this file: token trees (`speculative_tree`), rows that draft different numbers of tokens
(`lookahead`), and the verify numbers kept for `specjax.explain` (`trace`).

The same loop for one sequence in plain NumPy, without caches, batches or tracing, is
`specjax.reference.speculative` (`specjax/reference/decoding.py`): read it first.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from specjax.decoding import lookahead, speculative_tree, trace
from specjax.decoding.prefill import prefill
from specjax.decoding.state import (DecodeState, any_nan, chain_drafted, commit, last_tokens,
                                    pad_vocab, steered, step_keys, target_probs)
from specjax.model.cache import KVCache
from specjax.model.transformer import forward
from specjax.sampling.logits import probs_from_logits


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Carry:
    """What speculative decoding carries from step to step (`DecodeState.carry`)."""
    draft_cache: KVCache           # the draft's cache: every position before the row's last
    #                                token, or one fewer (the next step's first call catches up)
    lookahead: jax.Array | None    # [B] the heuristic schedule's draft lengths, else None


def init(spec, weights, prompts, prompt_length):
    """Prefill: both models read the prompts [B, P]. Returns the target's cache and the
    `Carry`."""
    caches = [prefill(model, config, prompts, prompt_length, spec.buffer_length,
                      shards=spec.data_shards).cache
              for model, config in ((weights.target, spec.target_config),
                                     (weights.draft, spec.method.draft_config))]
    return caches[0], Carry(caches[1], lookahead.initial_lengths(spec, prompts.shape[0]))


def layout(spec, rows, cache) -> Carry:
    """The carry's layout on a device mesh (`decoding.sharding`)."""
    return Carry(cache(spec.method.draft_config, spec.method.shard_draft),
                 rows if spec.method.lookahead.schedule == "heuristic" else None)


class ChainDraft(NamedTuple):
    """What the draft model proposes in one step of a chain (`draft`)."""
    tokens: jax.Array             # [B, K] int32, zero past a row's draft
    probs: jax.Array              # [B, K, V] the distributions they were drawn from, zero past it
    count: jax.Array              # [B] how many each row drafted (0 for a finished row)
    cache: KVCache                # the draft's cache after them
    nan: jax.Array                # [] whether a NaN was seen


def draft(spec, weights, state: DecodeState, keys, limit) -> ChainDraft:
    """Step 1 (draft): up to K draft tokens per row, each row stopping as its schedule says.

    Args:
      keys: [B, K] one key per draft position; limit: [B] the most each row drafts this step.
    Returns the `ChainDraft`.
    """
    vocab, k = spec.vocab_size, spec.method.k
    # The first call feeds the last two tokens (see the module docstring) and reads the logits
    # of the row's last real position: index 1, or 0 for a row of a single token.
    window, positions = last_tokens(state, 2)
    logits, cache = forward(weights.draft, spec.method.draft_config, window, positions,
                            state.carry.draft_cache)
    last = state.length - 1 - positions[:, 0]
    logits = jnp.take_along_axis(logits, last[:, None, None], axis=1)[:, 0]   # [B, V']
    nan = any_nan(logits)

    def propose_at(i, logits, running, tokens, probs, count):
        """Draws x_{i+1} ~ p_{i+1} for every row and keeps it where the row is still drafting;
        p follows the row's controls and automaton after its drafts so far (`steered`)."""
        drafted = jnp.where(jnp.arange(k) < i, tokens, -1)[:, None, :]          # [B, 1, K]
        logits = steered(spec, state, logits[:, None], drafted)[:, 0]
        token, p = spec.rules.propose(keys[:, i], logits, state.settings.sampling)
        tokens = tokens.at[:, i].set(jnp.where(running, token, 0))
        probs = probs.at[:, i].set(jnp.where(running[:, None], p, 0.0))
        count = count + running
        running = running & ~lookahead.stops(spec, state, i, limit, logits, p, token)
        return token, running, tokens, probs, count

    b = state.length.shape[0]
    tokens = jnp.zeros((b, k), jnp.int32)
    probs = jnp.zeros((b, k, vocab), jnp.float32)
    count = jnp.zeros((b,), jnp.int32)
    token, running, tokens, probs, count = propose_at(
        0, pad_vocab(logits, vocab), ~state.done, tokens, probs, count)

    def more(carry):
        i, running = carry[0], carry[2]
        return (i < k) & jnp.any(running)

    def draft_next(carry):
        # Feed x_i at position length + i - 1 for the logits of p_{i+1}. Rows that stopped feed
        # it too (static shapes); their cache slots past the draft are rolled back in `step`.
        i, token, running, cache, tokens, probs, count, nan = carry
        out, cache = forward(weights.draft, spec.method.draft_config, token[:, None],
                             (state.length + i - 1)[:, None], cache)
        token, running, tokens, probs, count = propose_at(
            i, pad_vocab(out[:, 0], vocab), running, tokens, probs, count)
        return i + 1, token, running, cache, tokens, probs, count, nan | any_nan(out)

    # The loop's carry from its fourth entry on: what the drafting leaves (`draft_next`).
    cache, tokens, probs, count, nan = lax.while_loop(
        more, draft_next, (jnp.ones((), jnp.int32), token, running, cache, tokens, probs, count,
                           nan))[3:]
    return ChainDraft(tokens, probs, count, cache, nan)


class ChainVerified(NamedTuple):
    """What one target call over a chain and the verify step give (`score_and_verify`)."""
    new: jax.Array                # [B, K + 1] the accepted drafts, then the residual or bonus
    #                               token (`n_accepted` + 1 of them are real; the rest padding)
    n_accepted: jax.Array         # [B] the leading drafts accepted
    cache: KVCache                # the target's
    nan: jax.Array                # whether the target's logits had a NaN
    details: dict | None          # with `spec.trace`, the verify step's numbers
    scores: jax.Array | None      # with `spec.logprobs`, `state.target_probs`' of the K + 1
    #                               positions [B, K + 1, V]


def score_and_verify(spec, weights, state: DecodeState, draft_tokens, draft_probs, keys,
                     num_drafted=None) -> ChainVerified:
    """Steps 2 to 4 (score, accept or resample, bonus), shared with n-gram decoding.

    The target scores [last token, x_1..x_K] at positions length-1 .. length-1+K in one call,
    then the spec's verification rule (`spec.rules.verify`: `rejection.verify` unless the caller
    gave other rules) accepts a prefix and draws one more token.
    """
    k = draft_tokens.shape[1]
    last, last_position = last_tokens(state, 1)
    target_in = jnp.concatenate([last, draft_tokens], axis=1)          # [B, K + 1]
    positions = last_position + jnp.arange(k + 1, dtype=jnp.int32)      # [B, K + 1]
    logits, cache = forward(weights.target, spec.target_config, target_in, positions,
                            state.target_cache)
    q, scores = target_probs(spec, state, logits, chain_drafted(draft_tokens))
    # With `spec.trace`, the same rule returns its numbers too (`specjax.explain`).
    traced = {"with_details": True} if spec.trace else {}
    verdict = spec.rules.verify(draft_tokens, draft_probs, q, keys, num_drafted=num_drafted,
                                **traced)
    new = jnp.concatenate([draft_tokens, jnp.zeros_like(draft_tokens[:, :1])], axis=1)
    new = new.at[jnp.arange(new.shape[0]), verdict.n_accepted].set(verdict.next_token)
    return ChainVerified(new, verdict.n_accepted, cache, any_nan(logits), verdict.details, scores)


def step(spec, weights, state: DecodeState) -> DecodeState:
    """One step for every row: the chain below, or a token tree (`speculative_tree`)."""
    if spec.method.tree is not None:
        return speculative_tree.step(spec, weights, state)
    k, carry = spec.method.k, state.carry
    keys = step_keys(state)                                            # [B]
    split = jax.vmap(lambda key: jax.random.split(key, k + 1))(keys)   # [B, K + 1]
    draft_keys, verify_keys = split[:, :k], split[:, k]

    # Step 1 (draft): x_1..x_n ~ p_1..p_n, n <= K as the row's schedule says (`lookahead`).
    drafted = draft(spec, weights, state, draft_keys,
                    lookahead.draft_limit(spec, state, carry.lookahead))
    draft_tokens, draft_probs, count = drafted.tokens, drafted.probs, drafted.count
    # Steps 2 to 4 (score, accept or resample, bonus): one target call, a prefix accepted, then
    # the residual or the bonus token.
    if spec.method.lookahead.schedule == "constant":
        verified = score_and_verify(spec, weights, state, draft_tokens, draft_probs, verify_keys)
    else:       # rows drafted different numbers of tokens: score only what the longest needs
        verified = lookahead.ragged_score_and_verify(score_and_verify, spec, weights, state,
                                                     draft_tokens, draft_probs, verify_keys,
                                                     count)
    state = trace.record(spec, state, draft_tokens, count, verified)
    lengths = lookahead.update(spec, state, carry.lookahead, count, verified.n_accepted)

    # Then commit, and roll the draft back too. It has seen the fed tokens up to x_{n-1}, so
    # it may be one behind (the next step catches up).
    old_length = state.length
    state = commit(spec, state, verified.new, verified.n_accepted, verified.cache, drafted=count,
                   draft_calls=count, nan=drafted.nan | verified.nan, scores=verified.scores)
    draft_cache = drafted.cache.with_length(jnp.minimum(state.length - 1, old_length + count - 1))
    return state.replace(carry=Carry(draft_cache, lengths))
