"""Token trees in a decoding step, shared by every drafter that fills one (draft model, n-gram
lookup, Medusa heads, EAGLE): the fill, level by level (`fill`, with the rules' `candidates` for
drafters that have a distribution), then one target call over the tree, the walk of `rejection.verify_tree`, and the cache
put back in order (`score_and_verify`).

Every drafter hands over the same three things: the nodes' tokens [B, n] (node 0 is the row's
last token), which nodes it filled [B, n], and the draft distribution at each node [B, n, V]
(None for deterministic candidates). The verifier never knows which drafter it serves.

The target call feeds all n nodes at positions length - 1 + depth, in n consecutive cache slots
after the row's last committed one, each attending to its ancestors only
(`cache.TreeAttention`). After the walk, the keys and values of the accepted path are moved to
the slots a chain would have used (`cache.keep_path`), so rolling back by length stays the only
rollback.
"""

from __future__ import annotations

import jax.numpy as jnp

from specjax.decoding import trace
from specjax.decoding.state import DecodeState, any_nan, last_tokens, pad_vocab
from specjax.model import cache as kv
from specjax.model.cache import KVCache, TreeAttention
from specjax.model.transformer import lm_head, tapped_states
from specjax.sampling.logits import probs_from_logits

# How each candidate scheme a drafter can use is verified (`rejection.RULES`).
SCHEMES = {"top": "deterministic", "iid": "iid", "distinct": "without_replacement"}


def fill(tree, root, expand, carry):
    """Fills a token tree level by level: the loop every tree drafter shares.

    Args:
      tree: the static `Tree`; root: [...] the root tokens (each row's last token; any leading
        shape, e.g. [B], or [] inside a vmap over rows).
      expand: expand(d, tokens, valid, carry) -> (candidates [..., P, W], filled [..., P, W],
        carry): for the P nodes of depth d - 1, in node order, their first W candidate children
        and whether each exists. The child of rank r of a node takes its candidate r.
      carry: whatever `expand` threads from level to level (a cache, distributions, ...).
    Returns:
      tokens [..., n] int32 (node 0 the root), valid [..., n] bool (a node is valid when its
      candidate exists and its parent is valid), and the final carry.
    """
    n = tree.size + 1
    tokens = jnp.zeros((*root.shape, n), jnp.int32).at[..., 0].set(root)
    valid = jnp.ones((*root.shape, n), bool)
    for d in range(1, tree.max_depth + 1):
        parents, kids = tree.level(d - 1), tree.level(d)
        cand, filled, carry = expand(d, tokens, valid, carry)
        parent = tree.parent[kids.start:kids.stop]                       # numpy [|kids|]
        rank = tree.rank[kids.start:kids.stop]
        tokens = tokens.at[..., kids.start:kids.stop].set(cand[..., parent - parents.start, rank])
        valid = valid.at[..., kids.start:kids.stop].set(
            filled[..., parent - parents.start, rank] & valid[..., parent])
    return tokens, valid, carry


def tree_attention(tree, root, first: int = 0) -> TreeAttention:
    """The attention of a call whose tokens are the nodes first, first + 1, ... of `tree`,
    rooted at slot `root` [B]."""
    return TreeAttention(root=root, ancestors=jnp.asarray(tree.ancestors), first=first)


def node_positions(tree, root):
    """[B, n] positions of the tree's nodes: root + depth."""
    return root[:, None] + jnp.asarray(tree.depth)


def keep_path(cache: KVCache, root, path, nodes: int) -> KVCache:
    """`cache.keep_path` on every layer."""
    moved = [kv.keep_path(k, v, root, path, nodes) for k, v in zip(cache.k, cache.v)]
    return KVCache(tuple(k for k, _ in moved), tuple(v for _, v in moved), cache.length,
                   cache.first)


def score_and_verify(spec, params, state: DecodeState, tokens, valid, draft_probs, keys, rule,
                     tree=None, taps: tuple[int, ...] = ()):
    """The target scores every node of the tree in one call; the walk accepts a path.

    Args:
      tokens: [B, n] the nodes' tokens, node 0 being each row's last token; valid: [B, n] bool;
      draft_probs: [B, n, V] or None; keys: [B]; rule: the verification rule of the scheme;
      tree: the tree (default spec.tree), or `RowTrees` for one tree per row.
    Returns:
      new tokens [B, D + 1] (the accepted path, then the residual or bonus token), n_accepted
      [B], the accepted path [B, D] (node indices), the target's cache with the path in
      consecutive slots, whether a NaN was seen, and the target's features (final-normed hidden
      states) along the tree's root and the accepted path [B, D + 1, D_model]: entry j is the
      state that produced the path's token j + 1 (entries past n_accepted are stale). Medusa
      heads read entry n_accepted, the state that produced the new last token; an EAGLE
      drafter reads them all; other drafters ignore them. With `taps`, the features are the
      tapped states instead (`transformer.tapped_states`): an EAGLE-3 drafter's. Last, with
      `spec.trace`, the walk's numbers (`trace.verify_tree`; else None).
    """
    tree = spec.tree if tree is None else tree
    _, root = last_tokens(state, 1)
    root = root[:, 0]                                                  # [B] slot = position
    x, tapped, cache = tapped_states(params.target, spec.target_config, tokens,
                                     node_positions(tree, root), state.target_cache,
                                     tree_attention(tree, root), taps)      # [B, n, D_model]
    logits = lm_head(params.target, spec.target_config, x)                  # [B, n, V']
    target_probs = probs_from_logits(pad_vocab(logits, spec.vocab_size),
                                     state.settings.sampling)
    n_accepted, path, next_token, details = trace.verify_tree(spec, tree, rule, tokens, valid,
                                                              draft_probs, target_probs, keys)
    new = jnp.take_along_axis(tokens, path, axis=1)                    # [B, D]
    new = jnp.concatenate([new, jnp.zeros_like(new[:, :1])], axis=1)   # [B, D + 1]
    new = new.at[jnp.arange(new.shape[0]), n_accepted].set(next_token)
    cache = keep_path(cache, root, path, tree.size + 1)
    nodes = jnp.concatenate([jnp.zeros_like(path[:, :1]), path], axis=1)   # [B, D + 1]
    features = jnp.take_along_axis(x if tapped is None else tapped, nodes[:, :, None],
                                   axis=1)                                  # [B, D + 1, D']
    return new, n_accepted, path, cache, any_nan(logits), features, details

