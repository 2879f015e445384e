"""Verifying a token tree with the target: one call, the walk of `rejection.verify_tree`, and
the cache put back in order. Shared by every drafter that fills a tree (draft model, n-gram).

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

from specjax import cache as kv
from specjax.cache import KVCache, TreeAttention
from specjax.decoding.state import DecodeState, any_nan, last_tokens, pad_vocab
from specjax.logits import probs_from_logits
from specjax.model import hidden_states, lm_head

# How each candidate scheme a drafter can use is verified (`rejection.RULES`).
SCHEMES = {"top": "deterministic", "iid": "iid", "distinct": "without_replacement"}


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
    return KVCache(tuple(k for k, _ in moved), tuple(v for _, v in moved), cache.length)


def score_and_verify(spec, params, state: DecodeState, tokens, valid, draft_probs, keys, rule):
    """The target scores every node of the tree in one call; the walk accepts a path.

    Args:
      tokens: [B, n] the nodes' tokens, node 0 being each row's last token; valid: [B, n] bool;
      draft_probs: [B, n, V] or None; keys: [B]; rule: the verification rule of the scheme.
    Returns:
      new tokens [B, D + 1] (the accepted path, then the residual or bonus token), n_accepted
      [B], the accepted path [B, D] (node indices), the target's cache with the path in
      consecutive slots, whether a NaN was seen, and the target's final hidden state at the
      last accepted node (the root if none) [B, D_model]: the state that produced the new last
      token, which Medusa heads read (other drafters ignore it).
    """
    tree = spec.tree
    _, root = last_tokens(state, 1)
    root = root[:, 0]                                                  # [B] slot = position
    x, cache = hidden_states(params.target, spec.target_config, tokens,
                             node_positions(tree, root), state.target_cache,
                             tree_attention(tree, root))                    # [B, n, D_model]
    logits = lm_head(params.target, spec.target_config, x)                  # [B, n, V']
    target_probs = probs_from_logits(pad_vocab(logits, spec.vocab_size), spec.sampling)
    n_accepted, path, next_token = spec.tree_verify_fn(tree, rule, tokens, valid, draft_probs,
                                                       target_probs, keys)
    new = jnp.take_along_axis(tokens, path, axis=1)                    # [B, D]
    new = jnp.concatenate([new, jnp.zeros_like(new[:, :1])], axis=1)   # [B, D + 1]
    new = new.at[jnp.arange(new.shape[0]), n_accepted].set(next_token)
    cache = keep_path(cache, root, path, tree.size + 1)
    deepest = jnp.take_along_axis(path, jnp.maximum(n_accepted - 1, 0)[:, None], axis=1)[:, 0]
    last = jnp.where(n_accepted > 0, deepest, 0)                             # [B] node index
    hidden = jnp.take_along_axis(x, last[:, None, None], axis=1)[:, 0]
    return new, n_accepted, path, cache, any_nan(logits), hidden

