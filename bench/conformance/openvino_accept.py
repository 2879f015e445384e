"""A minimal reproduction of why OpenVINO GenAI's speculative sampling is not lossless (issue 86;
docs/conformance.md, "A real client: OpenVINO GenAI"): its verification, as read in
openvino.genai 2026.4's `Sampler::validate_candidate` and the loop that calls it
(src/cpp/src/sampling/sampler.cpp), on one draft position with fixed distributions.

    python bench/conformance/openvino_accept.py          # seconds

p is the draft's law at the position, q the target's, q_next[x] the target's law at the next
position once x is in the context. One draft x ~ p is verified (k = 1); the token this step
emits at the position is:
  - Algorithm 2 (Chen et al. 2023): x with probability min(1, q(x) / p(x)), else a draw from the
    residual max(q - p, 0), normalised. Its law is q.
  - OpenVINO GenAI: the target draws its own token y ~ q, and x is kept when r <= p(x) / q(y),
    with r an integer in [0, 100] divided by 100; on a rejection the loop moves on to the next
    position's logits (those after x) and the token drawn there, from q_next[x], takes the
    position (`get_p_prime` removes x, and only rescales a reported log-probability).
Each law is enumerated exactly and also drawn 10^6 times with numpy, the rule written out
step by step; then the same with one defect at a time fixed, to show what each costs.
"""

from __future__ import annotations

import numpy as np

P = np.array([0.60, 0.25, 0.10, 0.05])                  # the draft's law at the position
Q = np.array([0.30, 0.30, 0.30, 0.10])                  # the target's
Q_NEXT = np.array([[0.10, 0.10, 0.10, 0.70],            # the target's at the next position,
                   [0.70, 0.10, 0.10, 0.10],            # one row per draft x in the context
                   [0.25, 0.25, 0.25, 0.25],
                   [0.10, 0.70, 0.10, 0.10]])
R = np.arange(101) / 100                                # OpenVINO's r: 101 values
DRAWS = 1_000_000


def accept_openvino(x: int, ratio: str, uniform: str) -> float:
    """P(keep draft x): the ratio p(x) / q(y) with y ~ q (OpenVINO) or q(x) / p(x) (Algorithm 2),
    against r of 101 values (OpenVINO) or u ~ U[0, 1) (Algorithm 2)."""
    ratios = P[x] / Q if ratio == "openvino" else np.array([Q[x] / P[x]])
    weights = Q if ratio == "openvino" else np.array([1.0])
    if uniform == "openvino":
        keep = (R[None, :] <= ratios[:, None]).mean(axis=1)
    else:
        keep = np.minimum(1.0, ratios)
    return float(weights @ keep)


def law(ratio: str, uniform: str, replacement: str) -> np.ndarray:
    """The exact law of the emitted token, each of the three parts OpenVINO's or Algorithm 2's."""
    residual = np.maximum(Q - P, 0) / np.maximum(Q - P, 0).sum()
    out = np.zeros_like(Q)
    for x in range(len(P)):
        a = accept_openvino(x, ratio, uniform)
        out[x] += P[x] * a
        out += P[x] * (1 - a) * (Q_NEXT[x] if replacement == "openvino" else residual)
    return out


def simulate(rng: np.random.Generator) -> np.ndarray:
    """OpenVINO's rule drawn `DRAWS` times, written out as the engine runs it."""
    x = rng.choice(len(P), size=DRAWS, p=P)             # the draft's token
    y = rng.choice(len(Q), size=DRAWS, p=Q)             # the target's own sample
    r = rng.integers(0, 101, size=DRAWS) / 100          # uniform_int_distribution(0, 100) / 100
    kept = r <= P[x] / Q[y]
    late = (rng.random(DRAWS)[:, None] > np.cumsum(Q_NEXT[x], axis=1)).sum(axis=1)
    return np.bincount(np.where(kept, x, late), minlength=len(Q)) / DRAWS


def main() -> None:
    print(f"p (draft)  {P}\nq (target) {Q}\n")
    print(f"{'draft x':<9}{'p(x)':>6}{'q(x)':>6}{'keep: Algorithm 2':>19}{'OpenVINO':>10}")
    for x in range(len(P)):
        print(f"{x:<9}{P[x]:>6.2f}{Q[x]:>6.2f}{accept_openvino(x, 'exact', 'exact'):>19.4f}"
              f"{accept_openvino(x, 'openvino', 'openvino'):>10.4f}")
    print(f"\n{'rule (ratio, r, replacement)':<44}{'law of the emitted token':>34}{'TV from q':>11}")
    cases = [("Algorithm 2", "exact", "exact", "exact"),
             ("OpenVINO as shipped", "openvino", "openvino", "openvino"),
             ("OpenVINO, ratio fixed", "exact", "openvino", "openvino"),
             ("OpenVINO, ratio and replacement fixed", "exact", "openvino", "exact"),
             ("OpenVINO, all three fixed", "exact", "exact", "exact")]
    for name, ratio, uniform, replacement in cases:
        got = law(ratio, uniform, replacement)
        print(f"{name:<44}{np.array2string(got, precision=4):>34}"
              f"{0.5 * np.abs(got - Q).sum():>11.4f}")
    drawn = simulate(np.random.default_rng(0))
    exact = law("openvino", "openvino", "openvino")
    print(f"\nOpenVINO as shipped, {DRAWS:,} draws (seed 0): {np.array2string(drawn, precision=4)}"
          f"; largest gap from its exact law {np.abs(drawn - exact).max():.4f} "
          f"(sampling error ~{np.sqrt(exact.max() / DRAWS):.4f})")


if __name__ == "__main__":
    main()
