"""The sampling rules of one decoding step, as data: how a draft token is drawn, and how a chain
and a tree of drafted tokens are verified.

`Rules()` holds the rules of Theorem 1 (Chen et al. 2023): `propose` returns each drawn token
with the distribution it was drawn from, `candidates` draws a tree node's children (or takes the
draft's top tokens), `rejection.verify` accepts drafted tokens with
probability min(1, q/p) and draws the residual, `rejection.verify_tree` walks a tree with the
rule that is exact for its candidate scheme, and `controls` applies each row's penalties, bias
and minimum length to the target's logits at every position (`sampling.controls.apply_controls`).
Passing other rules to `specjax.generate(..., rules=Rules(verify=...))` runs every method with
them, so that a rule can be studied under the distribution tests: the negative controls of
tests/exactness/test_distribution.py and tests/exactness/test_controls.py pass deliberately broken rules and the
tests must catch them.

A `verify` returns a `rejection.Verdict` and a `verify_tree` a `rejection.TreeVerdict`, as the
defaults do. `specjax.explain` runs the same rules with `with_details=True`: a rule it shows
must take that keyword (as the defaults do) and then fill its verdict's `details`, so the
numbers shown are those of the rule that chose the tokens (`returns_details`).

`COUPLED` is the other rule a user can choose (`generate(..., coupled=True)`): the target's own
Gumbel-max draw at every position, drafts kept while they equal it (`sampling.coupled`), so the
same seed gives autoregressive sampling's text with every method.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

from specjax.sampling import coupled
from specjax.sampling.controls import apply_controls
from specjax.sampling.logits import SamplingParams, probs_from_logits, sample_rows
from specjax.sampling.rejection import verify, verify_tree


def propose(keys: jax.Array, logits: jax.Array, sampling: SamplingParams):
    """Draws one draft token per row and returns it with the distribution it was drawn from.

    Args:
      keys: [B] keys; logits: [B, V]. Returns token [B] int32 and p [B, V] float32.
    """
    p = probs_from_logits(logits, sampling)
    return sample_rows(keys, p), p


def candidates(scheme: str, key, logits, p, width: int):
    """The first `width` candidate children of each node of one row, for a drafter that has a
    distribution at each node.

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


@dataclasses.dataclass(frozen=True)
class Rules:
    """Static (hashable) like the rest of a decoding spec; each field is a function with the
    signature of its default."""
    propose: Callable = propose
    candidates: Callable = candidates
    verify: Callable = verify
    verify_tree: Callable = verify_tree
    # The rows' penalties, bias and minimum length on the target's logits at each position
    # (`sampling.controls.apply_controls`; a negative control passes one that forgets the drafts).
    controls: Callable = apply_controls
    # How the methods key these rules' draws (`decoding.state.StepKeys`): False, by step, as
    # Algorithm 2 wants fresh draws each step; True, by position (the token at position t of a
    # row from fold_in(row key, t)), as the coupled rule needs.
    by_position: bool = False


# The coupled rule (`sampling.coupled`): every method returns autoregressive sampling's tokens
# under the same seed. Drafts are proposed with the position's noise: `propose` is the default
# Gumbel-max draw, given the position's key.
COUPLED = Rules(candidates=coupled.candidates, verify=coupled.verify,
                verify_tree=coupled.verify_tree, by_position=True)


def returns_details(rule: Callable) -> bool:
    """Whether a verification rule takes `with_details` (and so can return the numbers it
    computed, as `rejection.verify` and `rejection.verify_tree` do)."""
    try:
        parameters = inspect.signature(rule).parameters
    except (TypeError, ValueError):       # a builtin or C function: nothing to read
        return False
    return "with_details" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
