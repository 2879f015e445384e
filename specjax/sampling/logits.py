"""The one place where logits become the distribution we sample from.

Every decoding method calls `probs_from_logits` with the same `SamplingParams`, for every
model it samples from (the target, at every position and the bonus one, and any drafter), so
the distribution the target model is "sampled from" is defined exactly once (after each row's
controls, `sampling.controls`, have changed the logits).
Speculative sampling is exact with respect to *this* distribution: Theorem 1 of Chen et al.
2023 ("Accelerating Large Language Model Decoding with Speculative Sampling") and Theorem 1 /
Appendix A.1 of Leviathan et al. 2023 ("Fast Inference from Transformers via Speculative
Decoding") hold for any p and q, so warping both draft and target logits with temperature /
top-k / top-p before verification keeps the output distributed as the warped target.

The transforms are applied in this fixed order, all in float32:

  1. cast the logits to float32;
  2. temperature: divide by `temperature` (0 means greedy, see below);
  3. top-k: keep the k largest logits (Fan et al. 2018, "Hierarchical Neural Story Generation");
  4. top-p: keep the nucleus, the smallest set of most probable tokens whose cumulative
     probability under the distribution left by 2 and 3 is >= top_p (Holtzman et al. 2020,
     "The Curious Case of Neural Text Degeneration"); the most probable token is always kept;
  5. min-p: keep the tokens whose probability under the distribution left by 2 to 4 is at
     least min_p times the largest (Nguyen et al. 2024, "Turning Up the Heat: Min-p Sampling");
     the most probable token always passes;
  6. softmax over what is left.

This is the order of Hugging Face transformers' warpers (temperature, top-k, top-p, min-p) and
of vLLM's first sampler (min-p after top-k and top-p). Min-p compares probabilities with the
largest one, a ratio that renormalising does not change, so it commutes with top-k; with top-p
the order matters, and this is the one used here.

Parameters are data, one value per row (`Sampling`, arrays [B]), so that one compiled program
serves every setting and one batch may mix them: a greedy row beside a nucleus-sampled one. The
work follows the rows: greedy rows take the argmax, and the filters run only when some row of
the batch uses them (a `lax.cond`). They never sort the vocabulary when a few ranks settle them:
top-k and top-p each keep a prefix of the ranks, found among the best 256 logits, or the best
4,096 for the rows it does not end in, or else the whole vocabulary (`HEADS`).

Ties are broken deterministically by token id: tokens are ranked by descending float32 logit and,
among equal logits, by ascending id (a stable sort). Top-k keeps exactly the first k ranks and
top-p keeps a prefix of the ranks, so with logits [1, 3, 3, 3] and top_k=2 ids 1 and 2 are kept.
This also makes top_k=1 identical to greedy decoding, whose argmax picks the lowest id on ties.

Temperature 0 means greedy: the distribution is the one-hot of the argmax of the raw logits
(lowest id on ties), and top-k / top-p are irrelevant.

Masked tokens get a logit of -inf (never a large finite constant), and every step is written so
that finite or -inf logits never produce NaN: the logits are shifted so that the largest one is
exactly 0 *before* dividing by the temperature (softmax is shift-invariant, and this keeps huge
logits such as float32 max from overflowing to inf), and the top-ranked token always survives
masking, so the final softmax always has a term exp(0) = 1 in its denominator. A row whose logits
are all -inf is treated like a row of equal logits (uniform over the vocabulary under sampling,
id 0 under greedy), since there is no better-defined answer and NaN would poison the caller.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from specjax.sampling.params import SamplingParams

__all__ = ["Sampling", "SamplingParams", "probs_from_logits", "sample", "sample_rows", "has_nan"]


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Sampling:
    """Sampling parameters as data: one value per row, arrays [B] (or scalars, [] each).

    Built from validated `SamplingParams` (`Sampling.of`); a row with temperature 0 is greedy.
    """

    temperature: jax.Array      # float32
    top_k: jax.Array            # int32, 0 = off
    top_p: jax.Array            # float32, 1 = off
    min_p: jax.Array            # float32, 0 = off

    @staticmethod
    def of(settings) -> "Sampling":
        """Per-row arrays from a sequence of `SamplingParams` (numpy, placed by the caller)."""
        return Sampling(temperature=np.array([s.temperature for s in settings], np.float32),
                        top_k=np.array([s.top_k for s in settings], np.int32),
                        top_p=np.array([s.top_p for s in settings], np.float32),
                        min_p=np.array([s.min_p for s in settings], np.float32))

    @staticmethod
    def scalar(params: SamplingParams) -> "Sampling":
        return Sampling(*(jnp.asarray(v, d) for v, d in (
            (params.temperature, jnp.float32), (params.top_k, jnp.int32),
            (params.top_p, jnp.float32), (params.min_p, jnp.float32))))

    def replace(self, **changes) -> "Sampling":
        return dataclasses.replace(self, **changes)


# How many ranks the filters look at first: the best 256 logits, then the best 4,096, then the
# whole vocabulary: the best few ranks cost a small part of a full sort, and a nucleus seldom
# ends past rank 256, almost never past 4,096 (docs/benchmarks.md, "Sampling").
HEADS = (256, 4096)


def _per_row(value: jax.Array, ndim: int) -> jax.Array:
    """[B] (or []) -> [B, 1, .., 1] with `ndim` axes, to broadcast against [B, ..., V]."""
    return value.reshape(value.shape + (1,) * (ndim - value.ndim))


def probs_from_logits(logits: jax.Array, params: Sampling | SamplingParams) -> jax.Array:
    """Turn logits into the float32 distribution that is sampled from (see module docstring).

    Args:
      logits: [B, ..., V] (or [..., V] with scalar parameters) logits of any float dtype;
        entries may be -inf (masked tokens).
      params: per-row `Sampling` (arrays [B]: row b of the logits uses entry b), or one
        `SamplingParams` for every row.

    Returns:
      [..., V] float32 probabilities that sum to 1 along the last axis. Works under jit and vmap
      and for any number of leading dimensions.
    """
    if isinstance(params, SamplingParams):
        params = Sampling.scalar(params)
    return _probs(jnp.asarray(logits), params)


@functools.partial(jax.jit, static_argnames="heads")
def _probs(logits: jax.Array, params: Sampling, heads: tuple[int, ...] = HEADS) -> jax.Array:
    """`probs_from_logits`, jitted once per shape: called eagerly (tests, exact laws) its
    `lax.cond`s would otherwise be traced again at every call; inside a jitted program it is
    inlined. `heads`: see `HEADS` (tests pass small ones to reach the wider lookups)."""
    x = logits.astype(jnp.float32)  # [..., V]
    vocab, ndim = x.shape[-1], x.ndim
    temperature = _per_row(params.temperature, ndim)                      # [B, 1, .., 1]
    greedy = temperature == 0

    def argmax():
        # jnp.argmax returns the first (lowest) id among equal maxima.
        return jax.nn.one_hot(jnp.argmax(x, axis=-1), vocab, dtype=jnp.float32)

    def sampled():
        # Shift so that the largest logit is exactly 0, then apply the temperature. Entries
        # equal to the max are set to 0 explicitly rather than computed as x - max, so that a
        # row of all -inf gives zeros (uniform) instead of -inf - -inf = NaN. Dividing values in
        # [-inf, 0] by a positive temperature cannot overflow to +inf, even for float32-max
        # logits. Greedy rows divide by 1 (their result is the argmax).
        x_max = jnp.max(x, axis=-1, keepdims=True)  # [..., 1]
        scaled = jnp.where(x == x_max, 0.0, x - x_max) / jnp.where(greedy, 1.0, temperature)
        top_k = _per_row(params.top_k, ndim)
        top_k = jnp.where((top_k > 0) & (top_k < vocab), top_k, vocab)     # vocab = off
        top_p = _per_row(params.top_p, ndim)
        min_p = _per_row(params.min_p, ndim)
        filtered = (top_k < vocab) | (top_p < 1.0) | (min_p > 0.0)
        return jnp.where(greedy, argmax(), lax.cond(
            jnp.any(filtered & ~greedy),
            lambda: _filtered(x, scaled, top_k, top_p, min_p, ~greedy, heads),
            lambda: jax.nn.softmax(scaled, axis=-1)))

    # The work follows the rows: an all-greedy batch computes the argmax only.
    return lax.cond(jnp.all(greedy), argmax, sampled)


def _filtered(x, scaled, top_k, top_p, min_p, active, heads):
    """Transforms 3 to 6 of the module docstring: the distribution left by top-k, top-p and
    min-p (each a no-op for rows where it is off: top_k = V, top_p = 1, min_p = 0). Only the
    `active` rows' results are used (the sampled ones: greedy rows take the argmax).

    Each filter keeps a prefix of the ranks, so top-k and the nucleus are each fixed by the
    (logit, id) of the last token they keep, which `_last_kept` finds among the best few ranks.
    Min-p needs no ranks: the top token's scaled logit is exactly 0, so a token passes when
    exp(scaled) >= min_p, the ratio to the largest probability, which renormalising keeps."""
    vocab = x.shape[-1]
    # Rank -0.0 with 0.0, as equal logits (lax.top_k would put 0.0 first).
    x = jnp.where(x == 0, 0.0, x)
    weights = jnp.exp(scaled)                                   # [..., V], 1 for the top token
    ids = lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)  # [..., V]
    lazy = jnp.broadcast_to(~active[..., 0], x.shape[:-1])      # rows whose result is unused

    def up_to(last):
        """[..., V] the tokens ranked at or before last = (logit, id) [...]: a higher logit, or
        an equal one and an id no larger (ties rank by ascending id)."""
        value, token = last[0][..., None], last[1][..., None]
        return (x > value) | ((x == value) & (ids <= token))

    def along(value):
        """A per-row setting [B, 1, .., 1] as an array over x's rows [...]."""
        return jnp.broadcast_to(value[..., 0], x.shape[:-1])

    def top_k_last(values, _, row):
        """Rank k - 1, sure when the head holds it (or top-k is off)."""
        k = row["k"]
        return (jnp.minimum(k, values.shape[-1]) - 1,
                (k <= values.shape[-1]) | (k >= vocab) | row["lazy"])

    in_top_k = (top_k >= vocab) | up_to(_last_kept(
        x, top_k_last, {"k": along(top_k), "lazy": lazy}, heads))
    total = jnp.sum(jnp.where(in_top_k, weights, 0.0), axis=-1, keepdims=True)  # [..., 1]

    def nucleus_last(values, head_ids, row):
        """The nucleus over what top-k left: a rank is kept while the mass strictly before it
        is < top_p, so the kept ranks are the smallest prefix reaching top_p, and at least rank
        0 (a top_p below the float32 range rounds to 0). Sure when the head's mass reaches
        top_p, or top-k ends within the head, or the nucleus is off."""
        width = values.shape[-1]
        ranks = jnp.arange(width)
        k, p = row["k"][:, None], row["p"]
        probs = jnp.where(ranks < k, jnp.take_along_axis(row["weights"], head_ids, axis=-1), 0.0)
        cum = jnp.cumsum(probs / row["total"][:, None], axis=-1)   # [N, W]
        last = jnp.sum(cum[:, :-1] < p[:, None], axis=-1)           # ranks 1..W-1 kept
        sure = (cum[:, -1] >= p) | (row["k"] <= width) | (p >= 1.0) | row["lazy"]
        return last, sure

    in_nucleus = (top_p >= 1.0) | up_to(_last_kept(
        x, nucleus_last, {"k": along(top_k), "p": along(top_p), "weights": weights,
                          "total": total[..., 0], "lazy": lazy}, heads))
    # Rank 0 survives all three: k >= 1, the nucleus keeps it, and its weight 1 >= min_p.
    keep = in_top_k & in_nucleus & (weights >= min_p)
    return jax.nn.softmax(jnp.where(keep, scaled, -jnp.inf), axis=-1)


def _last_kept(x, count, context, heads):
    """([...] logit, [...] id) of each row's last kept rank, for a filter that keeps a prefix of
    the ranks. `count(values, ids, context)`, given the best W logits of some rows (descending,
    lowest id first among ties), their ids and those rows of `context` (arrays whose leading
    axes are x's), returns the rank of the last kept one (< W) and whether the kept prefix
    surely ends within those W. Rows not sure are looked up again in the next, wider head, the
    last being the whole vocabulary. Each row takes the answer of the first head it is sure in,
    so its result never depends on the other rows of its batch."""
    lead, vocab = x.shape[:-1], x.shape[-1]
    rows = lambda a: a.reshape((-1,) + a.shape[len(lead):])               # noqa: E731
    last = _last_kept_rows(x.reshape(-1, vocab), count, jax.tree.map(rows, context), heads)
    return jax.tree.map(lambda a: a.reshape(lead), last)


def _last_kept_rows(x, count, context, heads):
    """`_last_kept` for rows x [N, V]. A wider head looks up only the rows not sure in this one
    when they are at most an eighth of the batch (gathered, then put back): at T = 1 a few rows
    of 64 pass rank 256 at most steps, and the whole batch's best 4,096 cost more than its
    forward pass. More of them, and every row is looked up again."""
    n, vocab = x.shape
    width = min(heads[0], vocab) if heads else vocab
    values, ids = lax.top_k(x, width)                           # [N, W] best first
    rank, sure = count(values, ids, context)
    last = (jnp.take_along_axis(values, rank[:, None], axis=-1)[:, 0],
            jnp.take_along_axis(ids, rank[:, None], axis=-1)[:, 0])
    if width == vocab:
        return last
    few = n // 8

    def wider_all():
        return _last_kept_rows(x, count, context, heads[1:])

    def wider_few():
        (picked,) = jnp.nonzero(~sure, size=few, fill_value=0)  # [few] the rows not sure
        there = _last_kept_rows(x[picked], count, jax.tree.map(lambda a: a[picked], context),
                                heads[1:])
        return jax.tree.map(lambda here, new: here.at[picked].set(new), last, there)

    branches = [lambda: last, wider_all] + ([wider_few] if few else [])
    unsure = jnp.sum(~sure)
    which = jnp.where(unsure == 0, 0, jnp.where(unsure <= few, len(branches) - 1, 1))
    wider = lax.switch(which, branches)
    return jax.tree.map(lambda here, there: jnp.where(sure, here, there), last, wider)


def sample(key: jax.Array, probs: jax.Array) -> jax.Array:
    """Draw one token id per row from `probs`.

    Uses the Gumbel-max trick on log(probs) (jax.random.categorical). Tokens with probability 0
    get log 0 = -inf and can never be drawn, unlike inverse-CDF sampling, where float32 rounding
    of the cumulative sum can land on a zero-probability id.

    Args:
      key: a single PRNG key; rows get independent draws from it.
      probs: [..., V] probabilities (e.g. from `probs_from_logits`).

    Returns:
      [...] int32 token ids in [0, V).
    """
    log_probs = jnp.log(jnp.asarray(probs))  # [..., V], -inf where probs == 0
    return jax.random.categorical(key, log_probs, axis=-1).astype(jnp.int32)


def sample_rows(keys: jax.Array, probs: jax.Array) -> jax.Array:
    """`sample` for each row of a batch: keys [B], probs [B, V] -> [B] int32, draw for draw.

    When every row has a single token of nonzero probability (greedy decoding, where every
    distribution is one-hot), `sample` can only return that token: log(probs) has one finite
    entry, and the Gumbel-max trick's argmax lands on it whatever the noise. The draw is then
    that argmax, without the B x V Gumbel variates, which can cost a large part of a batched
    greedy step (docs/benchmarks.md). Otherwise every row is drawn by `sample`. The two
    branches are a `lax.cond` on the batch, so a program runs one.
    """
    one_token = jnp.all(jnp.sum(probs > 0, axis=-1) == 1)
    return lax.cond(one_token,
                    lambda: jnp.argmax(probs, axis=-1).astype(jnp.int32),
                    lambda: jax.vmap(sample)(keys, probs))


def has_nan(logits: jax.Array) -> jax.Array:
    """[..., V] -> [...] bool: whether a row of logits contains NaN (a broken model or input)."""
    return jnp.isnan(logits).any(axis=-1)
