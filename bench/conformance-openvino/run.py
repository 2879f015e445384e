"""OpenVINO GenAI's verdicts (issue 86): the whole recorded table in one run, one family at 0.01
(each check at 0.01 / the table's size), a row printed as each check lands.

    SPECJAX_OPENVINO_PYTHON=/path/to/venv-ov/bin/python \
        python bench/conformance-openvino/run.py [SAMPLES]

The table: plain sampling (the control), a draft model and prompt lookup, k = 2, float32, no
prefix caching, at T = 1, T = 0.7 with top-p 0.9 and T = 0.8 with top-k 4 and min-p 0.05, on the
kit's pair and the wide pair; then the findings of their own on the kit's pair at T = 1: plain
sampling at the CPU plugin's default precision, and prefix caching with plain sampling and with
a draft. SAMPLES continuations of 3 tokens a check (default 20,000), seed 0. A check whose
request the engine fails is a row of its own, with the engine's error.
"""

from __future__ import annotations

import sys
import time

from specjax import testing
from specjax.testing import clients, openvino, verdict
from specjax.testing.law import PAIRS

LEVEL = 0.01


def main(samples: int) -> None:
    entries = clients.openvino_entries(samples, settings=tuple(clients.OPENVINO_SETTINGS),
                                       pairs=tuple(PAIRS), findings=True)
    print(f"OpenVINO GenAI: openvino-genai {openvino.engine_version()}; {len(entries)} checks, "
          f"each at {LEVEL} / {len(entries)}", flush=True)
    print(verdict.HEADER, flush=True)
    start = time.perf_counter()
    for entry in entries:
        began = time.perf_counter()
        try:
            [v] = testing.run([entry], level=LEVEL / len(entries), seed=0)
        except RuntimeError as e:                 # the engine failed the request: a finding
            print(f"{entry.name:<38} client  FAILED after {time.perf_counter() - began:.0f} s: "
                  f"{e}", flush=True)
            continue
        print(verdict.row(v), flush=True)
        if not v.report.lossless:                 # the cell the G-test singles out
            print(v.report, flush=True)
    print(f"\n{len(entries)} checks in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000)
