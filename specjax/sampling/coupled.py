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
from specjax.sampling.tree import RowTrees

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

    Args:
      draft_tokens: [B, K]; draft_probs: [B, K, V] (not read: the rule is lossless for any
        draft); target_probs: [B, K + 1, V] q at positions length .. length + K;
      keys: [B, K + 1] the position keys of those positions (`state.position_keys`);
      num_drafted: [B] or None: a row's drafts past it are never kept.
    Returns:
      A `rejection.Verdict`: n_accepted [B], the leading drafts equal to the target's draws, and
      next_token [B], the draw after them. With `with_details`, its details hold `draw` [B, K + 1]
      (the target's draw at each position) and `kept` [B, K] (each draft equal to it).
    """
    batch, k = draft_tokens.shape
    if target_probs.shape[:2] != (batch, k + 1) or keys.shape[:2] != (batch, k + 1):
        raise ValueError(f"the coupled rule needs target_probs [B, K + 1, V] and position keys "
                         f"[B, K + 1] for drafts {draft_tokens.shape}, got {target_probs.shape} "
                         f"and {keys.shape}")
    if num_drafted is None:
        num_drafted = jnp.full((batch,), k, jnp.int32)
    y = draws(keys, target_probs)                                            # [B, K + 1]
    kept = (draft_tokens == y[:, :k]) & (jnp.arange(k) < num_drafted[:, None])
    n_accepted = num_leading_accepted(kept)
    next_token = jnp.take_along_axis(y, n_accepted[:, None], axis=1)[:, 0]
    return Verdict(n_accepted, next_token, dict(draw=y, kept=kept) if with_details else None)


class _Walk(NamedTuple):
    """One row's coupled walk: the node it stands on, the nodes it took, whether it goes on."""
    node: jax.Array               # [] int32
    path: list                    # [] int32 per depth so far
    walking: jax.Array            # [] bool


def _walk_row(tree, tokens, valid, y) -> tuple[jax.Array, jax.Array]:
    """One row's walk: tokens, valid, y [n] (y[m] the target's draw after node m). Returns the
    depth reached [] and the node at each depth [D] (repeating the last past it)."""
    children = jnp.asarray(tree.children)                                    # [n, W]
    walk = _Walk(jnp.zeros((), jnp.int32), [], jnp.ones((), bool))
    for _ in range(tree.max_depth):
        kids = children[walk.node]                                           # [W]
        safe = jnp.maximum(kids, 0)
        match = walk.walking & (kids >= 0) & valid[safe] & (tokens[safe] == y[walk.node])
        moved = jnp.any(match)
        node = jnp.where(moved, safe[jnp.argmax(match)], walk.node)
        walk = _Walk(node, walk.path + [node], walk.walking & moved)
    path = jnp.stack(walk.path)
    n_accepted = jnp.sum(jnp.asarray(tree.depth)[path] == jnp.arange(1, tree.max_depth + 1))
    return n_accepted.astype(jnp.int32), path


def verify_tree(tree, rule: str, tokens: jax.Array, valid: jax.Array, draft_probs,
                target_probs: jax.Array, keys: jax.Array, with_details: bool = False
                ) -> TreeVerdict:
    """The coupled rule over a token tree per row (`rejection.verify_tree`'s arguments; `rule`
    and `draft_probs` are not read: the walk is lossless whatever drew the candidates).

    Args:
      tree: the static `Tree` or `RowTrees`; tokens, valid: [B, n]; target_probs: [B, n, V];
      keys: [B, D + 1] position keys by depth: node m's next token is drawn with key
        depth(m), the position length + depth(m).
    Returns:
      A `rejection.TreeVerdict`. With `with_details`, its details hold `draw` [B, n], the
      target's draw after each node, and the `path` [B, D].
    """
    batch, n = tokens.shape
    if target_probs.shape[:2] != (batch, n) or keys.shape[:2] != (batch, tree.max_depth + 1):
        raise ValueError(f"the coupled rule needs target_probs [B, {n}, V] and position keys "
                         f"[B, {tree.max_depth + 1}] for a tree of depth {tree.max_depth}, got "
                         f"{target_probs.shape} and {keys.shape}")
    depth = jnp.broadcast_to(jnp.asarray(tree.depth), (batch, n))
    node_keys = jnp.take_along_axis(keys, depth, axis=1)                     # [B, n]
    y = draws(node_keys, target_probs)                                       # [B, n]
    if isinstance(tree, RowTrees):
        n_accepted, path = jax.vmap(_walk_row)(tree, tokens, valid, y)
    else:
        n_accepted, path = jax.vmap(lambda *a: _walk_row(tree, *a))(tokens, valid, y)
    last = jnp.where(n_accepted > 0, path[jnp.arange(batch), jnp.maximum(n_accepted - 1, 0)], 0)
    next_token = y[jnp.arange(batch), last]
    return TreeVerdict(n_accepted, path, next_token,
                       dict(draw=y, path=path) if with_details else None)
