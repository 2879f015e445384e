"""The verify numbers of a step, kept for `specjax.explain` when `DecodeSpec.trace` is set.

Beside the samplers, not inside them: with `spec.trace` a step calls the spec's own rules with
`with_details=True` (`spec.rules.verify`, `spec.rules.verify_tree`: the same rule and the same
draws as without, so the tokens are those `generate` returns), and `record` / `record_tree` keep
the numbers the rule returned in the state.
"""

from __future__ import annotations

import jax.numpy as jnp

from specjax.decoding.state import DecodeState


def record(spec, state: DecodeState, draft_tokens, drafted, verified):
    """With `spec.trace`, keeps this step's numbers in the state: the drafted tokens [B, K] and
    how many [B], p_i(x_i), q_i(x_i) and u_i [B, K], the accepted count [B], the residual sampled
    from after a rejection [B, V] and the emitted token [B]. `verified` is the chain's
    `speculative.ChainVerified`."""
    if not spec.trace:
        return state
    n_accepted = verified.n_accepted
    emitted = jnp.take_along_axis(verified.new, n_accepted[:, None], axis=1)[:, 0]
    return state.replace(trace=dict(verified.details, tokens=draft_tokens, drafted=drafted,
                                    accepted=n_accepted, emitted=emitted))


def record_tree(spec, state: DecodeState, candidates, verified):
    """With `spec.trace`, keeps a tree step's numbers in the state: the walk's sibling tests
    (the details of `rejection.verify_tree`, or of the rule in its place), the tree as drafted
    (each node's token, parent and whether the drafter filled it [B, n]; the root is its own
    parent), the depth accepted and the emitted token [B]. `candidates` and `verified` are the
    step's `trees.Candidates` and `trees.Verified`."""
    if not spec.trace:
        return state
    tokens, n_accepted = candidates.tokens, verified.n_accepted
    parent = jnp.broadcast_to(jnp.asarray(candidates.tree.parent), tokens.shape)
    emitted = jnp.take_along_axis(verified.new, n_accepted[:, None], axis=1)[:, 0]
    return state.replace(trace=dict(verified.details, tree_tokens=tokens, parent=parent,
                                    valid=candidates.valid, accepted_depth=n_accepted,
                                    emitted=emitted))
