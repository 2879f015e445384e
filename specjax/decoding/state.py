"""The decoding state shared by every method, and the bookkeeping every step does.

A batch of ragged prompts lives in one token buffer `[B, M]` with a length per row. Invariant
between steps: the last token of each row, `tokens[b, length[b] - 1]`, has been chosen but not
yet fed to the models; their caches hold every position before it. A step feeds it (plus any
drafted tokens), appends what it accepts, and the invariant holds again.

Each row has its own random stream: the key of step i of row b is `fold_in(row_key[b], i)`.
All rows start at step 0 together and a finished row stops consuming keys, so a row's draws do
not depend on which other rows share its batch.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from specjax.model.cache import KVCache
from specjax.sampling.constraints import Constraint, advance, constrain
from specjax.sampling.controls import Controls, History, apply_controls
from specjax.sampling.logits import Sampling, probs_from_logits


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


class Logprobs(NamedTuple):
    """Each buffer position's token under the target's distribution at that position
    (`target_probs`): its log-probability and the N most likely tokens' (with `logprobs=N`).
    Prompt positions hold zeros."""
    chosen: jax.Array          # [B, M] float32
    top_ids: jax.Array         # [B, M, N] int32, most likely first
    top: jax.Array             # [B, M, N] float32


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
    # With DecodeSpec.logprobs = N > 0: the emitted tokens' log-probabilities (`Logprobs`).
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
                       logprobs=None if not logprobs else Logprobs(
                           jnp.zeros((b, buffer_length), jnp.float32),
                           jnp.zeros((b, buffer_length, logprobs), jnp.int32),
                           jnp.zeros((b, buffer_length, logprobs), jnp.float32)))


def step_keys(state: DecodeState) -> jax.Array:
    """This step's key of each row: [B] keys."""
    return jax.vmap(jax.random.fold_in, in_axes=(0, None))(state.row_keys, state.step)


def last_tokens(state: DecodeState, count: int) -> tuple[jax.Array, jax.Array]:
    """The last `count` tokens of each row and their positions: [B, count] each.

    A row shorter than `count` gets its window clamped to start at position 0; callers read
    the logits of the row's last real position (`length - 1 - start`).
    """
    start = jnp.maximum(state.length - count, 0)
    window = jax.vmap(lambda row, s: lax.dynamic_slice(row, (s,), (count,)))(state.tokens, start)
    return window, start[:, None] + jnp.arange(count, dtype=jnp.int32)


def _write(buffer, new, start, active):
    """Writes new [B, W, ...] into buffer [B, M, ...] at each active row's `start` [B]."""
    written = jax.vmap(lambda row, x, s: lax.dynamic_update_slice_in_dim(row, x, s, 0))(
        buffer, new.astype(buffer.dtype), start)
    return jnp.where(active.reshape(active.shape + (1,) * (buffer.ndim - 1)), written, buffer)


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
               draft_calls: int = 0, nan: jax.Array | bool = False) -> DecodeState:
    """Adds one target call (and the given draft work) to the counters of active rows."""
    active = (~state.done).astype(jnp.int32)
    histogram = state.accepted_histogram
    if histogram is not None:
        histogram = histogram + active[:, None] * jax.nn.one_hot(
            accepted, histogram.shape[1], dtype=jnp.int32)
    return state.replace(target_calls=state.target_calls + active, accepted_histogram=histogram,
                         draft_calls=state.draft_calls + active * draft_calls,
                         drafted=state.drafted + active * drafted,
                         accepted=state.accepted + active * accepted,
                         nan_seen=state.nan_seen | nan)


def commit(spec, state: DecodeState, new_tokens: jax.Array, n_accepted: jax.Array,
           target_cache: KVCache, *, drafted: jax.Array | int = 0, draft_calls: int = 0,
           nan: jax.Array | bool = False, scores: jax.Array | None = None) -> DecodeState:
    """The end of every step: count the target call (and the drafting), append the accepted
    drafts and the one token drawn after them (`new_tokens` [B, W], `n_accepted` + 1 of them per
    row), and roll the target's cache back to everything before the new last token, which is
    all a rollback is (`cache.KVCache.with_length`). With `spec.logprobs`, `scores` [B, W, V]
    (`target_probs`' at the positions that drew the new tokens) give their `Logprobs`."""
    if state.logprobs is not None:
        chosen = jnp.take_along_axis(scores, new_tokens[..., None], axis=-1)[..., 0]
        top, top_ids = lax.top_k(scores, spec.logprobs)
        active = ~state.done
        state = state.replace(logprobs=Logprobs(*(
            _write(buffer, new, state.length, active)
            for buffer, new in zip(state.logprobs, (chosen, top_ids, top)))))
    state = count_call(state, drafted=drafted, accepted=n_accepted, draft_calls=draft_calls,
                       nan=nan)
    before = state.length
    state = append(state, new_tokens, n_accepted + 1)
    state = state.replace(fsm=advance(state.settings.constraint.table, state.fsm, new_tokens,
                                      state.length - before))
    return state.replace(target_cache=target_cache.with_length(state.length - 1))


def any_nan(*arrays) -> jax.Array:
    return jnp.any(jnp.stack([jnp.isnan(a).any() for a in arrays]))


def target_probs(spec, state: DecodeState, logits, drafted=None):
    """The target's sampling distribution at each position of a call [B, N, V] from its logits
    [B, N, V']: the row's controls at each position given what precedes it (the prompt, the
    output, and `drafted` [B, N, E], the drafts before each position, -1 where none), its
    automaton's mask in the state those tokens lead to (`sampling.constraints`), then its
    sampling transforms (`specjax.sampling.logits`). Every method's verify call and every
    autoregressive step take their target distribution here, so it is one law everywhere.

    Returns q [B, N, V] and, with `spec.logprobs`, the log-probabilities reported for the
    tokens drawn there [B, N, V] (else None): log q, or for a greedy row, whose q is one-hot,
    the log-softmax of the logits after the controls (the distribution at temperature 1)."""
    logits = steered(spec, state, logits, drafted, spec.rules.controls)
    q = probs_from_logits(logits, state.settings.sampling)
    if not spec.logprobs:
        return q, None
    greedy = (state.settings.sampling.temperature == 0)[:, None, None]
    return q, jnp.where(greedy, jax.nn.log_softmax(logits, axis=-1), jnp.log(q))


def steered(spec, state: DecodeState, logits, drafted=None, controls=apply_controls):
    """Logits [B, N, V'] -> [B, N, V] float32 under each row's controls (`controls`, the
    spec's rule for the target) and its automaton's mask, at each position given the drafts
    before it (`drafted` [B, N, E], -1 where none): `target_probs` before the sampling
    transforms. Drafters steer their own logits with it too, so that they propose what the
    controlled target favours: the rule is exact for any draft distribution that is the one
    drawn from, and a draft that ignored a penalty or the automaton would be rejected more."""
    history = History(state.tokens, state.length, state.prompt_length,
                      state.settings.stop_ids, drafted)
    logits = controls(pad_vocab(logits, spec.vocab_size), state.settings.controls, history)
    return constrain(logits, state.settings.constraint, state.fsm, drafted)


def steering(state: DecodeState) -> jax.Array:
    """[] bool: whether any row sets a control or a constraint (drafters skip `steered`
    otherwise, a `lax.cond`)."""
    return jnp.any(state.settings.controls.active) | jnp.any(state.settings.constraint.active)


def chain_drafted(draft_tokens):
    """[B, K] drafts -> [B, K + 1, K]: position i of a chain's verify call comes after drafts
    0..i-1 (-1 in the other slots)."""
    k = draft_tokens.shape[1]
    before = jnp.arange(k)[None, :] < jnp.arange(k + 1)[:, None]                 # [K + 1, K]
    return jnp.where(before[None], draft_tokens[:, None, :], -1)


def pad_vocab(logits, vocab: int):
    """Pads [..., V'] logits with -inf up to `vocab`: a token outside a model's vocabulary has
    probability 0 under it. Lets a draft and target whose vocabularies differ only by padding
    share one id space without changing either distribution."""
    extra = vocab - logits.shape[-1]
    if extra == 0:
        return logits
    padding = jnp.full((*logits.shape[:-1], extra), -jnp.inf, logits.dtype)
    return jnp.concatenate([logits, padding], axis=-1)
