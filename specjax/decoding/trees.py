"""Token trees in a decoding step, shared by every drafter that fills one: the fill, level by
level (`fill`, with the rules' `candidates` for drafters that have a distribution), then one
target call over the tree, the walk of `rejection.verify_tree` and the cache put back in order
(`score_and_verify`); then the rest of the step every tree method shares, record and commit
(`step`).

Every drafter hands over the same `Candidates`: the nodes' tokens [B, n] (node 0 is the row's
last token), which nodes it filled [B, n], the draft distribution at each node [B, n, V] (None
for deterministic candidates), and the rule exact for how it drew them. The verifier never
knows which drafter it serves.

The target call feeds all n nodes at positions length - 1 + depth, in n consecutive cache slots
after the row's last committed one, each attending to its ancestors only
(`cache.TreeAttention`). After the walk, the keys and values of the accepted path are moved to
the slots a chain would have used (`cache.keep_path`), so rolling back by length stays the only
rollback.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from specjax.decoding import trace
from specjax.decoding.extras import any_nan, steered, steering, target_probs
from specjax.decoding.state import DecodeState, commit, last_tokens
from specjax.heads.shared import full_logits
from specjax.model import cache as kv
from specjax.model.cache import KVCache, TreeAttention
from specjax.model.transformer import lm_head, tapped_states
from specjax.sampling.tree import RowTrees, Tree

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


def drafted_before(tree, tokens):
    """[B, n, D] the drafted tokens each node comes after, itself included (its path from the
    root's child, by depth; -1 past its depth): what the target's distribution at the node
    counts as generated (`extras.target_probs`). `tree` static or one per row (`RowTrees`)."""
    ancestors, depth = jnp.asarray(tree.ancestors), jnp.asarray(tree.depth)
    if ancestors.ndim == 2:
        ancestors, depth = ancestors[None], depth[None]                 # [1, n, n], [1, n]
    levels = jnp.arange(1, tree.max_depth + 1)
    at = ancestors[:, :, None, :] & (depth[:, None, None, :] == levels[None, None, :, None])
    node = jnp.argmax(at, axis=-1)                                      # [B or 1, n, D]
    rows = jnp.arange(tokens.shape[0])[:, None, None]
    return jnp.where(at.any(axis=-1), tokens[rows, node], -1)


def steered_subset(spec, state: DecodeState, ids, sub_logits, drafted):
    """A head's logits over its subset `ids` [S] of the vocabulary, [B, N, S], under each row's
    controls and automaton given the drafts before each position (`extras.steered`, over the
    whole vocabulary); as they are when no row sets either."""
    def steer():
        full = full_logits({"ids": ids}, sub_logits, spec.vocab_size)
        return steered(spec, state, full, drafted)[..., ids]
    return lax.cond(steering(state), steer, lambda: sub_logits)


def tree_attention(tree, root, first: int = 0) -> TreeAttention:
    """The attention of a call whose tokens are the nodes first, first + 1, ... of `tree`,
    rooted at slot `root` [B]."""
    return TreeAttention(root=root, ancestors=jnp.asarray(tree.ancestors), first=first)


def node_positions(tree, root):
    """[B, n] positions of the tree's nodes: root + depth."""
    return root[:, None] + jnp.asarray(tree.depth)


def keep_path(cache: KVCache, root, path, nodes: int) -> KVCache:
    """`cache.keep_path` on every layer."""
    return KVCache(*kv.keep_path(cache.k, cache.v, root, path, nodes), cache.length, cache.first)


class Filling(NamedTuple):
    """What a drafter with a model of its own threads through `fill` from level to level."""
    outputs: jax.Array            # the drafter's outputs: its logits at the level last read (a
    #                               draft model) or its features at every node (EAGLE)
    cache: KVCache                # the drafter's cache
    probs: jax.Array | None       # [B, n, V] the draft distribution at each node so far; None for
    #                               "top" candidates
    nan: jax.Array                # whether a NaN was seen


class Candidates(NamedTuple):
    """A drafted token tree, as every drafter hands it to the verifier: Step 1 (draft)'s output."""
    tokens: jax.Array             # [B, n] int32: the nodes' tokens, node 0 each row's last token
    valid: jax.Array              # [B, n] bool: the nodes the drafter filled
    probs: jax.Array | None       # [B, n, V] the draft distribution at each node; None for
    #                               deterministic candidates, whose rule does not read it
    rule: str                     # the verification rule of the scheme that drew them (`SCHEMES`)
    tree: Tree | RowTrees         # the static tree, or one tree per row (EAGLE-2)
    nan: jax.Array | bool = False  # whether drafting saw a NaN


class Verified(NamedTuple):
    """What one target call over a tree and the walk give (`score_and_verify`)."""
    new: jax.Array                # [B, D + 1] the accepted path's tokens, then the residual or
    #                               bonus token (`n_accepted` + 1 of them are real)
    n_accepted: jax.Array         # [B] the depth the walk reached
    path: jax.Array               # [B, D] the accepted node at each depth
    cache: KVCache                # the target's, with the path in a chain's slots
    nan: jax.Array                # whether the target's logits had a NaN
    features: jax.Array           # [B, D + 1, D'] the target's features along root and path
    details: dict | None          # with `spec.trace`, the walk's numbers
    scores: jax.Array | None      # with `spec.logprobs`, `extras.target_probs`' along root and
    #                               path [B, D + 1, V]


def score_and_verify(spec, weights, state: DecodeState, candidates: Candidates, keys,
                     taps: tuple[int, ...] = ()) -> Verified:
    """Steps 2 to 4 (score, accept or resample, bonus) of a tree step: the target scores every
    node of the tree in one call, and the spec's rule (`spec.rules.verify_tree`:
    `rejection.verify_tree` unless the caller gave other rules) walks it and accepts a path.

    Args:
      candidates: the drafted tree; keys: [B] the walk's keys; taps: the target layers whose
        states an EAGLE-3 drafter reads (`transformer.tapped_states`), () for the final-normed
        hidden states.
    Returns:
      `Verified`. Its features are the target's states along the tree's root and the accepted
      path [B, D + 1, D']: entry j is the state that produced the path's token j + 1 (entries
      past n_accepted are stale). Medusa heads read entry n_accepted, the state that produced
      the new last token; an EAGLE drafter reads them all; other drafters ignore them.
    """
    tokens, valid, tree = candidates.tokens, candidates.valid, candidates.tree
    root = last_tokens(state, 1)[1][:, 0]             # [B] the last token's slot = position
    x, tapped, cache = tapped_states(weights.target, spec.target_config, tokens,
                                     node_positions(tree, root), state.target_cache,
                                     tree_attention(tree, root), taps)      # [B, n, D_model]
    logits = lm_head(weights.target, spec.target_config, x)                  # [B, n, V']
    q, scores = target_probs(spec, state, logits, drafted_before(tree, tokens))  # [B, n, V]
    # With `spec.trace`, the same rule returns its numbers too (`specjax.explain`).
    traced = {"with_details": True} if spec.trace else {}
    verdict = spec.rules.verify_tree(tree, candidates.rule, tokens, valid, candidates.probs, q,
                                     keys, **traced)
    n_accepted, path = verdict.n_accepted, verdict.path
    new = jnp.take_along_axis(tokens, path, axis=1)                    # [B, D]
    new = jnp.concatenate([new, jnp.zeros_like(new[:, :1])], axis=1)   # [B, D + 1]
    new = new.at[jnp.arange(new.shape[0]), n_accepted].set(verdict.next_token)
    cache = keep_path(cache, root, path, tree.size + 1)
    nodes = jnp.concatenate([jnp.zeros_like(path[:, :1]), path], axis=1)   # [B, D + 1]
    features = jnp.take_along_axis(x if tapped is None else tapped, nodes[:, :, None],
                                   axis=1)                                  # [B, D + 1, D']
    if scores is not None:
        scores = jnp.take_along_axis(scores, nodes[:, :, None], axis=1)          # [B, D + 1, V]
    return Verified(new, n_accepted, path, cache, any_nan(logits), features, verdict.details,
                    scores)


def step(spec, weights, state: DecodeState, candidates: Candidates, keys, *,
         draft_calls: int = 0, taps: tuple[int, ...] = ()) -> tuple[DecodeState, Verified]:
    """Steps 2 to 4 (score, accept or resample, bonus) of every tree step, then its commit,
    whichever drafter filled the tree: score and walk (`score_and_verify`), keep the numbers
    for `specjax.explain` (`trace.record_tree`), commit.

    Returns the committed state and the `Verified` result, from which a method updates its own
    carry (a draft cache to put in order, the hidden state or features of the next step).
    """
    verified = score_and_verify(spec, weights, state, candidates, keys, taps)
    state = trace.record_tree(spec, state, candidates, verified)
    return commit(spec, state, verified.new, verified.n_accepted, verified.cache,
                  drafted=jnp.sum(candidates.valid[:, 1:], axis=1), draft_calls=draft_calls,
                  nan=candidates.nan | verified.nan, scores=verified.scores), verified
