"""Adapters from the samplers people write to the plain function `check` takes.

- `numpy_step(step)`: a decoding step written in numpy over a batch of rows, run until every
  row has its continuation. This is how the catalogue's references are written, and the
  shortest way to check a sampler on paper before it is built.
- `specjax_rules(rules, method=...)`: specjax's own `generate`, with its default rules or a
  `Rules` that replaces one step (how the suite's negative controls are built).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from specjax.api.generate import generate
from specjax.api.methods import build
from specjax.sampling.params import SamplingParams

__all__ = ["numpy_step", "specjax_rules"]

# A step of `numpy_step`:
#     step(rng, lookup, tokens, lengths, sampling) -> (tokens, lengths)
# rng: np.random.Generator; lookup: the pair's `Lookup` (next-token logits of any context);
# tokens: int [N, W], row i's continuation so far is tokens[i, :lengths[i]]; the step appends
# one or more tokens to each row and returns the new tokens and lengths. W leaves room for
# `room` tokens past the requested length.
Step = Callable[..., tuple[np.ndarray, np.ndarray]]


def numpy_step(step: Step, room: int = 16, name: str | None = None):
    """A sampler that runs `step` on the rows that are still short of the requested length,
    until none is; each row's first `length` tokens are its sample."""

    def sampler(pair, prompt, seed, *, samples, length, sampling: SamplingParams,
                controls=None):
        # A step that applies controls holds them itself (`catalogue.Speculative(controls)`).
        rng = np.random.default_rng(seed)
        lookup = pair.lookup()
        tokens = np.zeros((samples, length + room), np.int32)
        lengths = np.zeros(samples, np.int64)
        while (active := np.flatnonzero(lengths < length)).size:
            new_tokens, new_lengths = step(rng, lookup, tokens[active], lengths[active], sampling)
            if np.any(new_lengths <= lengths[active]):
                raise ValueError(f"{sampler.__name__}: a step must add at least one token to "
                                 f"every row")
            tokens[active], lengths[active] = new_tokens, new_lengths
        return tokens[:, :length]

    sampler.__name__ = name or getattr(step, "__name__", "numpy_step")
    return sampler


def specjax_rules(rules=None, method: str = "speculative", k: int = 2, name: str | None = None,
                  **options):
    """A sampler that runs `specjax.generate` with `method` on the pair (one row per sample, in
    one call), with `rules` in place of the default `Rules()` when given. `options` go to the
    method's object as they are (tree=, candidates=, k_schedule=, ...); the kit's controls to
    its `SamplingParams`."""
    def sampler(pair, prompt, seed, *, samples, length, sampling: SamplingParams,
                controls=None):
        extra = dict(options) if method == "autoregressive" else dict(options, k=k)
        if method == "speculative":
            extra["draft"] = pair.draft
        law = dict(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                   min_p=sampling.min_p, **(controls or {}))
        result = generate(pair.target, np.tile(np.asarray(prompt, np.int32), (samples, 1)),
                          build(method, **extra), SamplingParams(**law), max_new_tokens=length,
                          seed=seed, eos_ids=(), rules=rules)
        return np.array(result.tokens, np.int32)

    sampler.__name__ = name or f"specjax {method}"
    return sampler
