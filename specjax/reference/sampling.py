"""From logits to the distribution sampled from, draws, and the accept test: one row, NumPy.

`probs` is `specjax.sampling.logits`'s definition in the same order and with the same tie rule:
temperature, top-k, top-p over what top-k left, min-p, softmax; ties ranked by ascending id;
temperature 0 the one-hot of the argmax (the lowest id among equal maxima). The filters decide
in float32, as the engine does; the softmax is taken in float64, so that a distribution sums to
1 to float64's precision for the draws.

`verify_row` is Steps 3 and 4 (accept or resample, bonus) of Chen et al. 2023's Algorithm 2 for
a chain, `verify_tree` the walk over siblings of a token tree (`specjax.sampling.rejection`'s
comment before `RULES` derives it); both on uniform draws given to them, so that a test can hand
them the engine's and compare the decisions. Letters as Chen et al.'s: p is the draft's
distribution, q the target's (Leviathan et al. swap them). Positions count from 0 here where
the paper counts from 1: q_{n+1}, the target's distribution at the first rejected draft, is
`q[n]`.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import numpy as np

__all__ = ["RULES", "Sampling", "draw", "probs", "residual", "settings", "verify_row",
           "verify_tree"]


class Sampling(NamedTuple):
    """The four settings of the law (a `specjax.SamplingParams`'s first four fields)."""
    temperature: float = 1.0     # >= 0; 0 is greedy
    top_k: int = 0               # >= 0; 0 (or >= V) is off
    top_p: float = 1.0           # in (0, 1]; 1 is off
    min_p: float = 0.0           # in [0, 1]; 0 is off


# A `SamplingParams`'s controls and their "off" values: the reference samples without them.
_CONTROLS = dict(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
                 logit_bias=None, min_tokens=0, regex=None, json_schema=None)


def settings(sampling=None) -> Sampling:
    """`sampling` (None: temperature 1; a `Sampling`; or any object with the four fields, such
    as a `specjax.SamplingParams` with one value per field and no controls) as a checked
    `Sampling`."""
    if sampling is None:
        return Sampling()
    if not all(hasattr(sampling, name) for name in Sampling._fields):
        raise TypeError(f"sampling must have the fields {', '.join(Sampling._fields)} (a "
                        f"SamplingParams or reference.Sampling), got {sampling!r}")
    for name, off in _CONTROLS.items():
        if getattr(sampling, name, off) not in (off, {}):
            raise ValueError(f"the reference samples without controls: {name} must be {off!r}, "
                             f"got {getattr(sampling, name)!r}")
    s = Sampling(*(getattr(sampling, name) for name in Sampling._fields))
    for name, allowed, ok in (
            ("temperature", ">= 0 and finite", lambda v: 0 <= v < math.inf),
            ("top_k", "an integer >= 0", lambda v: isinstance(v, numbers.Integral) and v >= 0),
            ("top_p", "in (0, 1]", lambda v: 0 < v <= 1),
            ("min_p", "in [0, 1]", lambda v: 0 <= v <= 1)):
        value = getattr(s, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not ok(value):
            raise ValueError(f"sampling.{name} must be one number {allowed}, got {value!r}")
    return s


def probs(logits: np.ndarray, sampling: Sampling) -> np.ndarray:
    """The distribution [V] (float64) sampled from after logits [V]."""
    x = np.asarray(logits, np.float32)
    vocab = len(x)
    if sampling.temperature == 0:
        return np.eye(vocab)[np.argmax(x)]                 # argmax: the lowest id on ties
    # Shift the largest logit to exactly 0 before dividing, so that nothing overflows; a row of
    # -inf becomes a row of zeros (uniform) rather than NaN.
    top = x.max()
    with np.errstate(invalid="ignore"):                           # -inf - -inf, not kept
        scaled = np.where(x == top, np.float32(0), x - top) / np.float32(sampling.temperature)
    top_k = sampling.top_k if 0 < sampling.top_k < vocab else vocab    # 0 or >= V: off
    if top_k == vocab and sampling.top_p == 1 and sampling.min_p == 0:
        weights = np.exp(scaled.astype(np.float64))                   # no filter: the softmax
        return weights / weights.sum()
    weights = np.exp(scaled)                                      # [V], 1 for the top token
    keep = np.ones(vocab, bool)
    if top_k < vocab or sampling.top_p < 1:
        order = np.argsort(-np.where(x == 0, 0, x), kind="stable")   # ranks: logit down, id up
        keep[order[top_k:]] = False                                     # top-k
        # The nucleus over what top-k left: a rank is kept while the mass before it is < top_p.
        left = np.where(keep, weights, np.float32(0))
        cumulative = np.cumsum(left[order] / left.sum())
        keep[order[1 + np.count_nonzero(cumulative[:-1] < np.float32(sampling.top_p)):]] = False
    # Min-p: the top token's scaled logit is 0, so exp(scaled) is the ratio to the largest
    # probability, which renormalising does not change.
    keep &= weights >= np.float32(sampling.min_p)
    kept = np.where(keep, np.exp(scaled.astype(np.float64)), 0.0)
    return kept / kept.sum()


def draw(rng: np.random.Generator, p: np.ndarray) -> int:
    """One token from the distribution p [V], by one uniform draw: the first token whose
    cumulative probability exceeds u times the total. A token of probability 0 adds nothing to
    the sum, so it is never the first to exceed it."""
    cumulative = np.cumsum(p)
    return int(min(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"),
                   len(p) - 1))


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """normalize(max(q - p, 0)), what a rejection leaves; q itself when that has no mass (p = q,
    where a rejection has probability 0)."""
    excess = np.maximum(q - p, 0.0)
    mass = excess.sum()
    return excess / mass if mass > 0 else q


def verify_row(p: np.ndarray, q: np.ndarray, drafted: list[int], u: np.ndarray):
    """The accept test and what follows it, for one row.

    Args:
      p: [k, V] the draft distributions; q: [k + 1, V] the target's; drafted: the k drafted
        tokens; u: [k] uniform draws in [0, 1).
    Returns:
      n, the number of leading drafts accepted, and the distribution [V] the next token is
      drawn from: the residual at the first rejection, or the bonus q_{k+1}.
    """
    for i, x in enumerate(drafted):
        # Step 3 (accept or resample): accept x_i with probability min(1, q_i(x) / p_i(x)),
        # written without the division so that p_i(x) = 0 needs no special case.
        if not u[i] * p[i, x] < q[i, x]:
            # The first rejection ends the step: draw from normalize(max(q_i - p_i, 0)).
            return i, residual(p[i], q[i])
    # Step 4 (bonus): every draft accepted, the next token is drawn from q one position on.
    return len(drafted), q[len(drafted)]


# How a node's candidates were drawn, which decides the law each was drawn from (p_r below):
# i.i.d. from the node's p, from p without replacement, or as a function of the drafter's state
# (one-hot: the draft's top tokens, n-gram lookups). The names are `rejection.RULES`.
RULES = ("iid", "without_replacement", "deterministic")


def verify_tree(children, tokens, p, q, u: np.ndarray, rule: str, valid=None):
    """The walk over a token tree's siblings, for one row: Steps 3 and 4 (accept or resample,
    bonus) tried on one sibling after another.

    Args:
      children: [n][W] the rank-r child of each node, or -1 (node 0 is the root, the row's
        last token); tokens: [n] each node's token; p, q: [n, V] the draft's distribution its
        children were drawn from (unread under "deterministic") and the target's after it;
        u: [depth, W] uniform draws, u[d, r] for the rank-r sibling tried at depth d + 1;
        rule: one of `RULES`; valid: [n] the nodes the drafter filled (default all).
    Returns:
      the accepted nodes from the root down, and the distribution [V] the next token is drawn
      from: the residual after the last rejection, or q at the last accepted node (the bonus).
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
    valid = np.ones(len(tokens), bool) if valid is None else valid
    node, path = 0, []
    p_now, q_now = (None if p is None else p[0]), q[0]
    for depth in range(len(u)):
        for r, child in enumerate(children[node]):
            if child < 0 or not valid[child]:
                continue                       # no such sibling, or one the drafter left empty
            x = tokens[child]
            # p_r: the law sibling r was drawn from, given the siblings drawn before it.
            p_r = np.eye(len(q_now))[x] if rule == "deterministic" else p_now
            if p_r[x] == 0:
                continue                       # it cannot have been drawn: an unfilled sibling
            if u[depth, r] * p_r[x] < q_now[x]:
                node = child                   # accepted: go down, with the child's p and q
                break
            q_now = residual(p_r, q_now)       # rejected: the next sibling faces the residual
            if rule == "without_replacement":  # and p without the token drawn
                taken = np.where(np.arange(len(p_now)) == x, 0.0, p_now)
                p_now = taken / taken.sum() if taken.sum() > 0 else taken
        else:
            return path, q_now                 # every child rejected, or none: stop here
        path.append(node)
        p_now, q_now = (None if p is None else p[node]), q[node]
    return path, q_now


# -- The coupled rule (`specjax.sampling.coupled`) -----------------------------------------------
#
# The token at position t is the target's Gumbel-max draw argmax(log q_t + g_t), with noise g_t
# that depends on the row's seed and t only. A draft is kept while it equals that draw; the first
# that does not is replaced by it. Every emitted token is then the target's own draw.

def gumbel_draw(p: np.ndarray, g: np.ndarray) -> int:
    """argmax(log p + g): the Gumbel-max draw from p [V] with the noise g [V] (a token of
    probability 0 has log 0 = -inf and is never drawn)."""
    with np.errstate(divide="ignore"):
        return int(np.argmax(np.log(p) + g))


def coupled_verify_row(q: np.ndarray, drafted: list[int], g: np.ndarray):
    """The coupled rule over a chain, for one row: q [k + 1, V], the k drafts and the noise g
    [k + 1, V] of their positions. Returns n, the leading drafts equal to the target's draws, and
    the next token, the target's draw after them."""
    for i, x in enumerate(drafted):
        y = gumbel_draw(q[i], g[i])
        if x != y:
            return i, y
    return len(drafted), gumbel_draw(q[len(drafted)], g[len(drafted)])


def coupled_verify_tree(children, tokens, q, g: np.ndarray, valid=None):
    """The coupled walk over a token tree, for one row: from the root, move to the child whose
    token is the target's draw at the node, while there is one. children, tokens, valid as in
    `verify_tree`; q [n, V]; g [depth + 1, V] the noise by depth. Returns the accepted nodes from
    the root down and the next token (the draw at the node the walk stopped on)."""
    valid = np.ones(len(tokens), bool) if valid is None else valid
    node, path = 0, []
    while True:
        y = gumbel_draw(q[node], g[len(path)])
        kept = [c for c in children[node] if c >= 0 and valid[c] and tokens[c] == y]
        if not kept or len(path) == len(g) - 1:
            return path, y
        node = kept[0]
        path.append(node)
