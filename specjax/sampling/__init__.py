"""The sampling layer: where logits become a distribution, and the rules of Theorem 1.

`logits` is the one place that turns logits into the distribution sampled from (temperature,
top-k, top-p, min-p, in float32, for the draft, the target and every drafter alike), after
`controls` has applied each row's bias, minimum length and penalties; `rejection` holds the
verification rules (Chen et al. 2023's modified rejection sampling for a chain, and the tree
walk for each candidate scheme), and `reference` the same step for one row in plain NumPy;
`tree` is the static shape of a token tree, a few arrays.

Layer: above `specjax.model`, though it imports nothing from specjax outside itself; below
decoding.
"""

from specjax.sampling.logits import SamplingParams, probs_from_logits, sample, sample_rows
from specjax.sampling.rejection import TreeVerdict, Verdict, verify, verify_tree
from specjax.sampling.tree import Tree, TreeError

__all__ = ["SamplingParams", "Tree", "TreeError", "TreeVerdict", "Verdict", "probs_from_logits",
           "sample", "sample_rows", "verify", "verify_tree"]
