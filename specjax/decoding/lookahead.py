"""Dynamic speculation lookahead: how many tokens each row drafts at each step.

Three schedules (`config.Lookahead`: `spec.method.lookahead`), with K (`spec.method.k`) the
most a row ever drafts:

  constant    K every step (Leviathan et al.; Chen et al.).
  heuristic   a per-row length kept in the decode state, starting at `k_start`: + 2 after a step
              whose drafts were all accepted, - 1 otherwise, kept within 1..K (the schedule of
              Hugging Face's assisted generation, "heuristic").
  confidence  a row stops drafting after a token whose draft probability falls below
              `confidence_threshold`, or after K tokens (Mamou et al. 2024, "Dynamic Speculation
              Lookahead", in its threshold form; transformers' default since 4.45).

The draft probability of a token x is p(x), the probability under the distribution x was drawn
from (after temperature, top-k and top-p). At temperature 0 that distribution is one-hot, so
p(x) = 1 says nothing; there the confidence is the draft's softmax at temperature 1, whose top
entry is the probability of the greedy token x: the model's own belief in it, as transformers
measures it.

Why every schedule keeps Theorem 1. Whether a row drafts position i + 1 is decided from the
draft's own history only: the tokens x_1..x_i it drew and its distributions p_1..p_i. Given
that history, the target's accept/reject coin at each drafted position and the residual draw
are exactly those of a fixed-length step, and a position not drafted is drawn from q itself; so
the emitted token at every position is distributed as q whatever the stopping decision was, as
long as that decision could not see the target. The heuristic length depends on earlier steps'
acceptances, which are part of the emitted history the next step conditions on anyway. A rule
that peeks at the target (stop before a token the target would reject) breaks it, and the
negative-control test shows the G-test catching exactly that.

A step drafts up to K tokens in a `lax.while_loop` that ends when every active row has stopped,
and the target verifies the smallest of a few static sizes (`verify_sizes`) that holds the
longest row's draft: the work follows the drafted tokens, the compiled shapes stay static.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from specjax.decoding.state import DecodeState

SCHEDULES = ("constant", "heuristic", "confidence")
DEFAULT_K_START = 5                 # transformers' num_assistant_tokens
DEFAULT_CONFIDENCE_THRESHOLD = 0.4  # transformers' assistant_confidence_threshold


def initial_lengths(spec, rows: int) -> jax.Array | None:
    """The heuristic schedule's starting lengths [B], which the method carries from step to step
    (`speculative.Carry`, `ngram.Carry`); None for the other schedules (no state)."""
    if spec.method.lookahead.schedule != "heuristic":
        return None
    return jnp.full((rows,), spec.method.lookahead.start, jnp.int32)


def draft_limit(spec, state: DecodeState, lengths: jax.Array | None) -> jax.Array:
    """The most tokens each row may draft this step: [B] int32 in 1..K. `lengths` are the
    heuristic's (`initial_lengths`, `update`)."""
    if spec.method.lookahead.schedule == "heuristic":
        return lengths
    return jnp.full(state.length.shape, spec.method.k, jnp.int32)


def confidence(logits: jax.Array, p: jax.Array, token: jax.Array,
               greedy: jax.Array) -> jax.Array:
    """The draft probability of each row's drafted token (module docstring): [B] float32.

    Args:
      logits: [B, V] the draft's logits; p: [B, V] the distribution `token` [B] was drawn from;
      greedy: [B] whether the row decodes at temperature 0.
    """
    logits = logits.astype(jnp.float32)
    top = jnp.exp(jnp.max(logits, axis=-1) - jax.nn.logsumexp(logits, axis=-1))
    return jnp.where(greedy, top, jnp.take_along_axis(p, token[:, None], axis=-1)[:, 0])


def stops(spec, state: DecodeState, position: int | jax.Array, limit: jax.Array, logits, p,
          token) -> jax.Array:
    """Whether each row stops after drafting `token` at 0-based `position`: [B] bool."""
    stop = position + 1 >= limit
    if spec.method.lookahead.schedule == "confidence":
        greedy = state.settings.sampling.temperature == 0
        stop = stop | (confidence(logits, p, token, greedy) < spec.method.lookahead.threshold)
    return stop


def update(spec, state: DecodeState, lengths: jax.Array | None, drafted: jax.Array,
           accepted: jax.Array) -> jax.Array | None:
    """The heuristic's `lengths` for the next step: [B] (None for the other schedules).

    A row that drafted nothing (an n-gram lookup with no match) learnt nothing and keeps its
    length; a finished row keeps it too.
    """
    if spec.method.lookahead.schedule != "heuristic":
        return lengths
    grown = jnp.where(accepted == drafted, lengths + 2, lengths - 1)
    grown = jnp.clip(grown, 1, spec.method.k)
    return jnp.where(~state.done & (drafted > 0), grown, lengths)


def verify_sizes(k: int) -> tuple[int, ...]:
    """The draft lengths a ragged verify call is compiled for: powers of two below K, and K.

    A call on n + 1 tokens costs more as n grows (on a CPU nearly in proportion), so a step whose
    rows drafted at most 3 of K = 20 should not pay for 21; a handful of sizes keeps compile time
    and program size small.
    """
    sizes, n = [], 1
    while n < k:
        sizes.append(n)
        n *= 2
    return (*sizes, k)


def ragged(verify_fn, k: int, num_drafted: jax.Array, *args):
    """Runs `verify_fn(n, *args)` for the smallest static size n in `verify_sizes(k)` that holds
    every row's `num_drafted` [B], with `lax.switch`. Every branch must return the same shapes."""
    sizes = verify_sizes(k)
    if len(sizes) == 1:
        return verify_fn(k, *args)
    longest = jnp.max(num_drafted)
    index = jnp.sum(jnp.asarray(sizes[:-1]) < longest)
    return lax.switch(index, [lambda *a, n=n: verify_fn(n, *a) for n in sizes], *args)


def ragged_score_and_verify(score_and_verify, spec, weights, state: DecodeState, draft_tokens,
                            draft_probs, keys, num_drafted):
    """`score_and_verify` (`speculative.score_and_verify`) for rows that drafted different
    numbers of tokens, `num_drafted` [B]: the target scores only as many positions as the
    longest row needs (`ragged`). Positions past a row's draft must have p = 0. Returns its
    `ChainVerified`, with new tokens [B, K + 1]."""
    k = draft_tokens.shape[1]

    def verify_first(n, tokens, probs):
        # Position keys (the coupled rule) are one per position scored; a step's key is whole.
        verified = score_and_verify(spec, weights, state, tokens[:, :n], probs[:, :n],
                                    keys[:, :n + 1] if spec.rules.by_position else keys,
                                    num_drafted=jnp.minimum(num_drafted, n))
        details, scores = verified.details, verified.scores
        if details is not None:         # per-position numbers padded to K, as every branch
            details = {name: jnp.pad(v, ((0, 0), (0, k - n))) if name != "residual" else v
                       for name, v in details.items()}
        if scores is not None:
            scores = jnp.pad(scores, ((0, 0), (0, k - n), (0, 0)))
        return verified._replace(new=jnp.pad(verified.new, ((0, 0), (0, k - n))),
                                 details=details, scores=scores)

    return ragged(verify_first, k, num_drafted, draft_tokens, draft_probs)
