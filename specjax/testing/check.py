"""`check`: run a sampler, compare its samples with the exact law, and say whether it is lossless.

    from specjax import testing

    def my_sampler(pair, prompt, seed, *, samples, length, sampling):
        ...                                   # -> int array [samples, length]

    report = testing.check(my_sampler, sampling=SamplingParams(temperature=0.7, top_p=0.9))
    print(report)                             # the verdict table
    testing.assert_lossless(my_sampler)       # the same, raising AssertionError if not

The sampler is a plain function. It gets the `Pair` (a target and a draft, runnable with specjax
or saved for another framework), the prompt (token ids), a seed, and the request: how many
independent continuations to draw, how long, under which sampling setting. It returns their
tokens. Everything else (the law, the tests, the verdict) is here.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import numbers
import time
from typing import Callable

import numpy as np

from specjax.sampling.logits import SamplingParams
from specjax.testing import gtest
from specjax.testing.law import Pair, exact_law, pair as named_pair

__all__ = ["Report", "assert_lossless", "check"]

Sampler = Callable[..., np.ndarray]

SAMPLES = 100_000
LENGTH = 3
LEVEL = 0.01
MAX_CELLS = 2 ** 20     # continuations the law enumerates (32^4, 6^7)


@dataclasses.dataclass(frozen=True)
class Report:
    """The outcome of one check: its L + 1 tests and the verdict."""

    name: str
    pair: str
    sampling: SamplingParams
    samples: int
    level: float                    # family-wise, over `tests`
    tests: tuple[gtest.Test, ...]
    seconds: float                  # the sampler's time
    controls: dict | None = None    # the penalties and bias sampled under

    @property
    def lossless(self) -> bool:
        """No test rejects: the samples are consistent with the target's law at `level`."""
        return not any(t.rejected for t in self.tests)

    @property
    def p_value(self) -> float:
        """The family's adjusted p-value: the smallest p-value times the number of tests
        (Bonferroni), at most 1. The check rejects when this is below `level`."""
        return min(1.0, min(t.p_value for t in self.tests) * len(self.tests))

    @property
    def detectable_kl(self) -> float:
        """The divergence (nats) of the continuation's law that the whole-continuation test
        rejects with probability 0.9 at this sample size and level."""
        return self.tests[0].detectable_kl

    def __str__(self) -> str:
        s = self.sampling
        setting = f"T={s.temperature:g}" + (f" top-k={s.top_k}" if s.top_k else "") + (
            f" top-p={s.top_p:g}" if s.top_p < 1 else "") + (
            f" {self.controls}" if self.controls else "")
        lines = [f"{self.name}: {'LOSSLESS' if self.lossless else 'NOT LOSSLESS'} "
                 f"(adjusted p = {self.p_value:.3g}, family-wise level {self.level:g}; "
                 f"{self.samples:,} samples, pair {self.pair!r}, {setting})",
                 f"  {'test':<14}{'G':>12}{'df':>6}{'p':>12}{'rejects below':>15}"
                 f"{'sees KL >=':>12}"]
        for t in self.tests:
            lines.append(f"  {t.name:<14}{t.g:>12.1f}{t.df:>6}{t.p_value:>12.3g}"
                         f"{t.threshold:>15.2g}{t.detectable_kl:>12.2g}"
                         + ("  rejected" if t.rejected else ""))
        return "\n".join(lines)


@functools.lru_cache(maxsize=64)
def _law(pair: Pair, sampling: SamplingParams, length: int, controls: str = "") -> np.ndarray:
    return exact_law(pair.target, pair.prompt, sampling, length,
                     controls=_unkey(controls) if controls else None)


def _key(controls: dict) -> str:
    """`controls` as a hashable key (the bias's ids as strings, as JSON has them)."""
    return json.dumps(controls, sort_keys=True)


def _unkey(key: str) -> dict:
    controls = json.loads(key)
    if controls.get("logit_bias"):
        controls["logit_bias"] = {int(k): v for k, v in controls["logit_bias"].items()}
    return controls


def check(sampler: Sampler, *, pair: Pair | str = "close", sampling: SamplingParams | None = None,
          length: int = LENGTH, samples: int = SAMPLES, seed: int = 0, level: float = LEVEL,
          name: str | None = None, controls: dict | None = None) -> Report:
    """Draw `samples` continuations of `length` tokens from `sampler` and test them against the
    target's exact law under `sampling` (default: temperature 1), at family-wise `level`.

    Args:
      sampler: `sampler(pair, prompt, seed, *, samples, length, sampling)` -> int [samples,
        length], each row an independent continuation of `prompt` (module docstring).
      pair: a `Pair`, or the name of one of `specjax.testing.PAIRS`.
      sampling: the `SamplingParams` the sampler is asked to sample the target under; greedy
        (temperature 0) is not a distribution test and is refused.
      length: tokens per continuation, 1-8, with V^length (the law's cells) at most
        `MAX_CELLS`.
      samples: continuations to draw (sets the power: `Report.detectable_kl`).
      seed: handed to the sampler; fixed seeds make the verdict reproducible.
      level: family-wise significance level of the check's tests (Bonferroni).
      controls: penalties, a logit bias or a minimum length (`generate`'s keywords:
        repetition_penalty, presence_penalty, frequency_penalty, logit_bias, min_tokens) the
        target is sampled under: the law applies them at each position given the prompt and
        the continuation before it (`law.controlled`), and the sampler gets them as the keyword
        `controls` (only when given).
    """
    pair = named_pair(pair) if isinstance(pair, str) else pair
    sampling = SamplingParams() if sampling is None else sampling
    if not isinstance(pair, Pair):
        raise TypeError(f"pair must be a specjax.testing.Pair or a pair's name, got {pair!r}")
    if not isinstance(sampling, SamplingParams):
        raise TypeError(f"sampling must be a SamplingParams, got {sampling!r}")
    if sampling.greedy:
        raise ValueError("sampling.temperature must be > 0: at temperature 0 the law is one "
                         "continuation, compare tokens instead")
    for key, value, low, high in (("length", length, 1, 8), ("samples", samples, 1, 10 ** 8),
                                  ("seed", seed, 0, 2 ** 32 - 1)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not (
                low <= value <= high):
            raise ValueError(f"{key} must be an integer in [{low}, {high}], got {value!r}")
    if isinstance(level, bool) or not isinstance(level, numbers.Real) or not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    if pair.vocab ** length > MAX_CELLS:
        raise ValueError(f"length {length} gives {pair.vocab ** length:,} continuations of the "
                         f"pair's {pair.vocab} tokens: the law enumerates at most {MAX_CELLS:,}")

    start = time.perf_counter()
    extra = {"controls": controls} if controls else {}
    tokens = sampler(pair, np.array(pair.prompt, np.int32), seed, samples=samples, length=length,
                     sampling=sampling, **extra)
    seconds = time.perf_counter() - start
    tokens = _checked_tokens(tokens, samples, length, pair.vocab)
    law = _law(pair, sampling, length, _key(controls) if controls else "")
    tests = gtest.tests(tokens, law, pair.vocab, level)
    return Report(name or getattr(sampler, "__name__", "sampler"), pair.name, sampling, samples,
                  level, tuple(tests), seconds, controls)


def _checked_tokens(tokens, samples: int, length: int, vocab: int) -> np.ndarray:
    tokens = np.asarray(tokens)
    if tokens.shape != (samples, length):
        raise ValueError(f"the sampler returned an array of shape {tokens.shape}, expected "
                         f"(samples, length) = {(samples, length)}")
    if not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"the sampler returned {tokens.dtype} tokens, expected integer ids")
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab):
        raise ValueError(f"the sampler returned token ids outside [0, {vocab})")
    return tokens


def assert_lossless(sampler: Sampler, **kwargs) -> Report:
    """`check(sampler, **kwargs)`, raising AssertionError with the verdict table when a test
    rejects. Returns the report otherwise. For a user's own suite:

        def test_my_decoder_is_lossless():
            specjax.testing.assert_lossless(my_sampler, sampling=SamplingParams(0.7, top_p=0.9))
    """
    report = check(sampler, **kwargs)
    if not report.lossless:
        raise AssertionError(f"the sampler does not draw from the target's law:\n{report}")
    return report
