"""The coupled rule: the same seed gives the same text with and without speculation.

Autoregressive sampling draws the token at absolute position t of a row as a Gumbel-max draw,

    y_t = argmax_v (log q_t(v) + g_t(v)),   g_t = Gumbel noise from the key fold_in(row key, t)

(`sampling.logits.sample` with `state.position_keys`), so y_t is a function of the target's
distribution there, the row's seed and t alone: not of the step, the batch or the drafts.

A verify call computes q at every drafted position in one call, and each q equals the one a
one-token step computes there bit for bit (the kernels' and XLA's contract), so the verifier can
compute the target's own draw y_t at every position at once. The coupled rule keeps the drafts
while they equal it, and at the first that does not it emits y_t instead:

    chain   keep x_1..x_n, the longest prefix with x_i = y_i, then emit y_{n+1};
    tree    from the root, move to the child whose token is the target's draw at the node's
            position, while there is one, then emit the draw at the node where the walk stopped.

Every emitted token is the target's draw at its position, so the row is autoregressive
sampling's row under the same seed, whatever the drafts were: lossless by construction, for any
drafter, any candidate scheme and any control (they shape q before the draw, as in a one-token
step). At temperature 0, q is one-hot and the draw is its argmax: the greedy rule.

A draft is kept only when it equals the target's draw, so the drafter draws with the same noise:
a chain's draft at position t is argmax(log p_t + g_t) (`Rules.propose` given the position's key),
and a tree's candidates at depth d are the top W of log p + g_t for the position t of that depth
(Gumbel-top-k with the noise the target will use there: `candidates`). Where p = q they agree
with the target's draw. The probability that a draft is kept, P(argmax(log p + g) = argmax(log q +
g)), is at most Algorithm 2's sum of min(p, q): the price of the coupling, measured in
docs/methods.md ("The same seed, the same text").

The keys: a method gives these rules position keys (`state.StepKeys`, from `Rules.by_position`):
`verify` takes [B, K + 1] keys, those of positions length .. length + K; `verify_tree` takes
[B, D + 1] keys, one per depth (node n's token follows at position length + depth(n), whatever
its branch); `candidates` takes the key of its level's position, or one key per row of logits
(a block drafter's positions).

The one-row NumPy form is `specjax.reference.sampling.coupled_verify_row` and
`coupled_verify_tree`, held to the same decisions on the same noise.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from specjax.sampling.logits import sample_rows
from specjax.sampling.rejection import TreeVerdict, Verdict, num_leading_accepted

__all__ = ["candidates", "draws", "gumbel", "verify", "verify_tree"]


def gumbel(key: jax.Array, vocab: int) -> jax.Array:
    """The Gumbel noise g of one key over a vocabulary [V]: the noise `sampling.logits.sample`
    adds to log q (through `jax.random.categorical`), so argmax(log q + g) is its draw."""
    return jax.random.gumbel(key, (vocab,), jnp.float32)


def draws(keys: jax.Array, probs: jax.Array) -> jax.Array:
    """The target's draws y = argmax(log q + g(key)) for keys [...] and probs [..., V] -> [...]:
    `sample_rows` over the flattened positions, so each equals autoregressive sampling's draw
    with the same key (including its greedy shortcut, which cannot change a one-hot's draw)."""
    lead, vocab = keys.shape, probs.shape[-1]
    return sample_rows(keys.reshape(-1), probs.reshape(-1, vocab)).reshape(lead)


def candidates(scheme: str, key, logits, p, width: int):
    """The first `width` candidate children of each of P nodes of one row under the coupled rule.

    "top" candidates stay the draft's `width` most likely tokens. A sampled scheme ("iid" or
    "distinct") draws the top `width` of log p + g, with g the noise of the position the children
    take, shared by the P parents (Gumbel-top-k: its first is the drafter's Gumbel-max draw with
    the target's noise). `key` is one key (the level's position: every parent's children sit at
    one position) or [P] keys (one position per row of logits, a block drafter's chain).
    Returns tokens [P, W] int32 and valid [P, W] bool, as `rules.candidates`.
    """
    if scheme == "top":
        tokens = lax.top_k(logits, width)[1]
        return tokens.astype(jnp.int32), jnp.ones(tokens.shape, bool)
    vocab = p.shape[-1]
    noise = (gumbel(key, vocab)[None] if key.ndim == 0 else
             jax.vmap(gumbel, in_axes=(0, None))(key, vocab))               # [1 or P, V]
    scores, tokens = lax.top_k(jnp.log(p) + noise, width)
    return tokens.astype(jnp.int32), scores > -jnp.inf


def verify(draft_tokens: jax.Array, draft_probs: jax.Array, target_probs: jax.Array,
           keys: jax.Array, num_drafted: jax.Array | None = None,
           with_details: bool = False) -> Verdict:
    """The coupled rule over a chain of K drafts per row (`rejection.verify`'s arguments).

    The target's draws are made position by position, while some row still keeps its drafts: a
    draw is V Gumbel variates, a large part of a small model's step, and a row needs one per
    token it emits, as autoregressive sampling does, not one per position scored.

    Args:
      draft_tokens: [B, K]; draft_probs: [B, K, V] (not read: the rule is lossless for any
        draft); target_probs: [B, K + 1, V] q at positions length .. length + K;
      keys: [B, K + 1] the position keys of those positions (`state.position_keys`);
      num_drafted: [B] or None: a row's drafts past it are never kept.
    Returns:
      A `rejection.Verdict`: n_accepted [B], the leading drafts equal to the target's draws, and
      next_token [B], the draw after them. With `with_details`, its details hold `draw`
      [B, K + 1], the target's draw at each position up to the row's first mismatch (-1 past
      the last position any row reached).
    """
    batch, k = draft_tokens.shape
    if target_probs.shape[:2] != (batch, k + 1) or keys.shape[:2] != (batch, k + 1):
        raise ValueError(f"the coupled rule needs target_probs [B, K + 1, V] and position keys "
                         f"[B, K + 1] for drafts {draft_tokens.shape}, got {target_probs.shape} "
                         f"and {keys.shape}")
    if num_drafted is None:
        num_drafted = jnp.full((batch,), k, jnp.int32)
    drafts = jnp.concatenate([draft_tokens, jnp.full((batch, 1), -1, draft_tokens.dtype)], 1)

    def position(c: _Chain) -> _Chain:
        at = lambda a: lax.dynamic_index_in_dim(a, c.i, 1, keepdims=False)    # noqa: E731
        y = draws(at(keys), at(target_probs))                                    # [B]
        kept = c.keeping & (c.i < num_drafted) & (drafts[:, c.i] == y)
        return _Chain(c.i + 1, c.n + kept, kept, jnp.where(c.keeping, y, c.next_token),
                      c.draw.at[:, c.i].set(y))

    start = _Chain(jnp.zeros((), jnp.int32), jnp.zeros((batch,), jnp.int32),
                   jnp.ones((batch,), bool), jnp.zeros((batch,), jnp.int32),
                   jnp.full((batch, k + 1), -1, jnp.int32))
    # A row keeps its drafts while each equals the draw; the position where it stops is drawn
    # before the loop ends, and that draw is its next token.
    end = lax.while_loop(lambda c: jnp.any(c.keeping), position, start)
    return Verdict(end.n, end.next_token, dict(draw=end.draw) if with_details else None)


class _Chain(NamedTuple):
    """The coupled chain's loop: the position drawn next, and each row's verdict so far."""
    i: jax.Array                  # [] the position drawn next, 0-based
    n: jax.Array                  # [B] the drafts kept
    keeping: jax.Array            # [B] whether every draft so far equalled its draw
    next_token: jax.Array         # [B] the draw at the row's last position drawn
    draw: jax.Array               # [B, K + 1] the draws made (-1 where none)


def verify_tree(tree, rule: str, tokens: jax.Array, valid: jax.Array, draft_probs,
                target_probs: jax.Array, keys: jax.Array, with_details: bool = False
                ) -> TreeVerdict:
    """The coupled rule over a token tree per row (`rejection.verify_tree`'s arguments; `rule`
    and `draft_probs` are not read: the walk is lossless whatever drew the candidates).

    The walk goes depth by depth: the target's draw at the node a row stands on (one draw per
    depth, as the chain's, and none once every row has stopped), then the child with that token.

    Args:
      tree: the static `Tree` or `RowTrees`; tokens, valid: [B, n]; target_probs: [B, n, V];
      keys: [B, D + 1] position keys by depth: the draw after a node of depth d is at position
        length + d, with key d.
    Returns:
      A `rejection.TreeVerdict`. With `with_details`, its details hold `draw` [B, D + 1], the
      target's draw at the node the walk stood on at each depth (-1 past the row's stop), and
      the `path` [B, D].
    """
    batch, n = tokens.shape
    depth = tree.max_depth
    if target_probs.shape[:2] != (batch, n) or keys.shape[:2] != (batch, depth + 1):
        raise ValueError(f"the coupled rule needs target_probs [B, {n}, V] and position keys "
                         f"[B, {depth + 1}] for a tree of depth {depth}, got "
                         f"{target_probs.shape} and {keys.shape}")
    rows = jnp.arange(batch)
    children = jnp.broadcast_to(jnp.asarray(tree.children), (batch, n, tree.max_width))
    walk = _Walk(jnp.zeros((batch,), jnp.int32), jnp.ones((batch,), bool),
                 jnp.zeros((batch,), jnp.int32), [], [])
    for d in range(depth + 1):
        y = lax.cond(jnp.any(walk.walking),
                     lambda: draws(keys[:, d], target_probs[rows, walk.node]),
                     lambda: jnp.full((batch,), -1, jnp.int32))                  # [B]
        y = jnp.where(walk.walking, y, -1)
        if d == depth:                      # a leaf: its draw is the bonus
            walk = walk._replace(next_token=jnp.where(walk.walking, y, walk.next_token),
                                 draw=walk.draw + [y])
            break
        kids = children[rows, walk.node]                                         # [B, W]
        safe = jnp.maximum(kids, 0)
        match = ((kids >= 0) & valid[rows[:, None], safe] & (tokens[rows[:, None], safe]
                                                            == y[:, None]))
        moved = walk.walking & jnp.any(match, axis=1)
        node = jnp.where(moved, safe[rows, jnp.argmax(match, axis=1)], walk.node)
        walk = _Walk(node, moved, jnp.where(walk.walking & ~moved, y, walk.next_token),
                     walk.path + [node], walk.draw + [y])
    path = jnp.stack(walk.path, axis=1)                                          # [B, D]
    n_accepted = jnp.sum(jnp.take_along_axis(jnp.broadcast_to(jnp.asarray(tree.depth),
                                                              (batch, n)), path, axis=1)
                         == jnp.arange(1, depth + 1), axis=1).astype(jnp.int32)
    details = dict(draw=jnp.stack(walk.draw, axis=1), path=path) if with_details else None
    return TreeVerdict(n_accepted, path, walk.next_token, details)


class _Walk(NamedTuple):
    """The coupled walk, depth by depth, for every row at once."""
    node: jax.Array               # [B] the node each row stands on
    walking: jax.Array            # [B] whether it goes on
    next_token: jax.Array         # [B] the draw where it stopped
    path: list                    # [B] per depth so far: the node taken (or stood on)
    draw: list                    # [B] per depth so far: the target's draw (-1 once stopped)
