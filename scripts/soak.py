"""A long-running process: many `generate` calls with random settings on a tiny model.

    python scripts/soak.py --calls 1000 --seed 0

Each call picks a method (autoregressive, speculative, n-gram), two prompts of 3-8 tokens,
per-row or shared temperature / top-k / top-p / min-p, max_new_tokens 1-16, stop ids and seeds
at random: settings change on every call, shapes fall in a few buckets (one prompt bucket, two
buffer sizes), so a handful of programs serve all the calls. Printed as one JSON object: the decoding programs compiled (distinct specs and
shapes), the XLA compilations seen, and the process's resident memory after the first
`--settle` calls and at the end. tests/engine/test_soak.py runs it and checks both stay bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import numpy as np

from specjax.api import generate as api
from specjax.api.methods import build_shared
from specjax.sampling.params import SamplingParams
from specjax.testing.law import close_pair

METHODS = ("autoregressive", "speculative", "ngram")


def resident_mib() -> float:
    """This process's resident set size, MiB (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def random_call(rng: np.random.Generator, target, draft) -> dict:
    rows = 2

    def per_row(draw):
        return [draw() for _ in range(rows)] if rng.random() < 0.5 else draw()

    return dict(
        prompts=[rng.integers(0, 6, int(rng.integers(3, 9))).tolist() for _ in range(rows)],
        method=build_shared(METHODS[int(rng.integers(len(METHODS)))], draft=draft, k=3),
        sampling=SamplingParams(
            temperature=per_row(lambda: float(rng.choice([0.0, 0.5, 1.0, 1.5]))),
            top_k=per_row(lambda: int(rng.choice([0, 2, 4]))),
            top_p=per_row(lambda: float(rng.choice([1.0, 0.9, 0.5]))),
            min_p=per_row(lambda: float(rng.choice([0.0, 0.1])))),
        max_new_tokens=per_row(lambda: int(rng.integers(1, 17))),
        eos_ids=[int(rng.integers(0, 6))] if rng.random() < 0.5 else (),
        seed=int(rng.integers(2 ** 31)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--settle", type=int, default=100,
                        help="calls after which memory is measured the first time")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **kw: compiles.append(event)
        if event == "/jax/core/compile/backend_compile_duration" else None)
    target, draft = close_pair(vocab=6, std=0.5, noise=0.15)
    rng = np.random.default_rng(args.seed)
    start, settled, settled_compiles = time.perf_counter(), None, None
    for i in range(args.calls):
        call = random_call(rng, target, draft)
        result = api.generate(target, call.pop("prompts"), **call)
        assert all(1 <= len(t) for t in result.tokens)
        if i + 1 == args.settle:
            settled, settled_compiles = resident_mib(), len(compiles)
    print(json.dumps({"calls": args.calls, "seconds": round(time.perf_counter() - start, 1),
                      "programs": len(api._COMPILED), "xla_compiles": len(compiles),
                      "xla_compiles_after_settle": len(compiles) - (settled_compiles or 0),
                      "rss_mib_after_settle": settled, "rss_mib_end": resident_mib()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
