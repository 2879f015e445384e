"""Chen et al. 2023's Algorithm 2 (speculative sampling) as a numpy decoding step over a batch of
rows, written for reading: the exact scheme that each of the catalogue's bugs
(`testing.catalogue`) edits in one method, and the pieces they share.

Letters as in the rest of specjax (Chen et al.): p is the draft's distribution, q the target's.
"""

from __future__ import annotations

import numpy as np

from specjax.testing.law import controlled, warp

__all__ = ["Speculative", "draw", "normalized", "with_controls"]


def draw(rng: np.random.Generator, probs: np.ndarray, noise: np.ndarray | None = None):
    """One token per row from probs [N, V] by the exponential race: argmax p(x) / E(x) with
    E ~ Exp(1) i.i.d., which picks x with probability p(x), and never a token of probability 0.
    `noise` [N, V] reuses given variates (the shared-noise bug needs them)."""
    noise = rng.exponential(size=probs.shape) if noise is None else noise
    return np.argmax(probs / noise, axis=-1)


def with_controls(logits, lookup, tokens, lengths, controls: dict, counted=None):
    """The target's logits [N, V] after each row's output so far (`tokens[:, :counted]`, the
    whole context `lengths` by default) under `controls` (`law.controlled`), the pair's prompt
    before it."""
    counted = lengths if counted is None else counted
    out = np.empty_like(logits)
    for m in np.unique(counted):
        rows = np.flatnonzero(counted == m)
        out[rows] = controlled(logits[rows], lookup.pair.prompt, tokens[rows, :m], **controls)
    return out


def normalized(weights: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """Rows of `weights` scaled to sum to 1; a row of zeros takes `fallback`'s row."""
    total = weights.sum(axis=-1, keepdims=True)
    return np.where(total > 0, weights / np.where(total > 0, total, 1), fallback)


class Speculative:
    """One speculative step for every row (Chen et al. 2023, Algorithm 2): draft k tokens, score
    them with one target call, accept each with probability min(1, q(x) / p(x)) up to the first
    rejection, then draw one more token, from the residual max(q - p, 0) at the rejection or
    from the target after the last draft. Subclasses replace one method with a bug."""

    k = 2

    def __init__(self, controls: dict | None = None):
        self.controls = controls          # penalties and bias on the target (`law.controlled`)

    def __call__(self, rng, lookup, tokens, lengths, sampling):
        rows, k = np.arange(len(lengths)), self.k
        tokens = tokens.copy()
        # Step 1 (draft): k tokens, each from p_i, the draft after the tokens before it.
        p = np.empty((len(rows), k, lookup.vocab))                          # [N, k, V]
        for i in range(k):
            tokens[rows, lengths + i], p[:, i] = self.propose(rng, lookup, tokens, lengths + i,
                                                              sampling)
        drafts = tokens[rows[:, None], lengths[:, None] + np.arange(k)]     # [N, k]
        # Step 2 (score): one target call scores every prefix: q_1 .. q_{k+1}.
        q = np.stack([self.target(lookup, tokens, lengths + i, sampling) for i in range(k + 1)],
                     axis=1)                                                # [N, k+1, V]
        # Step 3 (accept or resample): accept the leading drafts that pass u * p(x) < q(x),
        accepted = self.accept(rng, drafts, p, q)                           # [N] in 0..k
        # then the token after them: the residual at a rejection, or Step 4 (bonus) after k.
        tokens[rows, lengths + accepted] = self.next_token(rng, drafts, p, q, accepted)
        return tokens, lengths + accepted + 1

    def propose(self, rng, lookup, tokens, lengths, sampling):
        """A draft token per row and the distribution it was drawn from."""
        p = warp(lookup.draft(tokens, lengths), sampling)
        return draw(rng, p), p

    def target(self, lookup, tokens, lengths, sampling):
        logits = lookup.target(tokens, lengths)
        if self.controls:
            logits = with_controls(logits, lookup, tokens, lengths, self.controls)
        return warp(logits, sampling)

    def accept(self, rng, drafts, p, q):
        p_x = np.take_along_axis(p, drafts[..., None], axis=-1)[..., 0]     # [N, k]
        q_x = np.take_along_axis(q[:, :-1], drafts[..., None], axis=-1)[..., 0]
        passed = rng.random(drafts.shape) * p_x < q_x
        return np.cumprod(passed, axis=1).sum(axis=1)                       # leading passes

    def next_token(self, rng, drafts, p, q, accepted):
        rows = np.arange(len(accepted))
        q_at = q[rows, accepted]
        # After k accepts p is "0" there, so the residual is q_{k+1} itself: the bonus token.
        p_at = np.where((accepted < self.k)[:, None], p[rows, np.minimum(accepted, self.k - 1)], 0)
        return draw(rng, self.residual(p_at, q_at, drafts, accepted))

    def residual(self, p_at, q_at, drafts, accepted):
        return normalized(np.maximum(q_at - p_at, 0), q_at)
