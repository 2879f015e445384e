"""Speculative sampling with a draft model (Chen et al. 2023, Algorithm 2; Leviathan et al.
2023, Algorithm 1). Letters follow Chen et al.: p is the draft, q the target.

One step, for every row at once:

  1. The draft proposes K tokens x_1..x_K autoregressively, each sampled from its own
     distribution p_i, which is kept (up to K under a dynamic lookahead schedule: each row may
     stop earlier, `decoding.lookahead`).
  2. The target scores the row's last token and x_1..x_K in one call: K + 1 distributions q_i.
  3. `rejection.verify` accepts a prefix of the drafts and samples one more token, from the
     residual at the first rejection or from q_{K+1} when all K were accepted.

With a token tree (`spec.tree`, see `specjax.tree`), step 1 expands the tree level by level,
one draft call per depth over all the nodes of that depth, and steps 2-3 verify the tree in one
target call (`decoding.trees`); `tree_step` below.

Both caches roll back by length. The draft never makes an extra call: when all K drafts were
accepted it has not yet seen x_K, so each step's first draft call feeds the last two tokens of
the row (rewriting one cache slot with the same token when the draft is not behind).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from specjax.decoding import lookahead, trees
from specjax.decoding.state import (DecodeState, any_nan, append, count_call, last_tokens,
                                    pad_vocab, step_keys)
from specjax.logits import probs_from_logits, sample_rows
from specjax.model import forward
from specjax.rejection import verify


def propose(key, logits, sampling):
    """Draws one draft token per row and returns it with the distribution it was drawn from.

    Args:
      key: [B] keys; logits: [B, V]. Returns token [B] int32 and p [B, V] float32.
    """
    p = probs_from_logits(logits, sampling)
    return sample_rows(key, p), p


def draft(spec, params, state: DecodeState, keys, limit):
    """Step 1: up to K draft tokens per row, each row stopping as its schedule says.

    Args:
      keys: [B, K] one key per draft position; limit: [B] the most each row drafts this step.
    Returns:
      tokens [B, K] int32 and their distributions [B, K, V] (zero past a row's draft), the
      number each row drafted [B] (0 for a finished row), the draft's cache, and whether a NaN
      was seen.
    """
    vocab, k = spec.vocab_size, spec.k
    # The first call feeds the last two tokens (see the module docstring) and reads the logits
    # of the row's last real position: index 1, or 0 for a row of a single token.
    window, positions = last_tokens(state, 2)
    logits, cache = forward(params.draft, spec.draft_config, window, positions, state.draft_cache)
    last = state.length - 1 - positions[:, 0]
    logits = jnp.take_along_axis(logits, last[:, None, None], axis=1)[:, 0]   # [B, V']
    nan = any_nan(logits)

    def propose_at(i, logits, running, tokens, probs, count):
        """Draws x_{i+1} ~ p_{i+1} for every row and keeps it where the row is still drafting."""
        token, p = spec.propose_fn(keys[:, i], logits, spec.sampling)
        tokens = tokens.at[:, i].set(jnp.where(running, token, 0))
        probs = probs.at[:, i].set(jnp.where(running[:, None], p, 0.0))
        count = count + running
        running = running & ~lookahead.stops(spec, i, limit, logits, p, token)
        return token, running, tokens, probs, count

    b = state.length.shape[0]
    tokens = jnp.zeros((b, k), jnp.int32)
    probs = jnp.zeros((b, k, vocab), jnp.float32)
    count = jnp.zeros((b,), jnp.int32)
    token, running, tokens, probs, count = propose_at(
        0, pad_vocab(logits, vocab), ~state.done, tokens, probs, count)

    def more(carry):
        i, running = carry[0], carry[2]
        return (i < k) & jnp.any(running)

    def draft_next(carry):
        # Feed x_i at position length + i - 1 for the logits of p_{i+1}. Rows that stopped feed
        # it too (static shapes); their cache slots past the draft are rolled back below.
        i, token, running, cache, tokens, probs, count, nan = carry
        out, cache = forward(params.draft, spec.draft_config, token[:, None],
                             (state.length + i - 1)[:, None], cache)
        token, running, tokens, probs, count = propose_at(
            i, pad_vocab(out[:, 0], vocab), running, tokens, probs, count)
        return i + 1, token, running, cache, tokens, probs, count, nan | any_nan(out)

    _, _, _, cache, tokens, probs, count, nan = lax.while_loop(
        more, draft_next, (jnp.ones((), jnp.int32), token, running, cache, tokens, probs, count,
                           nan))
    return tokens, probs, count, cache, nan


def score_and_verify(spec, params, state: DecodeState, draft_tokens, draft_probs, keys,
                     num_drafted=None):
    """Steps 2 and 3, shared with n-gram decoding.

    The target scores [last token, x_1..x_K] at positions length-1 .. length-1+K in one call,
    then `verify` accepts a prefix and draws one more token.

    Returns:
      new tokens [B, K + 1] (the accepted drafts, then the residual or bonus token; the rest is
      padding), n_accepted [B], the target's cache, whether its logits had a NaN, and, with
      `spec.trace`, the verify step's numbers (`rejection.verify`'s details; else None).
    """
    k = draft_tokens.shape[1]
    last, last_position = last_tokens(state, 1)
    target_in = jnp.concatenate([last, draft_tokens], axis=1)          # [B, K + 1]
    positions = last_position + jnp.arange(k + 1, dtype=jnp.int32)      # [B, K + 1]
    logits, cache = forward(params.target, spec.target_config, target_in, positions,
                            state.target_cache)
    target_probs = probs_from_logits(pad_vocab(logits, spec.vocab_size), spec.sampling)
    details = None
    if spec.trace:          # the same verify, also returning the numbers it computed
        n_accepted, next_token, details = verify(draft_tokens, draft_probs, target_probs, keys,
                                                 num_drafted=num_drafted, with_details=True)
    else:
        n_accepted, next_token = spec.verify_fn(draft_tokens, draft_probs, target_probs, keys,
                                                num_drafted=num_drafted)
    new = jnp.concatenate([draft_tokens, jnp.zeros_like(draft_tokens[:, :1])], axis=1)
    new = new.at[jnp.arange(new.shape[0]), n_accepted].set(next_token)
    return new, n_accepted, cache, any_nan(logits), details


def step(spec, params, state: DecodeState) -> DecodeState:
    if spec.tree is not None:
        return tree_step(spec, params, state)
    k = spec.k
    keys = step_keys(state)                                            # [B]
    split = jax.vmap(lambda key: jax.random.split(key, k + 1))(keys)   # [B, K + 1]
    draft_keys, verify_keys = split[:, :k], split[:, k]

    # Step 1: draft x_1..x_n ~ p_1..p_n, n <= K as the row's schedule says (`lookahead`).
    draft_tokens, draft_probs, count, draft_cache, draft_nan = draft(
        spec, params, state, draft_keys, lookahead.draft_limit(spec, state))
    # Steps 2 and 3: score with the target, accept a prefix, draw the residual or bonus token.
    if spec.k_schedule == "constant":
        new, n_accepted, target_cache, target_nan, details = score_and_verify(
            spec, params, state, draft_tokens, draft_probs, verify_keys)
    else:
        new, n_accepted, target_cache, target_nan, details = score_and_verify_ragged(
            spec, params, state, draft_tokens, draft_probs, verify_keys, count)
    state = record_trace(spec, state, draft_tokens, count, new, n_accepted, details)

    old_length = state.length
    state = state.replace(lookahead=lookahead.update(spec, state, count, n_accepted))
    state = count_call(state, drafted=count, accepted=n_accepted, draft_calls=count,
                       nan=draft_nan | target_nan)
    state = append(state, new, n_accepted + 1, spec.max_new_tokens, spec.eos_ids)
    # Roll back: the target holds everything before the new last token; the draft has seen the
    # fed tokens up to x_{n-1}, so it may be one behind (the next step catches up).
    return state.replace(target_cache=target_cache.with_length(state.length - 1),
                         draft_cache=draft_cache.with_length(
                             jnp.minimum(state.length - 1, old_length + count - 1)))


def score_and_verify_ragged(spec, params, state: DecodeState, draft_tokens, draft_probs, keys,
                            num_drafted):
    """`score_and_verify` for rows that drafted different numbers of tokens, `num_drafted` [B]:
    the target scores only as many positions as the longest row needs (`lookahead.ragged`).
    Positions past a row's draft must have p = 0. Returns the same as `score_and_verify`, with
    new tokens [B, K + 1]."""
    k = draft_tokens.shape[1]

    def verify_first(n, tokens, probs):
        new, n_accepted, cache, nan, details = score_and_verify(
            spec, params, state, tokens[:, :n], probs[:, :n], keys,
            num_drafted=jnp.minimum(num_drafted, n))
        if details is not None:         # per-position numbers padded to K, as every branch
            details = {name: jnp.pad(v, ((0, 0), (0, k - n))) if name != "residual" else v
                       for name, v in details.items()}
        return jnp.pad(new, ((0, 0), (0, k - n))), n_accepted, cache, nan, details

    return lookahead.ragged(verify_first, k, num_drafted, draft_tokens, draft_probs)


def record_trace(spec, state: DecodeState, draft_tokens, drafted, new, n_accepted, details):
    """With `spec.trace`, keeps this step's numbers in the state for `specjax.explain`: the
    drafted tokens [B, K] and how many [B], p_i(x_i), q_i(x_i) and u_i [B, K], the accepted
    count [B], the residual sampled from after a rejection [B, V] and the emitted token [B]."""
    if not spec.trace:
        return state
    emitted = jnp.take_along_axis(new, n_accepted[:, None], axis=1)[:, 0]
    return state.replace(trace=dict(details, tokens=draft_tokens, drafted=drafted,
                                    accepted=n_accepted, emitted=emitted))


# -- Token trees ---------------------------------------------------------------------------------

def candidates(scheme: str, key, logits, p, width: int):
    """The first `width` candidate children of each node of one row.

    Args:
      scheme: "top" (the draft's `width` most likely tokens, by logit: deterministic), "iid"
        (independent draws from p) or "distinct" (draws from p without replacement: the Gumbel
        top-k trick, Kool et al. 2019, which draws exactly like repeated sampling without
        replacement); key: one PRNG key; logits: [P, V] the draft's logits; p: [P, V] the
        distributions sampled from (None for "top").
    Returns:
      tokens [P, W] int32 and valid [P, W] bool (False where p had fewer than W tokens left).
    """
    if scheme == "top":
        tokens = lax.top_k(logits, width)[1]
        return tokens.astype(jnp.int32), jnp.ones(tokens.shape, bool)
    log_p = jnp.log(p)[:, None, :]                                        # [P, 1, V]
    if scheme == "iid":
        gumbel = jax.random.gumbel(key, (p.shape[0], width, p.shape[1]))  # [P, W, V]
        tokens = jnp.argmax(log_p + gumbel, axis=-1)
        return tokens.astype(jnp.int32), jnp.ones(tokens.shape, bool)
    scores, tokens = lax.top_k(log_p[:, 0] + jax.random.gumbel(key, p.shape), width)
    return tokens.astype(jnp.int32), scores > -jnp.inf


def draft_tree(spec, params, state: DecodeState, keys):
    """Step 1 for a tree: the nodes' tokens [B, n], which are filled [B, n], the draft
    distribution at each node [B, n, V] (None for "top" candidates) and the draft's cache.

    Depth d's candidates come from the draft's distributions at the nodes of depth d - 1: one
    draft call per depth, over that depth's nodes at once, each attending to its ancestors. The
    deepest level needs no call (like x_K of a chain), so a tree of depth D costs D draft calls.
    """
    tree, scheme, vocab = spec.tree, spec.candidates, spec.vocab_size
    b, n, depth = state.length.shape[0], tree.size + 1, tree.max_depth
    window, positions = last_tokens(state, 2)            # the first call, as in `draft`
    logits, cache = forward(params.draft, spec.draft_config, window, positions, state.draft_cache)
    last = (state.length - 1 - positions[:, 0])[:, None]
    level_logits = jnp.take_along_axis(logits, last[:, :, None], axis=1)   # [B, 1, V']
    root = state.length - 1
    tokens = jnp.zeros((b, n), jnp.int32).at[:, 0].set(jnp.take_along_axis(window, last, 1)[:, 0])
    valid = jnp.ones((b, n), bool)
    probs = None if scheme == "top" else jnp.zeros((b, n, vocab), jnp.float32)
    nan = any_nan(logits)
    level_keys = jax.vmap(lambda key: jax.random.split(key, depth))(keys)   # [B, D]
    for d in range(1, depth + 1):
        parents, kids = tree.level(d - 1), tree.level(d)
        level_logits = pad_vocab(level_logits, vocab)                         # [B, P, V]
        p = None if scheme == "top" else probs_from_logits(level_logits, spec.sampling)
        if p is not None:
            probs = probs.at[:, parents.start:parents.stop].set(p)
        cand, filled = jax.vmap(candidates, in_axes=(None, 0, 0, 0 if p is not None else None,
                                                     None))(
            scheme, level_keys[:, d - 1], level_logits, p, tree.max_width)    # [B, P, W]
        parent = tree.parent[kids.start:kids.stop]                             # numpy [|kids|]
        rank = tree.rank[kids.start:kids.stop]
        tokens = tokens.at[:, kids.start:kids.stop].set(cand[:, parent - parents.start, rank])
        valid = valid.at[:, kids.start:kids.stop].set(filled[:, parent - parents.start, rank]
                                                      & valid[:, parent])
        if d < depth:                   # the draft's distributions at this level's nodes
            level_logits, cache = forward(params.draft, spec.draft_config,
                                          tokens[:, kids.start:kids.stop],
                                          trees.node_positions(tree, root)[:, kids.start:kids.stop],
                                          cache, trees.tree_attention(tree, root, kids.start))
            nan = nan | any_nan(level_logits)
    return tokens, valid, probs, cache, nan


def tree_step(spec, params, state: DecodeState) -> DecodeState:
    tree = spec.tree
    depth, nodes = tree.max_depth, tree.size + 1
    k_draft, k_verify = jnp.moveaxis(jax.vmap(jax.random.split)(step_keys(state)), 1, 0)

    # Step 1: the tree of candidates, level by level.
    tokens, valid, probs, draft_cache, draft_nan = draft_tree(spec, params, state, k_draft)
    # Steps 2 and 3: one target call over the tree, then the walk.
    new, n_accepted, path, target_cache, target_nan, _ = trees.score_and_verify(
        spec, params, state, tokens, valid, probs, k_verify, trees.SCHEMES[spec.candidates])

    old_length = state.length
    state = count_call(state, drafted=jnp.sum(valid[:, 1:], axis=1), accepted=n_accepted,
                       draft_calls=depth, nan=draft_nan | target_nan)
    state = append(state, new, n_accepted + 1, spec.max_new_tokens, spec.eos_ids)
    # The draft fed the nodes above the deepest level: after moving the accepted ones into
    # place it holds the path up to depth D - 1, and catches up on the rest next step.
    draft_cache = trees.keep_path(draft_cache, old_length - 1, path, nodes)
    return state.replace(target_cache=target_cache.with_length(state.length - 1),
                         draft_cache=draft_cache.with_length(
                             jnp.minimum(state.length - 1, old_length + depth - 1)))
