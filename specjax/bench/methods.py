"""What the bench knows of the methods beyond their classes: the other engines that run each one
(`PEERS`, timed beside it) and the settings measured fastest on SmolLM2, by dtype (`DEFAULTS`),
which the command line runs when no length is given (`measured_default`).

A method named in neither runs alone, with its object's own defaults.
"""

from __future__ import annotations

import dataclasses

from specjax.api.methods import EAGLE_TREES
from specjax.model.config import DTYPES

# The other engines that run the same method, which the bench times beside ours.
PEERS = {"autoregressive": ("transformers", "llama.cpp"), "speculative": ("transformers",),
         "ngram": ("transformers", "llama.cpp")}


@dataclasses.dataclass(frozen=True)
class Measured:
    """A method's measured best in one dtype: its options as (option, value) pairs (() keeps
    the object's own defaults) and where the measurement is recorded."""
    options: tuple[tuple[str, object], ...]
    source: str


_ISSUE_74 = ("docs/benchmarks.md, 'Defaults': bench/smollm2-defaults/ (Zen 3) and the Xeon "
             "run of bench/smollm2-sweep/, float32, greedy")
_ISSUE_83 = ("issue 83's table, Xeon (Sapphire Rapids class), two prompts: EAGLE's default tree "
             "slower than plain decoding, a chain of 2 faster")

# By method, then dtype. A dtype missing from a method's entry has no measurement of its own and
# runs float32's (`measured_default`): speculative decoding's and n-gram lookup's were measured
# in float32 only (n-gram ran K = 2 alone in bfloat16, int8 and q8_0, with nothing to compare).
DEFAULTS = {
    "speculative": {"float32": Measured((("k_schedule", "confidence"),), _ISSUE_74)},
    "ngram": {"float32": Measured((("k", 2),), _ISSUE_74)},
    # The method's own choice (`api.methods.EAGLE_TREES`, which `Eagle` runs when given no tree
    # or k), here with where it was measured.
    "eagle": {
        # The tree its drafter ships (dynamic 4,4,8 greedy, a chain of 2 sampled).
        "float32": Measured((), "docs/benchmarks.md, EAGLE-2's trees chosen again (float32)"),
        "bfloat16": Measured((("tree", EAGLE_TREES["bfloat16"]),),
                             _ISSUE_83 + " (tokens/s: autoregressive 59.5, tree 54.8, chain 70.7)"),
        "int8": Measured((("tree", EAGLE_TREES["int8"]),),
                         _ISSUE_83 + " (84.4, 64.9, 100.5); bench/smollm2-llamacpp-int8 (Zen 4): "
                         "tree 0.76x, chain of 2 1.09x"),
        # With the packed q8_0 kernel (issue 92) on the Xeon: tree 1.04x, chain of 2 1.20x
        # (bench/smollm2-q8_0-packed); before it, on the Zen 4 host, a tie
        # (bench/smollm2-llamacpp-q8_0: tree 1.35x, spread 21.7%; chain of 2 1.31x).
        "q8_0": Measured((("tree", EAGLE_TREES["q8_0"]),),
                         _ISSUE_83 + " (76.3, 70.8, 98.0); bench/smollm2-q8_0-packed (Xeon): "
                         "tree 1.04x, chain of 2 1.20x"),
    },
}


def measured_default(method: str, dtype: str) -> tuple[tuple[str, object], ...]:
    """The options `method` runs in `dtype` when no length is given: the dtype's measured best,
    else float32's, else () (the object's own defaults)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    by_dtype = DEFAULTS.get(method, {})
    found = by_dtype.get(dtype, by_dtype.get("float32"))
    return found.options if found is not None else ()
