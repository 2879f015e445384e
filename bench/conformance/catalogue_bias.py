"""How far each of issue 86's four catalogue bugs moves the law, computed exactly, and the sample
size the kit needs to see it (docs/conformance.md, "The catalogue").

    python bench/conformance/catalogue_bias.py          # about a minute

For each bug and setting, the law of its 3-token continuations is enumerated through its step
(k = 2 drafts, each accepted with the bug's probability, the residual or the bonus after them),
on the kit's pair, and compared with the target's law (`law.exact_law`): the chi-square
distance d^2 = sum (a - e)^2 / e and d^2 / 2, the KL the kit's reports use; the mass the bug puts
on continuations the target never samples; and the smallest sample size at which the check's
whole-continuation test rejects with probability 0.9 at the catalogue's per-test level (the
family of the catalogue's checks at 0.01, 4 tests a check). shared-seed-first-step's law is
enumerated through its first step, the target's law after it. Algorithm 2 itself, enumerated the same way,
must give the target's law to rounding: the enumeration's own check. Then the kit's check of the
101-valued uniform at T = 1, at 100,000 and 500,000 samples.
"""

from __future__ import annotations

import functools

import numpy as np

from specjax import testing
from specjax.sampling.params import SamplingParams
from specjax.testing import gtest
from specjax.testing.catalogue import CATALOGUE, SharedSeedFirstStep, UniformOf101Values

K, LENGTH = 2, 3
LEVEL = 0.01 / len(CATALOGUE) / (LENGTH + 1)
T1, T07_TOP_P = SamplingParams(1.0), SamplingParams(0.7, top_p=0.9)


def algorithm2(p, q, x):
    """Accept probability of draft x: min(1, q(x) / p(x))."""
    return min(1.0, q[x] / p[x])


def draft_over_target_sample(p, q, x):
    """E over the target's own sample y ~ q of P(u <= p(x) / q(y)) = sum_y min(q(y), p(x))."""
    return float(np.minimum(q, p[x]).sum())


def uniform_of_101(p, q, x):
    """P(u p(x) <= q(x)) for u uniform on {0, 0.01, ..., 1}, as the reference computes it."""
    return float(np.mean(np.arange(101) / 100 * p[x] <= q[x]))


def residual(p, q):
    weights = np.maximum(q - p, 0)
    return weights / weights.sum() if weights.sum() > 0 else q


def enumerated_law(pair, sampling, accept, verifier_at_drafts=None):
    """The law [V^LENGTH] of a k = 2 chain whose draft x at a draft position is accepted with
    `accept(p, q, x)`; `verifier_at_drafts` replaces the sampling the verifier uses at the draft
    positions (the bonus keeps `sampling`)."""
    lookup, vocab = pair.lookup(), pair.vocab

    @functools.lru_cache(maxsize=None)
    def probs(model, context, setting):
        row = np.array([list(context) + [0] * (8 - len(context))])
        return testing.warp(lookup.logits(model, row, np.array([len(context)])), setting)[0]

    law = np.zeros(vocab ** LENGTH)

    def emit(context, weight):
        if len(context) >= LENGTH:
            index = sum(t * vocab ** (LENGTH - 1 - i) for i, t in enumerate(context[:LENGTH]))
            law[index] += weight
            return
        walk(context, weight, 0)

    def walk(context, weight, i):
        """Draft position i of a step that began before context[-i:]."""
        if i == K:                                                   # every draft accepted
            for z, q_z in enumerate(probs("target", context, sampling)):
                emit(context + (z,), weight * q_z)
            return
        p = probs("draft", context, sampling)
        q = probs("target", context, verifier_at_drafts or sampling)
        for x in np.flatnonzero(p):
            a = accept(p, q, x)
            for y, r_y in enumerate(residual(p, q)):
                if r_y > 0:
                    emit(context + (y,), weight * p[x] * (1 - a) * r_y)
            if a > 0:
                walk(context + (int(x),), weight * p[x] * a, i + 1)

    emit((), 1.0)
    return law


def shared_seed_first_step_law(pair, sampling):
    """The law [V^LENGTH] of `shared-seed-first-step`: in the first step the i-th draft x and
    the target's sample y come from one uniform (P(x, y) the overlap of their intervals of the
    two cumulative distributions), x kept when x == y, a mismatch filled from the target's law
    after x, the bonus after k matches; the steps after it are Algorithm 2, exact, so the rest
    of a continuation follows the target's law given the first step's tokens."""
    lookup, vocab = pair.lookup(), pair.vocab

    @functools.lru_cache(maxsize=None)
    def probs(model, context):
        row = np.array([list(context) + [0] * (8 - len(context))])
        return testing.warp(lookup.logits(model, row, np.array([len(context)])), sampling)[0]

    law = np.zeros(vocab ** LENGTH)

    def rest(context, weight):                      # the target's law from here on
        if len(context) >= LENGTH:
            law[sum(t * vocab ** (LENGTH - 1 - i) for i, t in enumerate(context[:LENGTH]))] \
                += weight
            return
        for z, q_z in enumerate(probs("target", context)):
            if q_z > 0:
                rest(context + (z,), weight * q_z)

    def first_step(context, weight, i):
        if i == K or len(context) >= LENGTH:         # every draft matched: the bonus, then on
            return rest(context, weight)
        p, q = probs("draft", context), probs("target", context)
        fp, fq = np.r_[0, np.cumsum(p)], np.r_[0, np.cumsum(q)]
        joint = np.clip(np.minimum(fp[1:, None], fq[None, 1:])
                        - np.maximum(fp[:-1, None], fq[None, :-1]), 0, None)
        for x in np.flatnonzero(p):
            x = int(x)
            if joint[x, x] > 0:
                first_step(context + (x,), weight * joint[x, x], i + 1)
            late = probs("target", context + (x,))   # the next position's law fills x's
            for z in np.flatnonzero(late):
                rest(context + (int(z),), weight * (p[x] - joint[x, x]) * late[z])

    first_step((), 1.0, 0)
    return law


def samples_needed(df, d2):
    """The smallest N (to 2%) at which the test of `df` degrees of freedom sees d^2 / 2."""
    n = 100
    while gtest.detectable_kl(df, n, LEVEL) > d2 / 2:
        n = int(n * 1.02) + 1
    return n


def main():
    pair = testing.pair("close")
    cases = [("algorithm-2 (control)", T1, algorithm2, None),
             ("algorithm-2 (control)", T07_TOP_P, algorithm2, None),
             ("draft-over-target-sample-ratio", T1, draft_over_target_sample, None),
             ("draft-over-target-sample-ratio", T07_TOP_P, draft_over_target_sample, None),
             ("uniform-of-101-values", T1, uniform_of_101, None),
             ("uniform-of-101-values", T07_TOP_P, uniform_of_101, None),
             ("controls-missing-at-drafts", T07_TOP_P, algorithm2, T1),
             ("shared-seed-first-step", T1, None, None),      # its own enumeration
             ("shared-seed-first-step", T07_TOP_P, None, None)]
    print(f"pair 'close', k = {K}, {LENGTH} tokens; per-test level {LEVEL:.3g}")
    print(f"{'entry':<32}{'setting':<16}{'d^2 / 2':>10}{'mass at q=0':>13}{'max |a-e|':>11}"
          f"{'N to see':>12}")
    for name, sampling, accept, verifier in cases:
        target = testing.law.exact_law(pair.target, pair.prompt, sampling, LENGTH)
        got = (enumerated_law(pair, sampling, accept, verifier) if accept
               else shared_seed_first_step_law(pair, sampling))
        assert abs(got.sum() - 1) < 1e-9, got.sum()
        possible = target > 0
        d2 = float(np.sum((got[possible] - target[possible]) ** 2 / target[possible]))
        outside = float(got[~possible].sum())
        df = int((target * 100_000 >= 5).sum())       # the pooled test's cells at 10^5, less 1
        needed = "-" if outside > 0 or d2 < 1e-9 else f"{samples_needed(df, d2):,}"
        setting = "T=1" if sampling == T1 else "T=0.7 top-p=0.9"
        print(f"{name:<32}{setting:<16}{d2 / 2:>10.2e}{outside:>13.2e}"
              f"{np.abs(got - target).max():>11.2e}{needed:>12}")


def measured():
    """The enumeration of shared-seed-first-step against 100,000 of the entry's own samples
    (seed 1), at each setting; then the 101-valued uniform at T = 1, where no draft has target
    probability 0, checked by the kit at the catalogue's per-check level: the granularity
    alone."""
    pair = testing.pair("close")
    for sampling, setting in ((T1, "T=1"), (T07_TOP_P, "T=0.7 top-p=0.9")):
        tokens = testing.numpy_step(SharedSeedFirstStep())(pair, pair.prompt, 1, samples=100_000,
                                                           length=LENGTH, sampling=sampling)
        g, df, p = gtest.g_test(gtest.continuation_counts(tokens, pair.vocab),
                                shared_seed_first_step_law(pair, sampling))
        print(f"shared-seed-first-step {setting}: 100,000 samples against its enumerated law: "
              f"G = {g:.1f} on {df} df, p = {p:.3g}")
    step = UniformOf101Values()
    for samples in (100_000, 500_000):
        report = testing.check(testing.numpy_step(step), sampling=T1, samples=samples,
                               level=0.01 / len(CATALOGUE), name="uniform-of-101-values T=1")
        print(report)


if __name__ == "__main__":
    main()
    measured()
