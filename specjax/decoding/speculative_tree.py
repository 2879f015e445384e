"""Speculative sampling over a token tree (`spec.method.tree`, see `specjax.sampling.tree`) with a
draft model: the chain of `speculative`, widened (its `step` calls this one's for a tree; the
two share its `init` and `Carry`).

In Algorithm 2's Steps (docs/walkthrough.md):

  Step 1 (draft): the draft expands the tree level by level (`trees.fill`): one draft call per
     depth over all the nodes of that depth, each attending to its ancestors; every node's
     children are its first W candidates under the spec's scheme (`Rules.candidates`: the
     draft's top tokens, or draws from its distribution p at the node, independent or without
     replacement).
  Steps 2 to 4 (score, accept or resample, bonus): one target call scores every node;
     `rejection.verify_tree` walks the tree with the rule exact for the scheme
     (`trees.score_and_verify`).
  Then commit (`trees.step` runs all but the draft, as for every tree drafter), and move the
     accepted path's entries in the draft's cache to a chain's slots.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.decoding import trees
from specjax.decoding.extras import any_nan, pad_vocab, steered
from specjax.decoding.state import DecodeState, drafting_keys, last_tokens
from specjax.model.transformer import forward
from specjax.sampling.logits import probs_from_logits


def draft_tree(spec, weights, state: DecodeState, keys):
    """Step 1 (draft) for a tree, with one key per depth `keys` [B, D]: the `trees.Candidates` (the draft distribution at each node
    [B, n, V], None for "top" candidates) and the draft's cache.

    Depth d's candidates come from the draft's distributions at the nodes of depth d - 1: one
    draft call per depth, over that depth's nodes at once, each attending to its ancestors. The
    deepest level needs no call (like x_K of a chain), so a tree of depth D costs D draft calls.
    """
    tree, scheme, vocab = spec.method.tree, spec.method.candidates, spec.vocab_size
    b, n, depth = state.length.shape[0], tree.size + 1, tree.max_depth
    window, positions = last_tokens(state, 2)            # the first call, as in `draft`
    logits, cache = forward(weights.draft, spec.method.draft_config, window, positions,
                            state.carry.draft_cache)
    last = (state.length - 1 - positions[:, 0])[:, None]
    root = state.length - 1

    def expand(d, tokens, valid, carry):
        level_logits, cache, probs, nan = carry
        parents = tree.level(d - 1)
        if d > 1:                       # the draft's distributions at the parents' level
            level_logits, cache = forward(weights.draft, spec.method.draft_config,
                                          tokens[:, parents.start:parents.stop],
                                          trees.node_positions(tree, root)[:, parents.start:
                                                                            parents.stop],
                                          cache, trees.tree_attention(tree, root, parents.start))
            nan = nan | any_nan(level_logits)
        level_logits = pad_vocab(level_logits, vocab)                         # [B, P, V]
        # A row's controls and automaton steer each parent's distribution given its path.
        paths = trees.drafted_before(tree, tokens)[:, parents.start:parents.stop]  # [B, P, D]
        level_logits = steered(spec, state, level_logits, paths)
        p = (None if scheme == "top" else
             probs_from_logits(level_logits, state.settings.sampling))
        if p is not None:
            probs = probs.at[:, parents.start:parents.stop].set(p)
        cand, filled = jax.vmap(spec.rules.candidates,
                                in_axes=(None, 0, 0, 0 if p is not None else None, None))(
            scheme, keys[:, d - 1], level_logits, p, tree.max_width)    # [B, P, W]
        return cand, filled, trees.Filling(level_logits, cache, probs, nan)

    root_logits = jnp.take_along_axis(logits, last[:, :, None], axis=1)      # [B, 1, V']
    probs = None if scheme == "top" else jnp.zeros((b, n, vocab), jnp.float32)
    tokens, valid, filling = trees.fill(tree, jnp.take_along_axis(window, last, 1)[:, 0], expand,
                                        trees.Filling(root_logits, cache, probs, any_nan(logits)))
    # The deepest level's logits are not read.
    return (trees.Candidates(tokens, valid, filling.probs, trees.SCHEMES[scheme], tree,
                             filling.nan), filling.cache)


def step(spec, weights, state: DecodeState) -> DecodeState:
    tree = spec.method.tree
    depth, nodes = tree.max_depth, tree.size + 1
    keys = drafting_keys(spec, state, depth)

    # Step 1 (draft): the tree of candidates, level by level.
    candidates, draft_cache = draft_tree(spec, weights, state, keys.draft)
    # Steps 2 to 4 (score, accept or resample, bonus): one target call over the tree, the walk,
    # then commit (`trees.step`). The draft
    # fed the nodes above the deepest level: after moving the accepted ones into place it holds
    # the path up to depth D - 1, and catches up on the rest next step.
    old_length = state.length
    state, verified = trees.step(spec, weights, state, candidates, keys.verify,
                                 draft_calls=depth)
    draft_cache = trees.keep_path(draft_cache, old_length - 1, verified.path, nodes)
    draft_cache = draft_cache.with_length(jnp.minimum(state.length - 1, old_length + depth - 1))
    return state.replace(carry=dataclasses.replace(state.carry, draft_cache=draft_cache))
