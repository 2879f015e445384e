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
(`lookahead`), the verify numbers kept for `specjax.explain` (`trace`), and what a product adds
to Algorithm 2, the rows' controls and automata, log-probabilities and NaN tracking (`extras`).

The same loop for one sequence in plain NumPy, without caches, batches or tracing, is
`specjax.reference.speculative` (`specjax/reference/decoding.py`): read it first.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from specjax.decoding import config, lookahead, speculative_tree, trace
from specjax.decoding.extras import any_nan, chain_drafted, steered, target_probs
from specjax.decoding.prefill import prefill
from specjax.decoding.state import DecodeState, commit, drafting_keys, last_tokens
from specjax.model.cache import KVCache
from specjax.model.config import ModelConfig
from specjax.model.transformer import forward


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpeculativeSpec(config.Drafting):
    """A draft model's chain or tree; with `shard_draft` its weights are split over a mesh's
    "model" axis like the target's, else replicated."""
    name: ClassVar[str] = "speculative"
    draft_config: ModelConfig
    lookahead: config.Lookahead = config.Lookahead()
    shard_draft: bool = False


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


class Drafting(NamedTuple):
    """The carry of `draft`'s loop: the position it draws next, and the `ChainDraft` so far."""
    i: jax.Array | int            # [] int32, 0-based: x_{i+1} is drawn next
    token: jax.Array              # [B] the token drawn last, fed to the draft next
    running: jax.Array            # [B] bool, whether the row is still drafting
    cache: KVCache                # the fields of `ChainDraft`
    tokens: jax.Array
    probs: jax.Array
    count: jax.Array
    nan: jax.Array


def draft(spec, weights, state: DecodeState, keys, limit) -> ChainDraft:
    """Step 1 (draft): up to K draft tokens per row, one key of `keys` [B, K] per position, each
    row stopping as its schedule says and after `limit` [B] at most."""
    k, vocab, config = spec.method.k, spec.vocab_size, spec.method.draft_config
    # The first call feeds the last two tokens (see the module docstring) and reads the logits
    # of the row's last real position: index 1, or 0 for a row of a single token.
    window, positions = last_tokens(state, 2)
    logits, cache = forward(weights.draft, config, window, positions, state.carry.draft_cache)
    last = state.length - 1 - positions[:, 0]
    logits = jnp.take_along_axis(logits, last[:, None, None], axis=1)[:, 0]   # [B, V']

    def propose(d: Drafting, logits) -> Drafting:
        """Draws x_{i+1} ~ p_{i+1} for every row and keeps it where the row is still drafting;
        p follows the row's controls and automaton after its drafts so far (`steered`)."""
        before = jnp.where(jnp.arange(k) < d.i, d.tokens, -1)[:, None, :]        # [B, 1, K]
        logits = steered(spec, state, logits[:, None], before)[:, 0]              # [B, V]
        token, p = spec.rules.propose(keys[:, d.i], logits, state.settings.sampling)
        stops = lookahead.stops(spec, state, d.i, limit, logits, p, token)
        return d._replace(i=d.i + 1, token=token, running=d.running & ~stops,
                          tokens=d.tokens.at[:, d.i].set(jnp.where(d.running, token, 0)),
                          probs=d.probs.at[:, d.i].set(jnp.where(d.running[:, None], p, 0.0)),
                          count=d.count + d.running)

    def draft_next(d: Drafting) -> Drafting:
        # Feed x_i at position length + i - 1 for the logits of p_{i+1}. Rows that stopped feed
        # it too (static shapes); their cache slots past the draft are rolled back in `step`.
        out, cache = forward(weights.draft, config, d.token[:, None],
                             (state.length + d.i - 1)[:, None], d.cache)
        return propose(d._replace(cache=cache, nan=d.nan | any_nan(out)), out[:, 0])

    b = state.length.shape[0]
    # i is static for the first draw (its indexing needs no dynamic slice), traced after it.
    nothing = Drafting(0, jnp.zeros((b,), jnp.int32), ~state.done, cache,
                       jnp.zeros((b, k), jnp.int32), jnp.zeros((b, k, vocab), jnp.float32),
                       jnp.zeros((b,), jnp.int32), any_nan(logits))
    d = lax.while_loop(lambda d: (d.i < k) & jnp.any(d.running), draft_next,
                       propose(nothing, logits))
    return ChainDraft(d.tokens, d.probs, d.count, d.cache, d.nan)


class ChainVerified(NamedTuple):
    """What one target call over a chain and the verify step give (`score_and_verify`)."""
    new: jax.Array                # [B, K + 1] the accepted drafts, then the residual or bonus
    #                               token (`n_accepted` + 1 of them are real; the rest padding)
    n_accepted: jax.Array         # [B] the leading drafts accepted
    cache: KVCache                # the target's
    nan: jax.Array                # whether the target's logits had a NaN
    details: dict | None          # with `spec.trace`, the verify step's numbers
    scores: jax.Array | None      # with `spec.logprobs`, `extras.target_probs`' of the K + 1
    #                               positions [B, K + 1, V]


def score_and_verify(spec, weights, state: DecodeState, draft_tokens, draft_probs, keys,
                     num_drafted=None) -> ChainVerified:
    """Steps 2 to 4 (score, accept or resample, bonus), shared with n-gram decoding: the target
    scores [last token, x_1..x_K] at positions length-1 .. length-1+K in one call, then the
    spec's rule (`spec.rules.verify`: `rejection.verify` unless the caller gave other rules)
    accepts a prefix and draws one more token. With `spec.trace` the same rule returns its
    numbers too (`specjax.explain`)."""
    last, last_position = last_tokens(state, 1)
    target_in = jnp.concatenate([last, draft_tokens], axis=1)                       # [B, K + 1]
    positions = last_position + jnp.arange(target_in.shape[1], dtype=jnp.int32)    # [B, K + 1]
    logits, cache = forward(weights.target, spec.target_config, target_in, positions,
                            state.target_cache)
    q, scores = target_probs(spec, state, logits, chain_drafted(draft_tokens))      # [B, K + 1, V]
    verdict = spec.rules.verify(draft_tokens, draft_probs, q, keys, num_drafted=num_drafted,
                                **({"with_details": True} if spec.trace else {}))
    new = jnp.concatenate([draft_tokens, jnp.zeros_like(draft_tokens[:, :1])], axis=1)
    new = new.at[jnp.arange(new.shape[0]), verdict.n_accepted].set(verdict.next_token)
    return ChainVerified(new, verdict.n_accepted, cache, any_nan(logits), verdict.details, scores)


def step(spec, weights, state: DecodeState) -> DecodeState:
    """One step for every row: draft, score, verify, commit (or a tree: `speculative_tree`)."""
    if spec.method.tree is not None:
        return speculative_tree.step(spec, weights, state)
    k, lengths = spec.method.k, state.carry.lookahead
    keys = drafting_keys(spec, state, k, draft="chain")
    # Step 1 (draft): x_1..x_n ~ p_1..p_n, n <= K as the row's schedule says (`lookahead`).
    drafted = draft(spec, weights, state, keys.draft, lookahead.draft_limit(spec, state, lengths))
    # Steps 2 to 4 (score, accept or resample, bonus): one target call, a prefix accepted, then
    # the residual or the bonus token. Rows that drafted different numbers of tokens score only
    # what the longest needs (`lookahead`).
    if spec.method.lookahead.schedule == "constant":
        verified = score_and_verify(spec, weights, state, drafted.tokens, drafted.probs,
                                    keys.verify)
    else:
        verified = lookahead.ragged_score_and_verify(score_and_verify, spec, weights, state,
                                                     drafted.tokens, drafted.probs, keys.verify,
                                                     drafted.count)
    # Then commit: n <- n + accepted + 1 (`state.commit`), and roll the draft back too. It has
    # seen the fed tokens up to x_{n-1}, so it may be one behind (the next step catches up).
    committed = commit(spec, trace.record(spec, state, drafted.tokens, drafted.count, verified),
                       verified.new, verified.n_accepted, verified.cache, drafted=drafted.count,
                       draft_calls=drafted.count, nan=drafted.nan | verified.nan,
                       scores=verified.scores)
    draft_length = jnp.minimum(committed.length - 1, state.length + drafted.count - 1)
    return committed.replace(carry=Carry(
        drafted.cache.with_length(draft_length),
        lookahead.update(spec, state, lengths, drafted.count, verified.n_accepted)))
