"""The power of the end-to-end G-test (tests/exactness/test_distribution.py) against a subtle bug.

    python scripts/distribution_power.py --eps 0.03 --seeds 20 --rows 100000,200000 \
        --out bench/distribution-power

The negative controls of the test suite are bugs with large effects: each is rejected at
p < 1e-10 or so, whatever the seed. This measures what the test's sample size buys against a
small one: speculative sampling (K = 2, temperature 1, the suite's tiny pair and prompt) that
verifies against the target's probabilities scaled by 1 + eps, as a mis-set tolerance or a
stale normaliser would: drafts are accepted when u * p(x) < (1 + eps) * q(x), slightly too
often, and the residual is normalize(max((1 + eps) q - p, 0)). For each sample size it draws the case with
--seeds different seeds and reports the power (the share of seeds whose G-test p-value is below
the suite's per-case level) and the median p-value. Writes power.json and power.md to --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

from specjax.api.generate import generate
from specjax.testing.gtest import p_value
from specjax.testing.law import close_pair, exact_law
from specjax.sampling import rejection
from specjax.sampling.logits import SamplingParams
from specjax.sampling.rules import Rules
import specjax

# The case of tests/exactness/test_distribution.py that this measures (keep them equal): its tiny pair,
# prompt, continuation length and per-case level (family alpha 0.01 over its 22 positive cases).
V, L, PROMPT, K = 6, 3, (1, 4, 2, 1, 4), 2
ALPHA = 0.01 / 22


def draw_p_value(models, seed: int, rows: int, eps: float) -> float:
    """The G-test p-value of `rows` speculative samples (K = 2, temperature 1) verified
    against (1 + eps) q."""
    target, draft = models
    prompts = np.tile(np.asarray(PROMPT, np.int32), (rows, 1))
    result = generate(target, prompts, method=specjax.Speculative(draft=draft, k=K),
                      sampling=specjax.SamplingParams(temperature=1.0), max_new_tokens=L, seed=seed,
                      eos_ids=(), rules=Rules(verify=generous_verify(eps)))
    law = exact_law(target, PROMPT, SamplingParams(1.0), L)
    return p_value(np.array(result.tokens, np.int32), law, V)


def generous_verify(eps: float):
    """`rejection.verify` against (1 + eps) q (the module docstring)."""
    def verify_fn(draft_tokens, draft_probs, target_probs, keys, num_drafted=None):
        return rejection.verify(draft_tokens, draft_probs, target_probs * (1 + eps), keys,
                                num_drafted=num_drafted)
    return verify_fn


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eps", type=float, default=0.03)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--rows", default="100000,200000", help="sample sizes, comma-separated")
    parser.add_argument("--out", default="bench/distribution-power")
    args = parser.parse_args()
    models = close_pair(vocab=V, std=0.5, noise=0.15)
    results = {"created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "eps": args.eps, "alpha": ALPHA, "seeds": args.seeds,
               "jax_version": jax.__version__, "sizes": []}
    for rows in (int(r) for r in args.rows.split(",")):
        p_values, seconds = [], []
        for seed in range(args.seeds):
            start = time.perf_counter()
            p = draw_p_value(models, 1000 + seed, rows, args.eps)
            seconds.append(time.perf_counter() - start)
            p_values.append(p)
        power = sum(p < ALPHA for p in p_values) / len(p_values)
        results["sizes"].append(dict(rows=rows, power=power, median_p=statistics.median(p_values),
                                     p_values=p_values, median_seconds=statistics.median(seconds)))
        print(f"N = {rows}: power {power:.0%} at alpha {ALPHA:.2g}, median p "
              f"{statistics.median(p_values):.3g}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "power.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [f"# G-test power: verified against (1 + {args.eps}) q, speculative K=2, T=1", "",
             f"{results['created']} · {args.seeds} seeds per size · per-case level "
             f"{ALPHA:.3g} (the suite's family alpha 0.01, Bonferroni)", "",
             "| samples | power | median p |", "|--:|--:|--:|"]
    lines += [f"| {s['rows']:,} | {s['power']:.0%} | {s['median_p']:.3g} |"
              for s in results["sizes"]]
    (out / "power.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
