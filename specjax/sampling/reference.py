"""One speculative step for one row, in plain NumPy: the algorithm before the engineering.

Chen et al. 2023, Algorithm 2, with their letters (p is the draft's distribution, q the
target's; Leviathan et al. swap them) and its four Steps, named as in docs/walkthrough.md.
`draft` and `target` are any functions from a token list to the next-token distribution after
each of its positions, [T, V], like a GPT forward pass followed by a softmax. Positions count
from 0 here where the paper counts from 1: q_{n+1}, the target's distribution at the first
rejected draft, is `q[n]`.

This is what `rejection.verify` computes for a batch of rows, with the same arithmetic: on the
same uniform draws u it accepts the same drafts and draws the next token from the same
distribution (tests/test_walkthrough.py holds the two equal in float64). The production path
adds what this leaves out: batches, caches, static shapes, keys, trees and tracing.
"""

from __future__ import annotations

import numpy as np

__all__ = ["speculative_step", "verify_row"]


def speculative_step(draft, target, tokens: list[int], k: int,
                     rng: np.random.Generator) -> list[int]:
    """Draft k tokens, score them with one target call, accept a prefix, draw one more.

    Returns the 1 to k + 1 tokens the row appends.
    """
    # Step 1 (draft): x_1..x_k autoregressively, keeping each p_i the draft drew x_i from.
    drafted, p = [], []
    for _ in range(k):
        p_i = draft(tokens + drafted)[-1]                                  # [V]
        drafted.append(int(rng.choice(len(p_i), p=p_i)))
        p.append(p_i)
    # Step 2 (score): one target call on the last token and every draft gives q_1..q_{k+1}.
    q = target(tokens + drafted)[-(k + 1):]                                # [k + 1, V]
    # Steps 3 and 4 (accept or resample, bonus), on fresh uniform draws.
    n, next_dist = verify_row(np.array(p), q, drafted, rng.random(k))
    return drafted[:n] + [int(rng.choice(len(next_dist), p=next_dist))]


def verify_row(p: np.ndarray, q: np.ndarray, drafted: list[int], u: np.ndarray):
    """The accept test and what follows it, for one row.

    Args:
      p: [k, V] the draft distributions; q: [k + 1, V] the target's; drafted: the k drafted
        tokens; u: [k] uniform draws in [0, 1).
    Returns:
      n, the number of leading drafts accepted, and the distribution [V] the next token is
      drawn from: the residual at the first rejection, or the bonus q_{k+1}.
    """
    for i, x in enumerate(drafted):
        # Step 3 (accept or resample): accept x_i with probability min(1, q_i(x) / p_i(x)),
        # written without the division so that p_i(x) = 0 needs no special case.
        if not u[i] * p[i, x] < q[i, x]:
            # The first rejection ends the step: draw from normalize(max(q_i - p_i, 0)). With no
            # mass there (p_i = q_i, where a rejection has probability 0) q_i stands in.
            excess = np.maximum(q[i] - p[i], 0.0)
            mass = excess.sum()
            return i, excess / mass if mass > 0 else q[i]
    # Step 4 (bonus): every draft accepted, the next token is drawn from q one position on.
    return len(drafted), q[len(drafted)]
