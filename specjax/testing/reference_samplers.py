"""The plain NumPy reference's methods (`specjax.reference`) as the kit's reference samplers:
`REFERENCE`, entries of the same kind as the catalogue's, each expected lossless.

Each sampler runs one of the reference's loops once per sample, over the pair's models with
their logits memoized by context: the reference recomputes a whole sequence at every call, and a
check asks for the same few thousand contexts many times.
"""

from __future__ import annotations

import numpy as np

from specjax import reference
from specjax.sampling.params import SamplingParams
from specjax.testing.verdict import Entry

__all__ = ["REFERENCE", "memoized", "reference_sampler"]


def memoized(model):
    """`reference.forward` of `model` as a function of a token list, each context computed
    once."""
    weights, seen = reference.plain(model), {}

    def logits(tokens):
        key = tuple(tokens)
        if key not in seen:
            seen[key] = reference.forward(weights, tokens)
        return seen[key]
    return logits


def reference_sampler(method, name: str, drafted: bool = True, **options):
    """A sampler (`specjax.testing.check`'s kind) that draws each sample with `method`, one of
    `specjax.reference`'s loops, from one NumPy generator seeded by the check; `drafted`: the
    method takes the pair's draft after its target. `options` go to the method."""
    def sampler(pair, prompt, seed, *, samples, length, sampling: SamplingParams,
                controls=None):
        if controls:
            raise ValueError(f"{name}: the reference samples without controls, got {controls}")
        rng = np.random.default_rng(seed)
        models = (memoized(pair.target),) + ((memoized(pair.draft),) if drafted else ())
        return np.array([method(*models, prompt, length, rng, sampling, **options)
                         for _ in range(samples)], np.int32)

    sampler.__name__ = name
    return sampler


def _entry(name: str, method, idea: str, drafted: bool = True, **options) -> Entry:
    return Entry(name, True, "specjax.reference", idea,
                 lambda: reference_sampler(method, name, drafted, **options),
                 sampling=SamplingParams(0.7, top_p=0.9), samples=20_000)


REFERENCE = (
    _entry("reference-autoregressive", reference.autoregressive,
           "one token at a time from the target", drafted=False),
    _entry("reference-speculative", reference.speculative,
           "Algorithm 2 as a whole loop, k = 2", k=2),
    _entry("reference-ngram", reference.ngram,
           "prompt lookup, a one-hot draft, k = 2", drafted=False, k=2),
    _entry("reference-tree", reference.speculative_tree,
           "a tree of widths (2, 2) drawn without replacement, walked over siblings",
           widths=(2, 2)),
)
