"""The verify numbers of a step, kept for `specjax.explain` when `DecodeSpec.trace` is set.

Beside the samplers, not inside them: `verify` and `verify_tree` are the spec's verification
rules, which with `spec.trace` also return the numbers they computed
(`rejection.verify(with_details=True)`, `rejection.verify_tree(with_details=True)`: the same
draws), and `record` / `record_tree` keep them in the state.
"""

from __future__ import annotations

import jax.numpy as jnp

from specjax.decoding.state import DecodeState
from specjax.sampling.rejection import verify as verify_with_details
from specjax.sampling.rejection import verify_tree as verify_tree_with_details


def verify(spec, draft_tokens, draft_probs, target_probs, keys, num_drafted=None):
    """`spec.rules.verify`, returning (n_accepted [B], next_token [B], details or None)."""
    if spec.trace:
        return verify_with_details(draft_tokens, draft_probs, target_probs, keys,
                                   num_drafted=num_drafted, with_details=True)
    n_accepted, next_token = spec.rules.verify(draft_tokens, draft_probs, target_probs, keys,
                                               num_drafted=num_drafted)
    return n_accepted, next_token, None


def record(spec, state: DecodeState, draft_tokens, drafted, new, n_accepted, details):
    """With `spec.trace`, keeps this step's numbers in the state: the drafted tokens [B, K] and
    how many [B], p_i(x_i), q_i(x_i) and u_i [B, K], the accepted count [B], the residual sampled
    from after a rejection [B, V] and the emitted token [B]."""
    if not spec.trace:
        return state
    emitted = jnp.take_along_axis(new, n_accepted[:, None], axis=1)[:, 0]
    return state.replace(trace=dict(details, tokens=draft_tokens, drafted=drafted,
                                    accepted=n_accepted, emitted=emitted))


def verify_tree(spec, tree, rule, tokens, valid, draft_probs, target_probs, keys):
    """`spec.rules.verify_tree`, returning (n_accepted [B], path [B, D], next_token [B],
    details or None)."""
    if spec.trace:
        return verify_tree_with_details(tree, rule, tokens, valid, draft_probs, target_probs,
                                        keys, with_details=True)
    return (*spec.rules.verify_tree(tree, rule, tokens, valid, draft_probs, target_probs, keys),
            None)


def record_tree(spec, state: DecodeState, tree, tokens, valid, new, n_accepted, details):
    """With `spec.trace`, keeps a tree step's numbers in the state: the walk's sibling tests
    (`rejection.verify_tree`'s details), the tree as drafted (each node's token, parent and
    whether the drafter filled it [B, n]; the root is its own parent), the depth accepted and
    the emitted token [B]."""
    if not spec.trace:
        return state
    parent = jnp.broadcast_to(jnp.asarray(tree.parent), tokens.shape)
    emitted = jnp.take_along_axis(new, n_accepted[:, None], axis=1)[:, 0]
    return state.replace(trace=dict(details, tree_tokens=tokens, parent=parent, valid=valid,
                                    accepted_depth=n_accepted, emitted=emitted))
