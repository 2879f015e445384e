"""Each row's controls: logit bias, a minimum length and the penalties, applied to the logits
before the sampling distribution is made (`logits.probs_from_logits`).

In this order (the `Rules.controls` step, `apply_controls` by default):

  a. logit bias: add `bias[v]` to token v's logit;
  b. minimum length: while fewer than `min_tokens` tokens have been generated, the row's stop
     ids (its EOS ids) get logit -inf;
  c. repetition penalty r (Keskar et al. 2019, as transformers and vLLM apply it): a token
     seen in the prompt or the output has its logit divided by r when positive, multiplied by
     r otherwise;
  d. frequency and presence penalties (OpenAI's rule, over the output only): subtract
     `frequency * count + presence * (count > 0)`, count being how often the token was
     generated so far.

Then temperature, top-k, top-p and min-p (`logits`). This is vLLM's order (its logits
processors, bias and minimum length, then its penalties, then temperature); transformers has
no frequency or presence penalty, and its bias and repetition processors run in the same
order. At every position the text "so far" is the row's prompt, its output, and the drafted
tokens before that position, as if they had been generated: a verify call's position i sees
the drafts 1..i-1 (`History.drafted`), so the target's law under a control is the same at
every method (the engines' known bug is to count only the committed tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["Controls", "History", "apply_controls", "penalised"]


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Controls:
    """Each row's penalties, logit bias and minimum length, as data (arrays [B], the bias
    [B, V]): changing them never recompiles. `active` [B] says which rows set any, so that a
    batch with none skips the work (a `lax.cond`)."""

    repetition: jax.Array       # float32, 1 = off
    presence: jax.Array         # float32, 0 = off
    frequency: jax.Array        # float32, 0 = off
    bias: jax.Array             # float32 [B, V], 0 = off
    min_tokens: jax.Array       # int32, 0 = off
    active: jax.Array           # bool

    @staticmethod
    def off(rows: int, vocab: int) -> "Controls":
        """No control on any of `rows` rows (numpy, placed by the caller)."""
        zeros = np.zeros(rows, np.float32)
        return Controls(repetition=np.ones(rows, np.float32), presence=zeros, frequency=zeros,
                        bias=np.zeros((rows, vocab), np.float32),
                        min_tokens=np.zeros(rows, np.int32), active=np.zeros(rows, bool))


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class History:
    """What precedes each of a call's N positions, for the controls: the row's token buffer
    (its prompt, then its output: `tokens[b, :length[b]]` precede position 0), and the tokens
    drafted before each position, after those (`drafted` [B, N, E], -1 where none: position i
    of a chain sees drafts 0..i-1, a tree node the path from the root's child to itself)."""

    tokens: jax.Array           # [B, M] int32
    length: jax.Array           # [B] int32
    prompt_length: jax.Array    # [B] int32
    stop_ids: jax.Array         # [B, S] int32, -1 in unused slots
    drafted: jax.Array | None = None     # [B, N, E] int32, -1 where none; None: no drafts


def apply_controls(logits: jax.Array, controls: Controls, history: History) -> jax.Array:
    """Logits [B, N, V] (float32) after each row's controls, a to d of the module docstring, at
    each position given what precedes it (`history`). The identity, to the bit, for rows that
    set none; a batch where no row sets any returns the logits as they are."""
    return lax.cond(jnp.any(controls.active),
                    lambda: _controlled(logits.astype(jnp.float32), controls, history),
                    lambda: logits.astype(jnp.float32))


def penalised(x, count, seen, repetition, presence, frequency):
    """The penalties (c and d) on logits x, elementwise: `count` times generated (int), `seen`
    in the prompt or the output (bool), the row's penalties broadcast against x."""
    x = jnp.where(seen, jnp.where(x > 0, x / repetition, x * repetition), x)
    return x - frequency * count.astype(jnp.float32) - presence * (count > 0)


def _controlled(x, controls, history):
    b, n, vocab = x.shape
    rows = jnp.arange(b)[:, None]
    where = jnp.arange(history.tokens.shape[1])[None, :]                       # [1, M]
    in_prompt = where < history.prompt_length[:, None]
    in_output = ~in_prompt & (where < history.length[:, None])
    count = jnp.zeros((b, vocab), jnp.int32).at[rows, history.tokens].add(
        in_output.astype(jnp.int32), mode="drop")                               # [B, V]
    prompt = jnp.zeros((b, vocab), bool).at[rows, history.tokens].max(in_prompt, mode="drop")
    drafted = (jnp.full((b, n, 0), -1, jnp.int32) if history.drafted is None
               else history.drafted)                                            # [B, N, E]
    generated = (history.length - history.prompt_length)[:, None] + jnp.sum(drafted >= 0, -1)
    per_row = lambda a: a[:, None, None]                                        # noqa: E731
    penalties = (per_row(controls.repetition), per_row(controls.presence),
                 per_row(controls.frequency))

    x = x + controls.bias[:, None, :]                                           # a
    ends = jnp.zeros((b, vocab), bool).at[rows, history.stop_ids].set(True, mode="drop")
    early = generated < controls.min_tokens[:, None]                            # [B, N]
    x = jnp.where(ends[:, None, :] & early[..., None], -jnp.inf, x)             # b
    y = penalised(x, count[:, None, :], (prompt | (count > 0))[:, None, :], *penalties)  # c, d
    if drafted.shape[-1]:
        # A drafted token's count is the buffer's plus its drafts before the position; it is
        # seen. Its logit is penalised again with that count (the same elementwise rule, so
        # the same bits as when the token is in the buffer) and written over.
        token = jnp.where(drafted >= 0, drafted, vocab)                        # [B, N, E]
        safe = jnp.minimum(token, vocab - 1)
        extra = jnp.sum(token[..., :, None] == token[..., None, :], axis=-1)   # [B, N, E]
        total = jnp.take_along_axis(count[:, None, :], safe, axis=-1) + extra
        again = penalised(jnp.take_along_axis(x, safe, axis=-1), total, True, *penalties)
        y = y.at[rows[..., None], jnp.arange(n)[None, :, None], token].set(again, mode="drop")
    return y
