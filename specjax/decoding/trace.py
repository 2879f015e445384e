"""The verify numbers of a step, kept for `specjax.explain` when `DecodeSpec.trace` is set.

Beside the chain sampler, not inside it: `verify` is the spec's verification rule, which with
`spec.trace` also returns the numbers it computed (`rejection.verify(with_details=True)`: the
same draws), and `record` keeps them in the state.
"""

from __future__ import annotations

import jax.numpy as jnp

from specjax.decoding.state import DecodeState
from specjax.sampling.rejection import verify as verify_with_details


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
