"""specjax.testing: the lossless check, for any speculative decoder (docs/conformance.md).

    from specjax import testing
    from specjax.sampling.logits import SamplingParams

    report = testing.check(my_sampler, sampling=SamplingParams(0.7, top_p=0.9))
    print(report)
    testing.assert_lossless(my_sampler)            # in a test: raises with the table

A sampler is a plain function `sampler(pair, prompt, seed, *, samples, length, sampling)` that
returns `samples` independent continuations [samples, length] of `prompt` drawn with the pair's
target and draft; `check` compares them with the target's exact law by G-tests (each position
and the whole continuation) at a stated family-wise level, and says what bias that sample size
can see. `numpy_step` and `specjax_rules` adapt a numpy decoding step and specjax's own
`generate`; `CATALOGUE` holds the field's known bugs and the exact schemes that look wrong, and
`REFERENCE` the plain NumPy reference's methods (`specjax.reference`), each expected lossless.

Layer: beside the benchmarks. It may import the API and the layers below it; only the CLI
imports it (`python -m specjax check`). scipy is needed (`pip install specjax[testing]`).
"""

from specjax.testing.adapters import numpy_step, specjax_rules
from specjax.testing.catalogue import CATALOGUE
from specjax.testing.reference_samplers import REFERENCE
from specjax.testing.verdict import Entry, Verdict, run, table
from specjax.testing.check import Report, assert_lossless, check
from specjax.testing.gtest import Test
from specjax.testing import clients, law, verdict
from specjax.testing.law import PAIRS, Lookup, Pair, pair, warp

__all__ = ["CATALOGUE", "Entry", "Lookup", "PAIRS", "Pair", "REFERENCE", "Report", "Test", "Verdict",
           "assert_lossless",
           "check", "numpy_step", "pair", "run", "specjax_rules", "table", "warp"]
