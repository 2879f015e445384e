"""The sampling rules of one decoding step, as data: how a draft token is drawn, and how a chain
and a tree of drafted tokens are verified.

`Rules()` holds the rules of Theorem 1 (Chen et al. 2023): `propose` returns each drawn token
with the distribution it was drawn from, `rejection.verify` accepts drafted tokens with
probability min(1, q/p) and draws the residual, `rejection.verify_tree` walks a tree with the
rule that is exact for its candidate scheme. Passing other rules to `specjax.generate(...,
rules=Rules(verify=...))` runs every method with them, so that a rule can be studied under the
distribution tests: the negative controls of tests/test_distribution.py pass deliberately
broken rules and the tests must catch them.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax

from specjax.sampling.logits import SamplingParams, probs_from_logits, sample_rows
from specjax.sampling.rejection import verify, verify_tree


def propose(keys: jax.Array, logits: jax.Array, sampling: SamplingParams):
    """Draws one draft token per row and returns it with the distribution it was drawn from.

    Args:
      keys: [B] keys; logits: [B, V]. Returns token [B] int32 and p [B, V] float32.
    """
    p = probs_from_logits(logits, sampling)
    return sample_rows(keys, p), p


@dataclasses.dataclass(frozen=True)
class Rules:
    """Static (hashable) like the rest of a decoding spec; each field is a function with the
    signature of its default."""
    propose: Callable = propose
    verify: Callable = verify
    verify_tree: Callable = verify_tree
