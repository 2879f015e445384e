"""What a product adds to Algorithm 2, in one place beside the step.

Chen et al.'s step draws from p and q and appends n + 1 tokens. A product also shapes both laws
by each row's controls and constraint, reports log-probabilities and watches for NaN. Every
method reaches those through this module, at two points of its step:

  the laws      `steered`: a model's logits over the shared vocabulary (`pad_vocab`), under
                the row's penalties, bias and minimum length (`sampling.controls`) and its
                automaton's mask (`sampling.constraints`), given the drafts before each
                position; `target_probs`: the target's q from them (`sampling.logits`), and the
                log-probabilities reported for the tokens drawn there.
  the commit    `update`, which `state.commit` calls after n <- n + accepted + 1: the reported
                log-probabilities written, the automaton advanced over the new tokens, the NaN
                flag kept.

None of it changes which rule decides: the verify step sees only p, q and the drafts. A `state`
here is a `state.DecodeState` (which imports this module, so this one names it only in prose).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from specjax.sampling.constraints import advance, constrain
from specjax.sampling.controls import History, apply_controls
from specjax.sampling.logits import probs_from_logits


class Logprobs(NamedTuple):
    """Each buffer position's token under the target's distribution at that position
    (`target_probs`): its log-probability and the N most likely tokens' (with `logprobs=N`).
    Prompt positions hold zeros."""
    chosen: jax.Array          # [B, M] float32
    top_ids: jax.Array         # [B, M, N] int32, most likely first
    top: jax.Array             # [B, M, N] float32


def initial_logprobs(rows: int, buffer_length: int, n: int) -> Logprobs | None:
    """The empty `Logprobs` of a state with `spec.logprobs = n` (None for 0)."""
    if not n:
        return None
    return Logprobs(jnp.zeros((rows, buffer_length), jnp.float32),
                    jnp.zeros((rows, buffer_length, n), jnp.int32),
                    jnp.zeros((rows, buffer_length, n), jnp.float32))


def any_nan(*arrays) -> jax.Array:
    return jnp.any(jnp.stack([jnp.isnan(a).any() for a in arrays]))


def pad_vocab(logits, vocab: int):
    """Pads [..., V'] logits with -inf up to `vocab`: a token outside a model's vocabulary has
    probability 0 under it. Lets a draft and target whose vocabularies differ only by padding
    share one id space without changing either distribution."""
    extra = vocab - logits.shape[-1]
    if extra == 0:
        return logits
    padding = jnp.full((*logits.shape[:-1], extra), -jnp.inf, logits.dtype)
    return jnp.concatenate([logits, padding], axis=-1)


# -- The laws --------------------------------------------------------------------------------

def target_probs(spec, state, logits, drafted=None):
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


def steered(spec, state, logits, drafted=None, controls=apply_controls):
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


def steering(state) -> jax.Array:
    """[] bool: whether any row sets a control or a constraint (drafters skip `steered`
    otherwise, a `lax.cond`)."""
    return jnp.any(state.settings.controls.active) | jnp.any(state.settings.constraint.active)


def chain_drafted(draft_tokens):
    """[B, K] drafts -> [B, K + 1, K]: position i of a chain's verify call comes after drafts
    0..i-1 (-1 in the other slots)."""
    k = draft_tokens.shape[1]
    before = jnp.arange(k)[None, :] < jnp.arange(k + 1)[:, None]                 # [K + 1, K]
    return jnp.where(before[None], draft_tokens[:, None, :], -1)


# -- The commit ------------------------------------------------------------------------------

def update(spec, before, after, new_tokens, *,
           nan: jax.Array | bool = False, scores: jax.Array | None = None):
    """What the extras keep of a commit, from the states `before` and `after` it
    (`state.commit`): with `spec.logprobs`, each new token's `Logprobs` from `scores` [B, W, V]
    (`target_probs`' at the positions that drew `new_tokens` [B, W]); each row's automaton
    advanced over the tokens it appended; and whether the step's logits had a NaN (`nan`)."""
    if before.logprobs is not None:
        chosen = jnp.take_along_axis(scores, new_tokens[..., None], axis=-1)[..., 0]
        top, top_ids = lax.top_k(scores, spec.logprobs)
        after = after.replace(logprobs=Logprobs(*(
            _write(buffer, new, before.length, ~before.done)
            for buffer, new in zip(before.logprobs, (chosen, top_ids, top)))))
    fsm = advance(before.settings.constraint.table, before.fsm, new_tokens,
                  after.length - before.length)
    return after.replace(fsm=fsm, nan_seen=after.nan_seen | nan)


def _write(buffer, new, start, active):
    """Writes new [B, W, ...] into buffer [B, M, ...] at each active row's `start` [B]."""
    written = jax.vmap(lambda row, x, s: lax.dynamic_update_slice_in_dim(row, x, s, 0))(
        buffer, new.astype(buffer.dtype), start)
    return jnp.where(active.reshape(active.shape + (1,) * (buffer.ndim - 1)), written, buffer)
