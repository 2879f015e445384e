"""The speculative verify step: modified rejection sampling, where Theorem 1 lives.

Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative Sampling",
Algorithm 2, and Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding", Algorithm 1.

Letters follow Chen et al.: **p is the draft** model's distribution and **q is the target**
model's distribution. Leviathan et al. use the opposite letters (their p is the target, q the
draft, and they accept when q(x) <= p(x) or r < p(x)/q(x)); swap them when reading side by side.

The Steps are Algorithm 2's, numbered as in docs/walkthrough.md. Step 1 (draft) gives each row
K drafted tokens x_1..x_K with x_i ~ p_i, and Step 2 (score) the target's q_1..q_{K+1} from one
call. Verifying is the rest, for each batch row:

  Step 3 (accept or resample): draw u_i ~ U[0, 1) and accept x_i iff u_i * p_i(x_i) < q_i(x_i),
      i.e. with probability min(1, q_i(x_i) / p_i(x_i)), written without a division so that
      p_i(x_i) = 0 needs no special case. The first rejection ends the step: n is the number of
      *leading* accepts, and if n < K the next token is drawn from the residual
      normalize(max(q_{n+1} - p_{n+1}, 0)) at the first rejected position.
  Step 4 (bonus): if n = K, draw the bonus token from q_{K+1}; the target computed it for free.
      (A row that drafted only m < K tokens and had all m accepted draws from q_{m+1} here.)

The row emits x_1..x_n followed by the next token: between 1 and K + 1 tokens. Theorem 1 (Chen et
al.; Leviathan et al. Appendix A.1): each emitted token is distributed exactly as q. The paper
indexes positions from 1; arrays here index from 0, so q_{n+1} is `target_probs[n]` and the bonus
distribution q_{K+1} is `target_probs[K]`.

Degenerate cases are defined rather than left to NaN: q(x) = 0 always rejects x; p(x) = 0 (a
token the draft could not have drawn) accepts iff q(x) > 0; a residual with no mass (p = q, where
rejection has probability 0 anyway) is replaced by q.

A deterministic draft (n-gram / prompt lookup, or a greedy draft model) is the one-hot p of the
proposed token: x is then accepted with probability q(x), and the residual is q with x removed
and renormalized, so n-gram decoding is lossless under sampling with no separate code path. With
one-hot target distributions too (temperature 0), acceptance means "x is the target's argmax" and
the residual is the target's argmax: greedy verification falls out of the same code.

`verify` is built from `acceptance_probability`, `accepts`, `num_leading_accepted` and
`residual_distribution`, and `emitted_token_law` computes the exact law of an emitted token from
the same helpers, so a test of that law tests the sampler. The helpers keep float64 inputs in
float64 (under `jax.enable_x64`) for exact tests, and compute in float32 otherwise.

For one row in plain NumPy, inside the whole loop: `specjax.reference` (`verify_row`,
`verify_tree`), held to the same decisions on the same uniform draws (tests/exactness/test_reference.py).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from specjax.sampling.logits import sample_rows
from specjax.sampling.tree import RowTrees

__all__ = ["RULES", "Verdict", "TreeVerdict", "acceptance_probability", "accepts",
           "num_leading_accepted", "residual_distribution", "emitted_token_law", "verify",
           "candidate_distribution", "after_rejection", "verify_tree"]


def _as_float(*arrays: jax.Array) -> list[jax.Array]:
    """Cast to a common float dtype of at least float32 (float64 stays float64 under x64)."""
    dtype = jnp.result_type(*arrays, jnp.float32)
    return [jnp.asarray(a, dtype=dtype) for a in arrays]


def acceptance_probability(p_x: jax.Array, q_x: jax.Array) -> jax.Array:
    """Probability min(1, q(x) / p(x)) of accepting a drafted token x (elementwise, any shape).

    This is the probability, over u ~ U[0, 1), of `accepts(u, p_x, q_x)`. When p(x) = 0 it is 1
    if q(x) > 0 and 0 otherwise.
    """
    p_x, q_x = _as_float(p_x, q_x)
    ratio = q_x / jnp.where(p_x > 0, p_x, 1.0)
    return jnp.where(p_x > 0, jnp.minimum(1.0, ratio), (q_x > 0).astype(p_x.dtype))


def accepts(u: jax.Array, p_x: jax.Array, q_x: jax.Array) -> jax.Array:
    """The accept test u * p(x) < q(x) for u ~ U[0, 1) (elementwise, any shape) -> bool.

    Equivalent to u < q(x) / p(x) without the division: q(x) = 0 never accepts, and p(x) = 0
    accepts iff q(x) > 0.
    """
    return u * p_x < q_x


def num_leading_accepted(accepted: jax.Array) -> jax.Array:
    """[..., K] bool -> [...] int32: the number of accepts before the first rejection.

    This is where the first rejection stops everything: [True, False, True] gives 1, not 2.
    """
    return jnp.sum(jnp.cumprod(accepted.astype(jnp.int32), axis=-1), axis=-1).astype(jnp.int32)


def residual_distribution(p: jax.Array, q: jax.Array) -> jax.Array:
    """The distribution sampled from after a rejection: normalize(max(q - p, 0)).

    Args:
      p: [..., V] draft probabilities.
      q: [..., V] target probabilities.

    Returns:
      [..., V] probabilities (float32, or float64 for float64 inputs under x64). Where the
      residual has no mass (p = q, so a rejection cannot happen), q is returned instead of 0/0.
    """
    p, q = _as_float(p, q)
    excess = jnp.maximum(q - p, 0.0)  # [..., V]
    mass = jnp.sum(excess, axis=-1, keepdims=True)  # [..., 1]
    return jnp.where(mass > 0, excess / jnp.where(mass > 0, mass, 1.0), q)


def emitted_token_law(p: jax.Array, q: jax.Array) -> jax.Array:
    """Exact law of the token emitted at one draft position, from the sampler's own helpers.

    With a(x) = acceptance_probability(p(x), q(x)) and r = residual_distribution(p, q):

        law(y) = p(y) a(y) + (sum_x p(x) (1 - a(x))) r(y)

    (draft y and accept it, or draft anything, reject it and draw y from the residual).
    Theorem 1 says law == q. Computed in float64 when given float64 inputs under x64.

    Args:
      p: [..., V] draft probabilities.
      q: [..., V] target probabilities.

    Returns:
      [..., V] the law of the emitted token.
    """
    p, q = _as_float(p, q)
    a = acceptance_probability(p, q)  # [..., V]
    reject_mass = jnp.sum(p * (1.0 - a), axis=-1, keepdims=True)  # [..., 1]
    return p * a + reject_mass * residual_distribution(p, q)


class Verdict(NamedTuple):
    """What `verify` decides for each row: it emits draft_tokens[:n_accepted], then next_token."""
    n_accepted: jax.Array       # [B] int32 in [0, K]: the leading drafted tokens accepted
    next_token: jax.Array       # [B] int32: the residual sample after a rejection, else the bonus
    details: dict | None = None  # with `with_details`, the step's numbers (`specjax.explain`)


class _RowVerdict(NamedTuple):
    """One row's verdict before its next token is drawn (`verify` draws it for the batch)."""
    n_accepted: jax.Array       # [] int32
    next_key: jax.Array         # the key the next token is drawn with
    next_dist: jax.Array        # [V] the law it is drawn from: the residual, or q
    details: dict               # p_x, q_x, u [K] and the residual [V] (zero without a rejection)


def _verify_row(draft_tokens, draft_probs, target_probs, key, num_drafted) -> _RowVerdict:
    """One row of `verify`: draft_tokens [K] int, draft_probs [K, V], target_probs [K + 1, V],
    one PRNG key, and num_drafted [] int (the positions past it were not drafted)."""
    num_draft = draft_tokens.shape[0]
    k_accept, k_residual, k_bonus = jax.random.split(key, 3)

    # p_i(x_i) and q_i(x_i) of the drafted tokens.
    token_idx = draft_tokens[:, None]  # [K, 1]
    p_x = jnp.take_along_axis(draft_probs, token_idx, axis=-1)[:, 0]  # [K]
    q_x = jnp.take_along_axis(target_probs[:num_draft], token_idx, axis=-1)[:, 0]  # [K]

    # Step 3 (accept or resample): accept x_i iff u_i * p_i(x_i) < q_i(x_i), up to a rejection.
    u = jax.random.uniform(k_accept, (num_draft,), dtype=p_x.dtype)  # [K]
    drafted = jnp.arange(num_draft) < num_drafted  # [K]
    n_accepted = num_leading_accepted(accepts(u, p_x, q_x) & drafted)  # []

    # Steps 3 and 4 (accept or resample, bonus): the next token comes from the residual at the
    # first rejected position (0-based index n), or, when every drafted token was accepted,
    # from q at the first position not drafted (the bonus q_{K+1} when all K were). The key is
    # picked by which of the two happened, not by K, so a row that drafted n tokens draws the
    # same token alone or padded to a longer call beside longer drafts.
    all_accepted = n_accepted >= jnp.minimum(num_drafted, num_draft)
    q_next = target_probs[n_accepted]  # [V]
    residual = residual_distribution(draft_probs[jnp.minimum(n_accepted, num_draft - 1)], q_next)
    # The draw itself is made for the whole batch (`sample_rows`), by the caller.
    next_key = jnp.where(all_accepted, k_bonus, k_residual)
    next_dist = jnp.where(all_accepted, q_next, residual)
    # What a reader of one step wants to see (`specjax.explain`), computed anyway.
    details = dict(p_x=p_x, q_x=q_x, u=u, residual=jnp.where(all_accepted, 0.0, residual))
    return _RowVerdict(n_accepted, next_key, next_dist, details)


def verify(
    draft_tokens: jax.Array,
    draft_probs: jax.Array,
    target_probs: jax.Array,
    keys: jax.Array,
    num_drafted: jax.Array | None = None,
    with_details: bool = False,
) -> Verdict:
    """Verify K drafted tokens per row against the target: Steps 3 and 4 (accept or resample,
    bonus) of Chen et al. 2023's Algorithm 2.

    Rows are independent, each with its own key. Pure and jittable (callers jit the whole
    decoding step); K, V and B are static, taken from the shapes.

    Args:
      draft_tokens: [B, K] int token ids x_1..x_K drawn from the draft, K >= 1.
      draft_probs: [B, K, V] the draft distributions p_1..p_K that x_1..x_K were drawn from.
      target_probs: [B, K + 1, V] the target distributions q_1..q_{K+1}: q_i is the target's
        distribution for position i given the prompt and x_1..x_{i-1}; q_{K+1} is the bonus.
      keys: [B] PRNG keys, one per row (`jax.random.split(key, B)`, new-style typed keys of
        shape [B] or raw uint32 keys of shape [B, 2]).
      num_drafted: optional [B] int, 0..K: a row drafted only its first num_drafted tokens
        (an n-gram lookup that found fewer than K). Later positions are never accepted; give
        them p = 0 so that the token after the last real draft is drawn from q itself.
      with_details: whether the verdict carries the step's numbers (`details`).

    Returns:
      A `Verdict`:
      n_accepted: [B] int32 in [0, K], the number of leading drafted tokens accepted.
      next_token: [B] int32 in [0, V): the residual sample at position n_accepted + 1 if
        n_accepted < K, else the bonus token from q_{K+1}. The row emits
        draft_tokens[:n_accepted] followed by next_token.
      details: None, or with `with_details` a dict of each row's p_i(x_i) and q_i(x_i) [B, K],
        the uniform draws u [B, K], and the residual it sampled from after a rejection ([B, V],
        zero when every drafted token was accepted), for `specjax.explain`.
    """
    if draft_tokens.ndim != 2 or draft_tokens.shape[1] < 1:
        raise ValueError(f"draft_tokens must have shape [B, K], K >= 1, got {draft_tokens.shape}")
    batch, num_draft = draft_tokens.shape
    vocab = draft_probs.shape[-1] if draft_probs.ndim else None
    for name, array, shape in (("draft_probs [B, K, V]", draft_probs, (batch, num_draft, vocab)),
                               ("target_probs [B, K + 1, V]", target_probs,
                                (batch, num_draft + 1, vocab))):
        if array.shape != shape:
            raise ValueError(f"{name} must have shape {shape}, got {array.shape}")
    if keys.ndim < 1 or keys.shape[0] != batch:
        raise ValueError(f"keys must hold one PRNG key per row ({batch}), got shape {keys.shape}")
    if num_drafted is None:
        num_drafted = jnp.full((batch,), num_draft, jnp.int32)
    rows = jax.vmap(_verify_row)(draft_tokens, draft_probs, target_probs, keys, num_drafted)
    return Verdict(rows.n_accepted, sample_rows(rows.next_key, rows.next_dist),
                   rows.details if with_details else None)


# -- Token trees: several candidates per node ---------------------------------------------------
#
# A tree step drafts, at each node n, up to w candidate children x_1..x_w (rank order) and the
# target scores every node in one call, giving q_n at each. The walk is Steps 3 and 4 (accept or
# resample, bonus) made on one sibling after another. It starts at the root with q' = q_root
# and tries the children in rank order:
#
#   a. accept x_r with probability min(1, q'(x_r) / p_r(x_r)), where p_r is the distribution
#      x_r was drawn from given the siblings drawn before it;
#   b. if rejected, q' <- normalize(max(q' - p_r, 0)), the residual, and try the next sibling;
#   c. if x_r is accepted, move to it and start again with q' = q_{x_r};
#   d. when a node has no child left to try, the next token is drawn from q': the final
#      residual if every child was rejected, or q at the node itself if it has no children, the
#      tree's Step 4 (bonus).
#
# Each sibling's test leaves the law of what is emitted equal to q' (the chain proof), and the
# residual passed to the next sibling does not depend on which token was rejected, so the rest
# of the walk, whatever x_r was, emits its residual's law. That needs p_r to be the true
# conditional law of x_r given the earlier siblings, which is what the candidate scheme decides:
#
#   rule "iid"                  candidates drawn i.i.d. from the node's draft p: p_r = p
#                               (SpecInfer's multi-step speculative sampling, Miao et al. 2024);
#   rule "without_replacement"  candidates drawn from p without replacement (Gumbel top-w):
#                               p_r = p with x_1..x_{r-1} removed and renormalised (Recursive
#                               Speculative Decoding, Jeon et al. 2024);
#   rule "deterministic"        candidates that are a function of the drafter's own state (the
#                               draft's top-w, n-gram lookups): p_r = one-hot(x_r), so x_r is
#                               accepted with probability q'(x_r) and rejecting it removes it
#                               from q'.
#
# A rule is exact for its scheme only: candidates drawn without replacement but verified with
# p_r = p over-accept the later siblings (a negative control in the tests shows it). Ranks must
# be contiguous (`Tree` refuses a path that skips one): a skipped rank would be a sibling drawn
# but never tried, and the conditional law of the next one would no longer be p_r. A sampled
# candidate with p_r(x) = 0 cannot have been drawn; it marks a sibling the drafter could not
# fill (p had fewer than w tokens) and is skipped like one the tree marks invalid.

RULES = ("iid", "without_replacement", "deterministic")


def candidate_distribution(rule: str, p: jax.Array, x: jax.Array) -> jax.Array:
    """p_r: the distribution [V] the next sibling x was drawn from, given `p` as the walk left
    it (for "without_replacement", already renormalised over what was not drawn)."""
    if rule == "deterministic":
        return jax.nn.one_hot(x, p.shape[-1], dtype=p.dtype)
    return p


def after_rejection(rule: str, p: jax.Array, q: jax.Array, x: jax.Array):
    """b of the walk: (p, q') for the next sibling after x was rejected. q' becomes the residual
    of q' against p_r, and a draw without replacement removes x from p."""
    p_r = candidate_distribution(rule, p, x)
    q = residual_distribution(p_r, q)
    if rule == "without_replacement":
        p = p.at[x].set(0.0)
        mass = jnp.sum(p)
        p = p / jnp.where(mass > 0, mass, 1.0)
    return p, q


class TreeVerdict(NamedTuple):
    """What `verify_tree` decides per row: it emits path[:n_accepted]'s tokens, then next_token."""
    n_accepted: jax.Array       # [B] int32: the depth the walk reached
    path: jax.Array             # [B, D] int32: the accepted node at each depth (entries past
    #                             n_accepted repeat the last node)
    next_token: jax.Array       # [B] int32: drawn from the final residual, or q at the last node
    details: dict | None = None  # with `with_details`, the walk's numbers (`specjax.explain`)


class _Trial(NamedTuple):
    """One sibling test of a walk, as `specjax.explain` shows it (each [] for one test, or
    stacked [D, W] by depth and rank)."""
    node: jax.Array             # the child tested, or -1 where none was
    p_x: jax.Array              # p_r(x): the law the candidate was drawn from given its elders
    q_x: jax.Array              # q'(x): the target's law at the parent less the rejected siblings
    accepted: jax.Array         # whether u * p_r(x) < q'(x)
    residual: jax.Array         # [V] q' for the next sibling after a rejection, else zero


class _RowWalk(NamedTuple):
    """One row's walk before its next token is drawn (`verify_tree` draws it for the batch)."""
    n_accepted: jax.Array       # [] int32
    path: jax.Array             # [D] int32
    next_key: jax.Array         # the key the next token is drawn with
    next_dist: jax.Array        # [V] the law it is drawn from: the final q'
    details: dict               # each sibling test [D, W], `final` [V], `from_residual` []


def _verify_tree_row(tree, rule, tokens, valid, draft_probs, target_probs, key) -> _RowWalk:
    """One row's walk. tokens, valid: [n]; draft_probs, target_probs: [n, V] (p_n, q_n)."""
    children = jnp.asarray(tree.children)                               # [n, W]
    depth, width = tree.max_depth, tree.max_width
    k_accept, k_next = jax.random.split(key)
    u = jax.random.uniform(k_accept, (depth, width), dtype=jnp.float32)
    p, q = _as_float(draft_probs[0], target_probs[0])                   # at the root
    node, walking, path = jnp.zeros((), jnp.int32), jnp.ones((), bool), []
    trials = []     # each sibling's test, for `specjax.explain` (unused otherwise: XLA drops it)
    for d in range(depth):
        moved = jnp.zeros((), bool)
        for r in range(width):
            child = children[node, r]
            x = tokens[jnp.maximum(child, 0)]
            p_r = candidate_distribution(rule, p, x)
            tried = walking & ~moved & (child >= 0) & valid[jnp.maximum(child, 0)] & (p_r[x] > 0)
            accept = tried & accepts(u[d, r], p_r[x], q[x])              # a
            p_next, q_next = after_rejection(rule, p, q, x)              # b
            rejected = tried & ~accept
            trials.append(_Trial(jnp.where(tried, child, -1), p_r[x], q[x], accept,
                                 jnp.where(rejected, q_next, 0.0)))
            p, q = jnp.where(rejected, p_next, p), jnp.where(rejected, q_next, q)
            node, moved = jnp.where(accept, child, node), moved | accept
        # c: at the accepted child, its own draft and target distributions.
        p_child, q_child = _as_float(draft_probs[node], target_probs[node])
        p, q = jnp.where(moved, p_child, p), jnp.where(moved, q_child, q)
        walking = walking & moved
        path.append(node)
    # d: the residual after the last rejections, or q at an accepted leaf (the bonus),
    # drawn for the whole batch by the caller (`sample_rows`).
    n_accepted = jnp.sum(jnp.asarray(tree.depth)[jnp.stack(path)] == jnp.arange(1, depth + 1))
    tests = jax.tree.map(lambda *a: jnp.stack(a).reshape(depth, width, *a[0].shape), *trials)
    details = dict(tests._asdict(), u=u, final=q,
                   from_residual=jnp.any(jnp.any(tests.node >= 0, axis=1)     # a level tried,
                                         & ~jnp.any(tests.accepted, axis=1)))  # none accepted
    return _RowWalk(n_accepted.astype(jnp.int32), jnp.stack(path), k_next, q, details)


def verify_tree(tree, rule: str, tokens: jax.Array, valid: jax.Array, draft_probs: jax.Array | None,
                target_probs: jax.Array, keys: jax.Array, with_details: bool = False
                ) -> TreeVerdict:
    """Verify a token tree per row (the walk above, a to d); lossless for the rule's scheme.

    Rows are independent, each with its own key. Pure and jittable; the tree is static.

    Args:
      tree: the static `specjax.sampling.tree.Tree`, n = tree.size + 1 nodes, node 0 the root,
        or `RowTrees`, one such topology per row (as data).
      rule: one of `RULES`, the one matching how the candidates were drawn (see above).
      tokens: [B, n] int the nodes' tokens (the root's is not read).
      valid: [B, n] bool: nodes the drafter filled; others (and their subtrees) are never tried.
      draft_probs: [B, n, V] p_n, the draft distribution node n's children were drawn from, or
        None for the deterministic rule, which does not read it.
      target_probs: [B, n, V] q_n, the target's distribution for the token after node n.
      keys: [B] PRNG keys.
    Returns:
      A `TreeVerdict`: n_accepted [B] int32 (the depth reached), path [B, D] int32 (the
      accepted node at each depth; entries past n_accepted repeat the last node) and next_token
      [B] int32. The row emits the tokens of path[:n_accepted] followed by next_token.
      Its details are None, or with `with_details` (for `specjax.explain`) a dict: each sibling
      test, [B, D, W] by depth and rank (`node`, the child tested or -1; `p_x` = p_r(x); `q_x` =
      q'(x); `u`; `accepted`; `residual` [B, D, W, V], q' after a rejection, else zero), `final`
      [B, V], the law the next token was drawn from (the last residual, or q at the node the
      walk stopped on), and `from_residual` [B], whether every child it last tried was rejected.
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
    n = tree.size + 1
    if tokens.shape[1:] != (n,) or target_probs.shape[1] != n:
        raise ValueError(f"a tree of {tree.size} nodes needs tokens [B, {n}] and target_probs "
                         f"[B, {n}, V], got {tokens.shape} and {target_probs.shape}")
    if draft_probs is None:
        if rule != "deterministic":
            raise ValueError(f"rule {rule!r} needs the draft distributions (draft_probs)")
        draft_probs = jnp.zeros_like(target_probs)      # never read by the deterministic rule
    if isinstance(tree, RowTrees):       # one topology per row (an EAGLE-2 dynamic tree)
        rows = jax.vmap(lambda t, *a: _verify_tree_row(t, rule, *a))(
            tree, tokens, valid, draft_probs, target_probs, keys)
    else:
        rows = jax.vmap(lambda *a: _verify_tree_row(tree, rule, *a))(
            tokens, valid, draft_probs, target_probs, keys)
    return TreeVerdict(rows.n_accepted, rows.path, sample_rows(rows.next_key, rows.next_dist),
                       rows.details if with_details else None)
