"""The cells a rejected OpenVINO GenAI check singles out (issue 86): for each case, its samples
drawn again (the same seeds as the table's run), and the continuations whose counts contribute
most to the whole-continuation G statistic, with the observed and expected frequencies, and the
mass on continuations the target never samples.

    SPECJAX_OPENVINO_PYTHON=/path/to/venv-ov/bin/python \
        python bench/conformance-openvino/cells.py [SAMPLES [bf16]]

SAMPLES continuations of 3 tokens a case (default 20,000), seed 0, k = 2, the kit's pair;
`bf16`: only plain sampling at the plugin's default precision (bfloat16 on this host).
"""

from __future__ import annotations

import sys

import numpy as np

from specjax import testing
from specjax.testing import clients, gtest, openvino
from specjax.testing.law import exact_law

CASES = (("draft", "f32", False, "t1"), ("draft", "f32", False, "t0.7-top-p"),
         ("draft", "f32", False, "t0.8-top-k-min-p"), ("plain", "default", False, "t1"),
         ("draft", "f32", True, "t1"))
TOP = 4


def main(samples: int) -> None:
    pair = testing.pair("close")
    print(f"openvino-genai {openvino.engine_version()}; pair 'close', {samples:,} samples of 3 "
          f"tokens a case, seed 0, k = 2")
    cases = CASES[3:4] if sys.argv[2:] == ["bf16"] else CASES
    for mode, precision, caching, setting in cases:
        sampling = clients.OPENVINO_SETTINGS[setting]
        sampler = openvino.openvino_sampler(mode, precision=precision, prefix_caching=caching)
        try:
            tokens = sampler(pair, np.array(pair.prompt), 0, samples=samples, length=3,
                             sampling=sampling)
        except RuntimeError as e:                 # the engine failed the request: a finding
            print(f"\n{sampler.__name__} {setting}: FAILED: {e}")
            continue
        law = exact_law(pair.target, pair.prompt, sampling, 3)
        observed = gtest.continuation_counts(tokens, pair.vocab)
        expected = law * samples
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(observed > 0, 2 * observed * np.log(observed / expected), 0.0)
        print(f"\n{sampler.__name__} {setting}: {int(observed[law == 0].sum()):,} samples "
              f"({observed[law == 0].sum() / samples:.2%}) on continuations of probability 0")
        print(f"  {'continuation':<14}{'observed':>10}{'expected':>10}{'G term':>10}")
        finite = np.where(np.isfinite(terms), terms, -np.inf)
        for cell in np.argsort(-finite)[:TOP]:
            digits = np.unravel_index(cell, (pair.vocab,) * 3)
            print(f"  {' '.join(map(str, digits)):<14}{observed[cell] / samples:>10.4f}"
                  f"{law[cell]:>10.4f}{terms[cell]:>10.1f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000)
