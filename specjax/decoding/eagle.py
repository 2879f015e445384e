"""EAGLE decoding (Li et al. 2024): a feature-level drafter fills a token tree.

The drafter (`specjax.heads.eagle`) keeps its own one-layer KV cache whose slot s holds the pair
(f_{s-1}, x_s): the target's feature at s - 1 and the token after it. Its slots line up with
the target's: the row's last token x_{L-1} sits in slot L - 1 of both caches, and a tree node i
in slot L - 1 + i.

One step, for every row at once, in Algorithm 2's Steps (docs/walkthrough.md):

  Step 1 (draft), catching up: the pairs the drafter has not read yet (the ones the last step committed, m =
     accepted + 1 of them, `Carry.pending`) go through it in one call, with the target's own
     features, which the last verify call left in `Carry.features`. Its output at the last pair,
     slot L - 1, is the predicted feature f'_{L-1}, whose logits propose x_L: the tree's first
     level.
  Step 1 (draft), the tree: filled level by level (`trees.fill`), at the feature level: a
     node's pair is (its parent's predicted feature, its own token), fed at the node's slot
     with tree attention; its output proposes the node's children. Candidates are the drafter's top tokens
     ("top": deterministic) or draws from its distribution ("iid", "distinct").
  Steps 2 to 4 (score, accept or resample, bonus): one target call scores the tree;
     `rejection.verify_tree` walks it with the rule exact for the scheme
     (`trees.score_and_verify`), which also returns the target's features at the root and
     along the accepted path: the pairs of the next step's catch-up, with the new tokens.
  Then commit.

Why it is exact: the drafter reads only committed tokens, the target's features of committed
positions and its own output, so every node's candidates depend on the past and the step's
drafting key, never on the verification's coins; the tree verification is Theorem 1's, for the
scheme that chose the candidates.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from jax import lax

from specjax.decoding import trees
from specjax.decoding.config import Drafting
from specjax.decoding.extras import any_nan, steered
from specjax.decoding.prefill import prefill, prefill_chunk
from specjax.decoding.state import DecodeState, drafting_keys
from specjax.heads import eagle
from specjax.model.cache import KVCache, TreeAttention
from specjax.sampling.logits import probs_from_logits
from specjax.sampling.tree import DynamicTree, RowTrees


@dataclasses.dataclass(frozen=True, kw_only=True)
class EagleSpec(Drafting):
    """An EAGLE drafter (`specjax.heads.eagle`), over a static or a dynamic tree."""
    name: ClassVar[str] = "eagle"
    drafter_config: eagle.DrafterConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Carry:
    """What EAGLE carries from step to step (`DecodeState.carry`)."""
    draft_cache: KVCache    # the drafter's: slot s holds the pair (f_{s-1}, x_s)
    features: jax.Array     # [B, depth + 1, D] the target's features of the pairs not read
    pending: jax.Array      # [B] how many of them there are (the first `pending` entries)


def init(spec, weights, prompts, prompt_length):
    """Prefill (`prefill_drafter`): the target's cache, and the `Carry` whose one pending pair
    is the prompt's last (re-read by the first step's catch-up)."""
    target_cache, draft_cache, last = prefill_drafter(spec, weights, prompts, prompt_length,
                                                      spec.buffer_length)
    features = jnp.zeros((prompts.shape[0], spec.method.tree.max_depth + 1, last.shape[-1]),
                         last.dtype).at[:, :1].set(last)
    return target_cache, Carry(draft_cache, features, jnp.ones_like(prompt_length))


def layout(spec, rows, cache) -> Carry:
    """The carry's layout on a device mesh (`decoding.sharding`): the drafter's cache whole on
    each device of a row block (its weights are replicated)."""
    config = spec.method.drafter_config
    return Carry(cache(config.layer, False, config.first_slot), rows, rows)


def prefill_drafter(spec, weights, prompts, prompt_length, slots: int):
    """The target's prefill, then the drafter's over the prompt's pairs.

    Returns the target's cache, the drafter's (slots 0 .. P - 1 hold the pairs (f_{s-1}, x_s),
    f_{-1} = 0) and each row's last prompt pair's feature f_{P-2} (zeros for a one-token prompt):
    the first step's catch-up re-reads that pair, so the step needs no special first case.
    """
    config = spec.method.drafter_config
    prefilled = prefill(weights.target, spec.target_config, prompts, prompt_length, slots,
                        hidden="all", shards=spec.data_shards, taps=config.taps)
    features = eagle.from_target(weights.drafter, config, prefilled.hidden)     # [B, P, D]
    b, p = prompts.shape
    shifted = jnp.concatenate([jnp.zeros_like(features[:, :1]), features[:, :-1]], axis=1)
    chunk = min(p, prefill_chunk(b))
    embed = eagle.embedding(weights.drafter, weights.target)

    def run_chunk(c, cache):
        start = jnp.minimum(c * chunk, p - chunk)    # a last chunk ends with the prompt
        positions = start + jnp.broadcast_to(jnp.arange(chunk, dtype=jnp.int32), (b, chunk))
        return eagle.draft_features(          # the cache (the outputs are not read here)
            weights.drafter, config, embed, lax.dynamic_slice_in_dim(shifted, start, chunk, 1),
            lax.dynamic_slice_in_dim(prompts, start, chunk, 1), positions, cache,
            prefill=True)[1]

    n_chunks = (jnp.max(prompt_length) + chunk - 1) // chunk
    draft_cache = lax.fori_loop(0, n_chunks, run_chunk,
                                KVCache.init(config.layer, b, slots, first=config.first_slot))
    last = jnp.take_along_axis(features, jnp.maximum(prompt_length - 2, 0)[:, None, None], 1)
    last = jnp.where((prompt_length >= 2)[:, None, None], last, 0)
    return prefilled.cache, draft_cache, last


def pending_pairs(state: DecodeState):
    """The tokens and slots of the pairs the drafter has not read: each row's last `pending`
    tokens, in a window of D + 1 (the most a step commits) that starts at the first of them
    (entries past the row's last token are stale, and overwritten by the tree before any
    query can read them)."""
    width = state.carry.features.shape[1]
    start = state.length - state.carry.pending                                       # [B]
    tokens = jax.vmap(lambda row, s: lax.dynamic_slice(row, (s,), (width,)))(state.tokens, start)
    return tokens, start[:, None] + jnp.arange(width, dtype=jnp.int32)


def catch_up(spec, weights, state: DecodeState):
    """Step 1 (draft), its start: the drafter reads the pairs the last step committed. Returns
    its output at the last pair, the predicted f'_{L-1} [B, 1, D], its cache and whether a NaN
    was seen."""
    carry = state.carry
    tokens, slots = pending_pairs(state)
    out, cache = eagle.draft_features(weights.drafter, spec.method.drafter_config,
                                      eagle.embedding(weights.drafter, weights.target),
                                      carry.features, tokens, slots, carry.draft_cache)
    root_feature = jnp.take_along_axis(out, (carry.pending - 1)[:, None, None], axis=1)
    return root_feature, cache, any_nan(out)


def draft_tree(spec, weights, state: DecodeState, keys):
    """Step 1 (draft) for a static tree, with one key per depth `keys` [B, D]: the
    `trees.Candidates` (the draft distribution at each node [B, n, V], None for "top"
    candidates) and the drafter's cache. One drafter call to catch up and one per level above
    the deepest: D calls."""
    tree, scheme, vocab = spec.method.tree, spec.method.candidates, spec.vocab_size
    config, drafter = spec.method.drafter_config, weights.drafter
    embed = eagle.embedding(drafter, weights.target)
    b, n, depth = state.length.shape[0], tree.size + 1, tree.max_depth
    root = state.length - 1
    root_feature, cache, nan = catch_up(spec, weights, state)
    outs = jnp.zeros((b, n, root_feature.shape[-1]), root_feature.dtype)
    outs = outs.at[:, :1].set(root_feature)                                       # [B, n, D']
    # A row's drafts follow its controls and automaton at each node, given the node's path
    # (`extras.steered`); the draft distribution is then the steered one, which is what it draws.

    def expand(d, tokens, valid, carry):
        outs, cache, probs, nan = carry
        parents = tree.level(d - 1)
        if d > 1:          # the parents' pairs: their parent's predicted feature, their token
            features = outs[:, tree.parent[parents.start:parents.stop]]
            level, cache = eagle.draft_features(
                drafter, config, embed, features, tokens[:, parents.start:parents.stop],
                trees.node_positions(tree, root)[:, parents.start:parents.stop], cache,
                trees.tree_attention(tree, root, parents.start))
            outs = outs.at[:, parents.start:parents.stop].set(level)
        sub_logits = eagle.draft_logits(drafter, config,
                                        outs[:, parents.start:parents.stop])      # [B, P, S]
        nan = nan | any_nan(sub_logits)
        paths = trees.drafted_before(tree, tokens)[:, parents.start:parents.stop]  # [B, P, D]
        if scheme == "top":
            sub_logits = trees.steered_subset(spec, state, drafter["ids"], sub_logits, paths)
            best = lax.top_k(sub_logits, tree.max_width)[1]
            cand = drafter["ids"][best]
            return cand, jnp.ones(cand.shape, bool), trees.Filling(outs, cache, probs, nan)
        logits = steered(spec, state, eagle.full_logits(drafter, sub_logits, vocab), paths)
        p = probs_from_logits(logits, state.settings.sampling)
        probs = probs.at[:, parents.start:parents.stop].set(p)
        cand, filled = jax.vmap(spec.rules.candidates, in_axes=(None, 0, 0, 0, None))(
            scheme, keys[:, d - 1], logits, p, tree.max_width)                  # [B, P, W]
        return cand, filled, trees.Filling(outs, cache, probs, nan)

    probs = None if scheme == "top" else jnp.zeros((b, n, vocab), jnp.float32)
    tokens, valid, filling = trees.fill(tree, state.tokens[jnp.arange(b), root], expand,
                                        trees.Filling(outs, cache, probs, nan))
    # The nodes' outputs are not read again.
    return (trees.Candidates(tokens, valid, filling.probs, trees.SCHEMES[scheme], tree,
                             filling.nan), filling.cache)


def draft_dynamic_tree(spec, weights, state: DecodeState):
    """Step 1 (draft) for EAGLE-2's dynamic tree (`sampling.tree.DynamicTree`): each row's own
    tree, chosen by the drafter's confidence. Returns the `trees.Candidates` over the rows'
    trees (`RowTrees`) and the drafter's cache.

    Depth d expands E nodes (the root at d = 1, then the frontier of K): the drafter reads the
    frontier's pairs (one call, tree attention among the nodes it has read), and each expanded
    node's K likeliest tokens become candidates scored by the path's summed log-probability
    (`_expand`). The K best new candidates are the next frontier. Every candidate goes to a pool
    (K + (D - 1) K^2 of them, in the order made), whose N best are the tree (`_chosen_tree`).
    The candidates are deterministic given the past: they are verified by the deterministic
    rule, exact at every temperature.
    """
    shape = spec.method.tree
    depth, k, total = shape.depth, shape.top_k, shape.total_tokens
    config, drafter = spec.method.drafter_config, weights.drafter
    embed = eagle.embedding(drafter, weights.target)
    b, root = state.length.shape[0], state.length - 1
    rows = jnp.arange(b)[:, None]
    outs, cache, nan = catch_up(spec, weights, state)          # the root's: the node expanded
    fed = 1 + (depth - 1) * k             # the nodes the drafter reads: the root, the frontiers
    fed_ancestors = jnp.broadcast_to(jnp.eye(fed, dtype=bool), (b, fed, fed))

    pool = []                           # each depth's (tokens, scores, parents, depths)
    scores = jnp.zeros((b, 1), jnp.float32)                  # the expanded nodes' path scores
    pool_index, fed_index = jnp.full((b, 1), -1), jnp.zeros((b, 1), jnp.int32)
    # The expanded nodes' paths [B, E, D] (-1 past their depth), where a row's drafts follow its
    # controls and automaton (any deterministic candidates are exact; these are accepted more).
    paths = jnp.full((b, 1, depth), -1, jnp.int32)
    for d in range(1, depth + 1):
        cand_tokens, cand_scores, nan_here = _expand(spec, state, drafter, config, outs, scores,
                                                     paths, k)                    # [B, E*K]
        nan = nan | nan_here
        cand_parent = jnp.repeat(jnp.arange(outs.shape[1]), k)                     # [E*K]
        pool.append((cand_tokens, cand_scores, pool_index[:, cand_parent],
                     jnp.full(cand_tokens.shape, d, jnp.int32)))
        if d == depth:
            break
        # The next frontier: the K best candidates, read by the drafter at once.
        offset = sum(t.shape[1] for t, *_ in pool) - cand_tokens.shape[1]
        best = lax.top_k(cand_scores, k)[1]                                       # [B, K]
        parent = cand_parent[best]                                                # [B, K]
        first = 1 + (d - 1) * k
        new_fed = first + jnp.arange(k)
        parent_rows = jnp.take_along_axis(fed_ancestors, fed_index[rows, parent][..., None], 1)
        fed_ancestors = fed_ancestors.at[:, first:first + k].set(
            parent_rows | jax.nn.one_hot(new_fed, fed, dtype=bool)[None])
        features = jnp.take_along_axis(outs, parent[..., None], axis=1)           # [B, K, D']
        outs, cache = eagle.draft_features(
            drafter, config, embed, features, cand_tokens[rows, best],
            jnp.broadcast_to(root[:, None] + d, (b, k)), cache,
            TreeAttention(root=root, ancestors=fed_ancestors, first=first))
        scores = cand_scores[rows, best]
        paths = jnp.take_along_axis(paths, parent[..., None], axis=1).at[:, :, d - 1].set(
            cand_tokens[rows, best])
        pool_index, fed_index = offset + best, jnp.broadcast_to(new_fed, (b, k))

    pool = (jnp.concatenate(x, axis=1) for x in zip(*pool))                      # [B, C]
    node_tokens, valid, row_trees = _chosen_tree(state, root, *pool, total, depth, k)
    return trees.Candidates(node_tokens, valid, None, "deterministic", row_trees, nan), cache


def _expand(spec, state: DecodeState, drafter, config, outs, scores, paths, k: int):
    """The K likeliest tokens after each of the E expanded nodes (the drafter's outputs `outs`
    [B, E, D'], steered along their `paths`), as candidates [B, E*K] scored by their path's
    summed log-probability (`scores` [B, E] the nodes'); and whether a NaN was seen."""
    b = outs.shape[0]
    sub_logits = eagle.draft_logits(drafter, config, outs)                          # [B, E, S]
    nan = any_nan(sub_logits)
    sub_logits = trees.steered_subset(spec, state, drafter["ids"], sub_logits, paths)
    # A token steered to -inf has log-probability -inf, even where a row allows none.
    logp = jnp.where(sub_logits == -jnp.inf, -jnp.inf,
                     jax.nn.log_softmax(sub_logits, -1))                          # [B, E, S]
    top_logp, top = lax.top_k(logp, k)                                            # [B, E, K]
    cand_scores = (scores[:, :, None] + top_logp).reshape(b, -1)                  # [B, E*K]
    return drafter["ids"][top].reshape(b, -1), cand_scores, nan


def _chosen_tree(state: DecodeState, root, tokens, scores, parents, depths, total: int,
                 depth: int, k: int):
    """The N = `total` best candidates of the pool (tokens, scores, parent pool index, depth:
    each [B, C], in the order made, so a parent comes before its children), kept in pool order,
    as the tree's nodes 1..N under the root: their tokens [B, n], validity [B, n] and
    `RowTrees`. A child's score is its parent's plus a log-probability <= 0, and the top-N
    selection prefers the earlier of equal scores, so the nodes' parents are chosen too; a node
    whose parent was not (ties at -inf) is left invalid."""
    b = tokens.shape[0]
    rows = jnp.arange(b)[:, None]
    chosen = jnp.sort(lax.top_k(scores, total)[1], axis=1)                        # [B, N]
    node_of = jnp.full(scores.shape, -1, jnp.int32).at[rows, chosen].set(
        jnp.arange(1, total + 1, dtype=jnp.int32))
    parent_pool = parents[rows, chosen]
    parent = jnp.where(parent_pool < 0, 0, node_of[rows, jnp.maximum(parent_pool, 0)])
    valid = parent >= 0
    parent = jnp.concatenate([jnp.zeros((b, 1), jnp.int32), jnp.maximum(parent, 0)], axis=1)
    valid = jnp.concatenate([jnp.ones((b, 1), bool), valid], axis=1)             # [B, n]
    for _ in range(depth):                  # a node under an invalid node is invalid
        valid = valid & valid[rows, parent]
    node_scores = jnp.concatenate([jnp.zeros((b, 1)), scores[rows, chosen]], axis=1)
    trees_ = _row_trees(parent, valid, node_scores,
                        jnp.concatenate([jnp.zeros((b, 1), jnp.int32), depths[rows, chosen]], 1),
                        depth, k)
    node_tokens = jnp.concatenate([state.tokens[rows, root[:, None]], tokens[rows, chosen]], 1)
    return node_tokens, valid, trees_


def _row_trees(parent, valid, scores, depth, max_depth: int, width: int) -> RowTrees:
    """The `RowTrees` of nodes given by their parents [B, n] (node 0 the root): siblings ranked
    by score, best first (the order the verifier tries them in); invalid nodes are nobody's
    child."""
    b, n = parent.shape
    rows = jnp.arange(b)[:, None]
    index = jnp.arange(n)
    sibling = ((parent[:, :, None] == parent[:, None, :]) & valid[:, None, :]
               & (index > 0)[None, None, :])                                     # [B, n, n]
    before = (scores[:, None, :] > scores[:, :, None]) | (
        (scores[:, None, :] == scores[:, :, None]) & (index[None, :] < index[:, None]))[None]
    rank = jnp.sum(sibling & before & (index[None, :] != index[:, None])[None], axis=2)
    rank = jnp.where(valid & (index > 0)[None], rank, width)          # out of range: dropped
    children = jnp.full((b, n, width), -1, jnp.int32).at[rows, parent, rank].set(
        jnp.broadcast_to(index, (b, n)).astype(jnp.int32), mode="drop")
    eye = jnp.eye(n, dtype=bool)
    ancestors = jnp.broadcast_to(eye, (b, n, n))
    for _ in range(max_depth):
        ancestors = eye[None] | jnp.take_along_axis(ancestors, parent[:, :, None], axis=1)
    return RowTrees(parent=parent, depth=depth, children=children, ancestors=ancestors,
                    max_depth=max_depth, max_width=width)


def step(spec, weights, state: DecodeState) -> DecodeState:
    keys = drafting_keys(spec, state, spec.method.tree.max_depth)
    # Step 1 (draft): catch up, then the tree of candidates.
    if isinstance(spec.method.tree, DynamicTree):
        candidates, draft_cache = draft_dynamic_tree(spec, weights, state)
    else:
        candidates, draft_cache = draft_tree(spec, weights, state, keys.draft)
    # Steps 2 to 4 (score, accept or resample, bonus): one target call over the tree, the walk,
    # then commit (`trees.step`), and the features of the next catch-up; finished rows keep
    # their pending pairs.
    active = ~state.done
    state, verified = trees.step(spec, weights, state, candidates, keys.verify,
                                 draft_calls=spec.method.tree.max_depth, taps=spec.method.drafter_config.taps)
    features = eagle.from_target(weights.drafter, spec.method.drafter_config, verified.features)
    old = state.carry
    return state.replace(carry=Carry(draft_cache,
                                     jnp.where(active[:, None, None], features, old.features),
                                     jnp.where(active, verified.n_accepted + 1, old.pending)))
