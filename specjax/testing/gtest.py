"""The G-test of sampled continuations against their exact law, and what it can see.

One check is a family of L + 1 tests on the same N samples: the whole continuation (V^L cells)
and each position's marginal (V cells). Cells whose expected count is below 5 are pooled into
one, as the chi-square approximation of the G statistic asks, and G is divided by Williams'
(1976) correction q = 1 + (sum 1 / p_i - 1) / (6 N df) over the cells tested: where many cells
expect only a handful of samples the uncorrected G runs large, so the test rejects an exact
sampler more often than its level says (the wide pair's 32^3 continuations at 50,000 samples:
3.3% of exact multinomial draws rejected at 1%, 1.3% with q; tests/kit/test_conformance.py). On the
suite's pair q - 1 is at most 1.4% (4,000 samples) and 0.6-1% at 50,000 to 100,000. The check's
tests (`tests`) apply q; `p_value`, which the suite's own distribution tests call on the dense
laws of their cases, keeps the plain G. The family-wise level is split
evenly (Bonferroni, valid whatever the tests' dependence): each test rejects when its p-value is
below level / (L + 1).

Power. Against a sampler whose law is off by a chi-square distance d^2 = sum (a - e)^2 / e, the
G statistic is approximately noncentral chi-square with noncentrality N d^2, so the smallest
bias the test sees with probability 0.9 at level alpha is the d^2 that solves
P(chi2(df, N d^2) > crit(alpha)) = 0.9. It is reported as a Kullback-Leibler divergence,
KL ~ d^2 / 2 nats (the two agree to second order), so that N and the bias trade off plainly:
twice the samples see half the divergence.
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["Test", "continuation_counts", "detectable_kl", "g_test", "marginals", "p_value",
           "pool", "tests"]

POWER = 0.9


def _stats():
    # scipy is an optional dependency (the `test` and `testing` extras), not the library's.
    try:
        from scipy import optimize, stats
    except ImportError as e:    # pragma: no cover - the extras install it
        raise ImportError("specjax.testing needs scipy: pip install 'specjax[testing]'") from e
    return stats, optimize


def continuation_counts(samples: np.ndarray, vocab: int) -> np.ndarray:
    """[N, L] token ids -> [V^L] counts of each continuation, in lexicographic order."""
    samples = np.asarray(samples)
    length = samples.shape[1]
    index = (samples.astype(np.int64) * vocab ** np.arange(length - 1, -1, -1)).sum(axis=1)
    return np.bincount(index, minlength=vocab ** length).astype(np.float64)


def marginals(law: np.ndarray, vocab: int, length: int) -> np.ndarray:
    """[V^L] law of continuations -> [L, V] law of the token at each position."""
    cube = law.reshape((vocab,) * length)
    return np.stack([cube.sum(axis=tuple(a for a in range(length) if a != i))
                     for i in range(length)])


def pool(observed: np.ndarray, expected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cells with expected count < 5 merged into one (kept apart from the rest)."""
    sparse = expected < 5
    if sparse.any():
        observed = np.append(observed[~sparse], observed[sparse].sum())
        expected = np.append(expected[~sparse], expected[sparse].sum())
    return observed, expected


def g_test(observed: np.ndarray, law: np.ndarray, williams: bool = False
           ) -> tuple[float, int, float]:
    """G statistic (divided by Williams' q unless `williams` is False), degrees of freedom and
    p-value of `observed` counts against `law` (the probability of each cell; cells pooled as
    in the module docstring). A sample in a cell of probability 0 gives G = inf and p = 0."""
    stats, _ = _stats()
    observed = np.asarray(observed, np.float64)
    expected = np.asarray(law, np.float64) * observed.sum()
    observed, expected = pool(observed, expected)
    expected *= observed.sum() / expected.sum()   # a float32 law sums to 1 within rounding
    seen = observed > 0
    with np.errstate(divide="ignore"):
        g = 2 * np.sum(observed[seen] * np.log(observed[seen] / expected[seen]))
    df = len(observed) - 1
    n = observed.sum()
    possible = expected > 0            # a cell of probability 0 is the G = inf case above
    if williams and df > 0 and n > 0 and np.isfinite(g):
        g /= 1 + (np.sum(n / expected[possible]) - 1) / (6 * n * df)
    return float(g), df, float(stats.chi2.sf(g, df))


def p_value(samples: np.ndarray, law: np.ndarray, vocab: int) -> float:
    """The p-value of the whole-continuation G-test of `samples` [N, L] against `law` [V^L]."""
    return g_test(continuation_counts(samples, vocab), law)[2]


def detectable_kl(df: int, samples: int, alpha: float, power: float = POWER) -> float:
    """The smallest KL divergence (nats, ~ d^2 / 2) that a G-test with `df` degrees of freedom
    on `samples` samples rejects at level `alpha` with probability `power`."""
    stats, optimize = _stats()
    crit = stats.chi2.isf(alpha, df)
    noncentrality = optimize.brentq(lambda nc: stats.ncx2.sf(crit, df, nc) - power,
                                    1e-9, 1e6)
    return noncentrality / samples / 2


@dataclasses.dataclass(frozen=True)
class Test:
    """One G-test of a check: what it looked at, its statistic and verdict."""

    name: str                 # "continuation" or "position i" (1-based)
    g: float
    df: int
    p_value: float
    threshold: float          # rejects when p_value < threshold
    detectable_kl: float      # the bias this test sees with probability 0.9

    @property
    def rejected(self) -> bool:
        return self.p_value < self.threshold


def tests(samples: np.ndarray, law: np.ndarray, vocab: int, level: float) -> list[Test]:
    """The L + 1 tests of one check (module docstring), each at level / (L + 1)."""
    samples = np.asarray(samples)
    n, length = samples.shape
    threshold = level / (length + 1)
    out = []
    g, df, p = g_test(continuation_counts(samples, vocab), law, williams=True)
    out.append(Test("continuation", g, df, p, threshold, detectable_kl(df, n, threshold)))
    for i, law_i in enumerate(marginals(law, vocab, length)):
        g, df, p = g_test(np.bincount(samples[:, i], minlength=vocab), law_i, williams=True)
        out.append(Test(f"position {i + 1}", g, df, p, threshold,
                        detectable_kl(df, n, threshold)))
    return out
