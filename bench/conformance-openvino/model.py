"""Does the reading of OpenVINO GenAI's verification explain what the engine samples? (issue 86)

    SPECJAX_OPENVINO_PYTHON=/path/to/venv-ov/bin/python \
        python bench/conformance-openvino/model.py [SAMPLES [COUNTS.npy]]

The law of 3-token continuations is enumerated under the rule as read in openvino.genai's
`Sampler::validate_candidate` and the loop that calls it (docs/conformance.md), k = 2 drafts a
step, on the kit's pair at T = 1, with the draft's and the target's draws independent:
  - at a draft position the target draws its own y ~ q; in the first step (every generated token
    still a draft) the draft x ~ p is kept when x == y, later when r <= p(x) / q(y), r uniform on
    {0, 0.01, ..., 1};
  - on a rejection the position's token is drawn from the target's law at the next position
    (after x), and the step ends; when every draft is kept the target adds a bonus token.
The engine's samples (the table's, drawn again, or COUNTS saved by an earlier run) are G-tested
against it and against the target's law. The draws are not independent: the draft's and the
target's samplers are both seeded with the request's `rng_seed`, so their first draws share one
uniform. The first token's law is computed both ways (later steps' streams have drifted apart
by then, which this does not model) and the engine's first tokens tested against each.
"""

from __future__ import annotations

import functools
import sys

import numpy as np

from specjax import testing
from specjax.sampling.params import SamplingParams
from specjax.testing import gtest, openvino
from specjax.testing.law import exact_law

K, LENGTH, T1 = 2, 3, SamplingParams(1.0)
R = np.arange(101) / 100


def read_law(pair, first: str = "match", replacement: str = "next") -> np.ndarray:
    """[V^LENGTH] the law of the rule as read; `first` "ratio" applies the ratio in the first
    step too, and "target" has the target alone give the first token; `replacement` "residual"
    draws a rejected position from max(q - p, 0) (the alternatives the engine is also tested
    against)."""
    lookup, vocab = pair.lookup(), pair.vocab

    @functools.lru_cache(maxsize=None)
    def probs(model: str, context: tuple) -> np.ndarray:
        row = np.array([list(context) + [0] * (8 - len(context))])
        return testing.warp(lookup.logits(model, row, np.array([len(context)])), T1)[0]

    def keep(context: tuple, x: int, first_step: bool) -> float:
        p, q = probs("draft", context), probs("target", context)
        if first_step and first == "match":
            return float(q[x])                                   # x kept when x == y ~ q
        return float(q @ (R[None, :] <= p[x] / q[:, None]).mean(axis=1))

    def replaced(context: tuple, x: int) -> np.ndarray:
        if replacement == "next":
            return probs("target", context + (x,))               # the next position's law
        rest = np.maximum(probs("target", context) - probs("draft", context), 0)
        return rest / rest.sum()

    law = np.zeros(vocab ** LENGTH)

    def step(context: tuple, weight: float, first_step: bool) -> None:
        if len(context) >= LENGTH:
            law[sum(t * vocab ** (LENGTH - 1 - i) for i, t in enumerate(context))] += weight
        elif first_step and first == "target":
            for z, q_z in enumerate(probs("target", context)):
                step(context + (z,), weight * q_z, False)
        else:
            walk(context, weight, first_step, 0)

    def walk(context: tuple, weight: float, first_step: bool, i: int) -> None:
        if len(context) >= LENGTH:
            return step(context, weight, False)
        if i == K:                                               # every draft kept: the bonus
            for z, q_z in enumerate(probs("target", context)):
                step(context + (z,), weight * q_z, False)
            return
        for x, p_x in enumerate(probs("draft", context)):
            a = keep(context, x, first_step)
            walk(context + (x,), weight * p_x * a, first_step, i + 1)
            for z, r_z in enumerate(replaced(context, x)):
                step(context + (z,), weight * p_x * (1 - a) * r_z, False)

    step((), 1.0, True)
    return law


def first_token_law(pair, coupled: bool) -> np.ndarray:
    """[V] the first token's law as read (the first step's match rule, the next position's
    law on a rejection), the draft's x and the target's y drawn independently or, `coupled`,
    from one uniform through each one's cumulative distribution (both samplers seeded with the
    request's `rng_seed`: the same first draw)."""
    lookup = pair.lookup()
    logits = lambda model, context: testing.warp(lookup.logits(           # noqa: E731
        model, np.array([list(context) + [0] * (8 - len(context))]),
        np.array([len(context)])), T1)[0]
    p, q = logits("draft", ()), logits("target", ())
    if coupled:      # P(x, y): the overlap of x's interval of the draft's CDF and y's of q's
        fp, fq = np.concatenate([[0], np.cumsum(p)]), np.concatenate([[0], np.cumsum(q)])
        joint = np.clip(np.minimum(fp[1:, None], fq[None, 1:])
                        - np.maximum(fp[:-1, None], fq[None, :-1]), 0, None)
    else:
        joint = p[:, None] * q[None, :]
    out = np.zeros_like(q)
    for x in range(len(p)):
        out[x] += joint[x, x]
        out += (joint[x].sum() - joint[x, x]) * logits("target", (x,))
    return out / out.sum()


def main(samples: int) -> None:
    pair = testing.pair("close")
    law = read_law(pair)
    assert abs(law.sum() - 1) < 1e-6, law.sum()
    target = exact_law(pair.target, pair.prompt, T1, LENGTH)
    print(f"the reading's law: KL from the target's {np.sum(law * np.log(law / target)):.3f} "
          f"nats")
    if len(sys.argv) > 2:                        # counts saved by an earlier run
        counts = np.load(sys.argv[2])
    else:
        sampler = openvino.openvino_sampler("draft")
        tokens = sampler(pair, np.array(pair.prompt), 0, samples=samples, length=LENGTH,
                         sampling=T1)
        counts = gtest.continuation_counts(tokens, pair.vocab)
        np.save("/tmp/openvino-draft-t1-counts.npy", counts)
    print(f"openvino-genai {openvino.engine_version()}, draft model, k = 2, T = 1, "
          f"{samples:,} samples, seed 0")
    for name, against in (("the target's law", target), ("the law as read", law)):
        g, df, p = gtest.g_test(counts, against)
        print(f"  against {name:<24} G = {g:9.1f} on {df:3d} df, p = {p:.3g}")
    first = counts.reshape(pair.vocab, -1).sum(axis=1)
    print(f"the first token: observed {np.round(first / samples, 4)}")
    for name, against in (("the target's law", target.reshape(pair.vocab, -1).sum(axis=1)),
                          ("read, independent draws", first_token_law(pair, False)),
                          ("read, coupled draws", first_token_law(pair, True))):
        g, df, p = gtest.g_test(first, against)
        print(f"  against {name:<24} {np.round(against, 4)}  G = {g:7.1f} on {df} df, "
              f"p = {p:.3g}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000)
