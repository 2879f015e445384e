"""Real decoders as catalogue entries: specjax's own methods and transformers' assisted
generation and prompt lookup, checked the same way as the numpy references."""

from __future__ import annotations

from specjax.sampling.logits import SamplingParams
from specjax.sampling.tree import Tree
from specjax.testing.adapters import specjax_rules
from specjax.testing.hf import transformers_sampler
from specjax.testing.verdict import Entry

__all__ = ["TRANSFORMERS_SAMPLES", "specjax_entries", "transformers_entries"]

SETTINGS = {"t1": SamplingParams(1.0), "t0.7-top-p": SamplingParams(0.7, top_p=0.9)}

# transformers' assisted generation takes one prompt per call (10-20 ms each on a 2-core host):
# 4,000 samples a setting keep the four checks within five minutes. At that size and level the
# check rejects 8 of the catalogue's 10 bugs (all but the two subtlest: docs/conformance.md).
TRANSFORMERS_SAMPLES = 4_000


def specjax_entries() -> tuple[Entry, ...]:
    """specjax's speculative chain, token tree and n-gram decoding, expected exact."""
    methods = {
        "speculative-k2": dict(method="speculative", k=2),
        "speculative-tree-2x2": dict(method="speculative", tree=Tree.full((2, 2)),
                                     candidates="distinct"),
        "ngram-k2": dict(method="ngram", k=2),
    }
    return tuple(
        Entry(f"specjax {name} {setting}", True, "specjax.generate",
              f"specjax's own {options['method']} decoding",
              lambda options=options, name=name: specjax_rules(name=f"specjax {name}", **options),
              sampling=sampling)
        for name, options in methods.items() for setting, sampling in SETTINGS.items())


def transformers_entries(samples: int = TRANSFORMERS_SAMPLES) -> tuple[Entry, ...]:
    """transformers' assisted generation (the pair's draft, 2 tokens a call) and prompt lookup
    (up to 2 tokens), at T = 1 and at T = 0.7 with top-p 0.9; verdicts reported as measured."""
    return tuple(
        Entry(f"transformers {method} {setting}", None, "transformers generate()",
              f"transformers' {method} decoding with do_sample=True",
              lambda method=method: transformers_sampler(method, k=2),
              sampling=sampling, samples=samples)
        for method in ("assisted", "prompt-lookup") for setting, sampling in SETTINGS.items())
