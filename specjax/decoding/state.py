"""The decoding state shared by every method, and the bookkeeping every step does.

A batch of ragged prompts lives in one token buffer `[B, M]` with a length per row. Invariant
between steps: the last token of each row, `tokens[b, length[b] - 1]`, has been chosen but not
yet fed to the models; their caches hold every position before it. A step feeds it (plus any
drafted tokens), appends what it accepts, and the invariant holds again.

Each row has its own random stream, keyed in one of two ways (`StepKeys`):
- by step, for Algorithm 2's rules: the key of step i of row b is `fold_in(row_key[b], i)`, split
  into the step's draws. All rows start at step 0 together and a finished row stops consuming
  keys, so a row's draws do not depend on which other rows share its batch.
- by position, for autoregressive sampling and the coupled rule (`Rules.by_position`,
  `sampling.coupled`): every draw for the token at absolute position t of row b uses the key
  `fold_in(row_key[b], t)` (`position_keys`), so it depends on the row's seed and t alone, not
  on how many tokens earlier steps appended.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from specjax.decoding import extras
from specjax.decoding.extras import Logprobs
from specjax.model.cache import KVCache
from specjax.sampling.constraints import Constraint
from specjax.sampling.controls import Controls
from specjax.sampling.logits import Sampling


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RowSettings:
    """What each row asks for, as data (changing it never recompiles): how to sample, how many
    new tokens at most, which tokens end the row, and its penalties, bias and minimum length."""
    sampling: Sampling         # [B] per field (`specjax.sampling.logits`)
    max_new_tokens: jax.Array  # [B] int32, within the compiled buffer
    stop_ids: jax.Array        # [B, S] int32: ids that end the row; -1 fills unused slots
    controls: Controls         # [B] per field, the bias [B, V] (`specjax.sampling.controls`)
    constraint: Constraint     # the rows' automata (`specjax.sampling.constraints`)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeState:
    tokens: jax.Array          # [B, M] int32: prompt, then generated tokens
    length: jax.Array          # [B] int32: tokens in the row so far
    prompt_length: jax.Array   # [B] int32
    done: jax.Array            # [B] bool
    row_keys: jax.Array        # [B] PRNG keys
    settings: RowSettings      # each row's sampling parameters, length and stop ids
    step: jax.Array            # [] int32: loop iterations so far
    target_cache: KVCache
    # Per-row counters, all [B] int32: target calls (loop iterations while active), draft
    # calls, tokens drafted, drafted tokens accepted.
    target_calls: jax.Array
    draft_calls: jax.Array
    drafted: jax.Array
    accepted: jax.Array
    nan_seen: jax.Array        # [] bool: some logits were NaN (the API raises on it)
    # What only the method carries from step to step, one pytree that its module's `init` makes
    # and its `step` updates: the draft's cache and the lookahead lengths (`speculative.Carry`),
    # the lookahead lengths (`ngram.Carry`), the hidden state the heads read (`medusa.Carry`),
    # the drafter's cache and the target's features of the pairs it has not read
    # (`eagle.Carry`); None for autoregressive decoding.
    carry: object = None
    # Drafting methods: steps that accepted exactly j drafted tokens, [B, D + 1] int32 (D the
    # longest path a step can accept: K, or a tree's depth); None for autoregressive decoding.
    accepted_histogram: jax.Array | None = None
    # With DecodeSpec.trace only: the last step's verify numbers (`decoding.trace`).
    trace: dict | None = None
    # With DecodeSpec.logprobs = N > 0: the emitted tokens' log-probabilities
    # (`extras.Logprobs`).
    logprobs: Logprobs | None = None
    # [B] int32: each row's automaton state after its tokens (`sampling.constraints`; 0, the
    # free state, for a row without a constraint).
    fsm: jax.Array | None = None

    def replace(self, **changes) -> "DecodeState":
        return dataclasses.replace(self, **changes)


def initial_state(prompts, prompt_length, row_keys, settings, buffer_length, target_cache,
                  carry=None, max_accepted=None, logprobs: int = 0):
    """Copies the padded prompts [B, P] into a token buffer [B, buffer_length]; `carry` is the
    method's own state (its module's `init`)."""
    b, p = prompts.shape
    tokens = jnp.zeros((b, buffer_length), jnp.int32).at[:, :p].set(prompts.astype(jnp.int32))
    zeros = jnp.zeros((b,), jnp.int32)
    return DecodeState(tokens=tokens, length=prompt_length.astype(jnp.int32),
                       prompt_length=prompt_length.astype(jnp.int32),
                       done=jnp.zeros((b,), bool), row_keys=row_keys, settings=settings,
                       step=jnp.zeros((), jnp.int32), target_cache=target_cache,
                       target_calls=zeros, draft_calls=zeros, drafted=zeros, accepted=zeros,
                       nan_seen=jnp.zeros((), bool), carry=carry,
                       fsm=jnp.asarray(settings.constraint.start, jnp.int32),
                       accepted_histogram=(None if max_accepted is None else
                                           jnp.zeros((b, max_accepted + 1), jnp.int32)),
                       logprobs=extras.initial_logprobs(b, buffer_length, logprobs))


def step_keys(state: DecodeState) -> jax.Array:
    """This step's key of each row: [B] keys."""
    return jax.vmap(jax.random.fold_in, in_axes=(0, None))(state.row_keys, state.step)


def position_keys(state: DecodeState, count: int) -> jax.Array:
    """The keys of the `count` positions from each row's next token on: [B, count], entry j that
    of position length + j, `fold_in(row_key, length + j)`."""
    positions = state.length[:, None] + jnp.arange(count, dtype=jnp.int32)       # [B, count]
    return jax.vmap(jax.vmap(jax.random.fold_in, in_axes=(None, 0)))(state.row_keys, positions)


class StepKeys(NamedTuple):
    """A drafting step's keys, as its rules take them (`Rules.by_position` says which)."""
    draft: jax.Array | None     # the drafter's: [B, D] one per depth (the drafts at depth d + 1,
    #                             position length + d, take entry d), or [B] one per row
    verify: jax.Array           # the verify rule's: [B] by step, [B, D + 1] by position


def drafting_keys(spec, state: DecodeState, depth: int, *, draft: str = "levels") -> StepKeys:
    """The keys of a step that drafts `depth` positions (a chain's k, a tree's depth).

    By position (`Rules.by_position`): the position keys of length .. length + depth, the drafts
    taking the first `depth` and the verify rule all of them. By step, as Algorithm 2's methods
    have always split the step's key: `draft` "levels" splits it in two and the first into one
    key per depth (tree drafters), "chain" splits it into depth + 1 (the draft model's chain:
    the last is the verify rule's), "one" splits it in two and keeps the first whole (a block
    drafter), "none" keeps it whole for the verify rule (a lookup drafts without noise)."""
    if spec.rules.by_position:
        keys = position_keys(state, depth + 1)
        return StepKeys(keys[:, :depth], keys)
    keys = step_keys(state)
    if draft == "none":
        return StepKeys(None, keys)
    if draft == "chain":
        keys = jax.vmap(lambda key: jax.random.split(key, depth + 1))(keys)      # [B, K + 1]
        return StepKeys(keys[:, :depth], keys[:, depth])
    k_draft, k_verify = jnp.moveaxis(jax.vmap(jax.random.split)(keys), 1, 0)
    if draft == "one":
        return StepKeys(k_draft, k_verify)
    return StepKeys(jax.vmap(lambda key: jax.random.split(key, depth))(k_draft), k_verify)


def last_tokens(state: DecodeState, count: int) -> tuple[jax.Array, jax.Array]:
    """The last `count` tokens of each row and their positions: [B, count] each.

    A row shorter than `count` gets its window clamped to start at position 0; callers read
    the logits of the row's last real position (`length - 1 - start`).
    """
    start = jnp.maximum(state.length - count, 0)
    window = jax.vmap(lambda row, s: lax.dynamic_slice(row, (s,), (count,)))(state.tokens, start)
    return window, start[:, None] + jnp.arange(count, dtype=jnp.int32)


def append(state: DecodeState, new_tokens: jax.Array, n_new: jax.Array) -> DecodeState:
    """Appends up to `n_new` of `new_tokens` [B, W] to each active row, stopping exactly at the
    row's first stop id or at its max_new_tokens, and marks finished rows done."""
    w = new_tokens.shape[1]
    index = jnp.arange(w, dtype=jnp.int32)
    max_new_tokens, stop_ids = state.settings.max_new_tokens, state.settings.stop_ids
    room = state.prompt_length + max_new_tokens - state.length
    count = jnp.minimum(n_new, room)
    is_stop = jnp.any(new_tokens[:, :, None] == stop_ids[:, None, :], axis=-1)    # [B, W]
    is_stop = is_stop & (index < count[:, None])
    first_stop = jnp.where(is_stop.any(axis=1), jnp.argmax(is_stop, axis=1), w)
    count = jnp.minimum(count, first_stop + 1)
    hit_eos = is_stop.any(axis=1)
    active = ~state.done
    count = jnp.where(active, count, 0)

    def write(row, new, start):
        return lax.dynamic_update_slice(row, new, (start,))

    tokens = jax.vmap(write)(state.tokens, new_tokens.astype(jnp.int32), state.length)
    tokens = jnp.where(active[:, None], tokens, state.tokens)
    length = state.length + count
    done = state.done | (active & (hit_eos | (length - state.prompt_length >= max_new_tokens)))
    return state.replace(tokens=tokens, length=length, done=done)


def count_call(state: DecodeState, *, drafted: jax.Array | int = 0, accepted: jax.Array | int = 0,
               draft_calls: int = 0) -> DecodeState:
    """Adds one target call (and the given draft work) to the counters of active rows."""
    active = (~state.done).astype(jnp.int32)
    histogram = state.accepted_histogram
    if histogram is not None:
        histogram = histogram + active[:, None] * jax.nn.one_hot(
            accepted, histogram.shape[1], dtype=jnp.int32)
    return state.replace(target_calls=state.target_calls + active, accepted_histogram=histogram,
                         draft_calls=state.draft_calls + active * draft_calls,
                         drafted=state.drafted + active * drafted,
                         accepted=state.accepted + active * accepted)


def commit(spec, state: DecodeState, new_tokens: jax.Array, n_accepted: jax.Array,
           target_cache: KVCache, *, drafted: jax.Array | int = 0, draft_calls: int = 0,
           nan: jax.Array | bool = False, scores: jax.Array | None = None) -> DecodeState:
    """Algorithm 2's n <- n + accepted + 1, the end of every step: count the target call (and
    the drafting), append the accepted drafts and the one token drawn after them (`new_tokens`
    [B, W], `n_accepted` + 1 of them per row), and roll the target's cache back to everything
    before the new last token, which is all a rollback is (`cache.KVCache.with_length`). Then
    the extras (`extras.update`) keep the new tokens' log-probabilities from `scores` [B, W, V],
    the automaton's state and the `nan` flag."""
    after = count_call(state, drafted=drafted, accepted=n_accepted, draft_calls=draft_calls)
    after = append(after, new_tokens, n_accepted + 1)
    after = after.replace(target_cache=target_cache.with_length(after.length - 1))
    return extras.update(spec, state, after, new_tokens, nan=nan, scores=scores)
