"""The field's known speculative-sampling bugs, and the schemes that look wrong but are exact, as
small numpy references that `check` runs (`python -m specjax check` prints the verdicts).

Each reference is a decoding step over a batch of rows (`adapters.numpy_step`), written for
reading: `Speculative` (`testing.speculative_step`) is Chen et al. 2023's Algorithm 2 step by
step, and each bug is that step with one thing done the way a public implementation once did
it. The public issues are the sources of the ideas (cited in each entry); no code is taken from
them.

Letters as in the rest of specjax (Chen et al.): p is the draft's distribution, q the
target's. Leviathan et al. and several of the cited projects use them the other way round.

Every bug must be rejected and every exact scheme accepted; `tests/kit/test_conformance.py` holds
the catalogue to that at a family-wise level of 0.01.
"""

from __future__ import annotations

import numpy as np

from specjax.sampling.logits import SamplingParams
from specjax.testing.adapters import numpy_step
from specjax.testing.law import warp
from specjax.testing.speculative_step import Speculative, draw, normalized, with_controls
from specjax.testing.verdict import Entry

__all__ = ["CATALOGUE", "Speculative", "draw"]


# -- Bugs ---------------------------------------------------------------------------------------

class ArgmaxDraftSoftP(Speculative):
    """The draft's argmax is proposed, its softmax reported as the distribution it came from."""

    def propose(self, rng, lookup, tokens, lengths, sampling):
        p = warp(lookup.draft(tokens, lengths), sampling)
        return np.argmax(p, axis=-1), p


class ProcessedDrawnRawReported(Speculative):
    """Drafts drawn from the processed logits (temperature, top-p) and reported with the
    softmax of the raw ones."""

    def propose(self, rng, lookup, tokens, lengths, sampling):
        logits = lookup.draft(tokens, lengths)
        return draw(rng, warp(logits, sampling)), warp(logits, SamplingParams())


class Bfloat16DrawnFloat32Judged(Speculative):
    """Drafts drawn from the draft run in bfloat16, judged with its float32 distribution."""

    def propose(self, rng, lookup, tokens, lengths, sampling):
        drawn = warp(lookup.logits("draft-bfloat16", tokens, lengths), sampling)
        return draw(rng, drawn), warp(lookup.draft(tokens, lengths), sampling)


class PermutedDraftProbabilities(Speculative):
    """Drafts drawn from the draft's distribution, each reported with another token's
    probability: the draft's scores are scattered into the target's vocabulary by one ordering
    of the tokens the two share, while the drafted ids are mapped by another."""

    SHIFT = 1       # token x reported with the probability of token x + 1 (mod V)

    def propose(self, rng, lookup, tokens, lengths, sampling):
        p = warp(lookup.draft(tokens, lengths), sampling)
        return draw(rng, p), np.roll(p, -self.SHIFT, axis=-1)


class AlwaysAccept(Speculative):
    """Every draft accepted (a match count that never stops at a rejection)."""

    def accept(self, rng, drafts, p, q):
        return np.full(len(drafts), self.k)


class TargetUnprocessed(Speculative):
    """The draft sampled with the request's top-p, the target verified at temperature 1 and
    top-p 1: the output follows the unfiltered target."""

    def target(self, lookup, tokens, lengths, sampling):
        return warp(lookup.target(tokens, lengths), SamplingParams())


class SameNoiseResample(Speculative):
    """The token after a rejection drawn with the same exponential noise that drew the rejected
    draft, instead of fresh noise."""

    def __call__(self, rng, lookup, tokens, lengths, sampling):
        self._noise = rng.exponential(size=(len(lengths), self.k, lookup.vocab))
        self._i = 0
        return super().__call__(rng, lookup, tokens, lengths, sampling)

    def propose(self, rng, lookup, tokens, lengths, sampling):
        p = warp(lookup.draft(tokens, lengths), sampling)
        token = draw(rng, p, self._noise[:, self._i])
        self._i += 1
        return token, p

    def next_token(self, rng, drafts, p, q, accepted):
        rows = np.arange(len(accepted))
        rejected = accepted < self.k
        noise = np.where(rejected[:, None], self._noise[rows, np.minimum(accepted, self.k - 1)],
                         rng.exponential(size=(len(rows), q.shape[-1])))
        q_at = q[rows, accepted]
        p_at = np.where(rejected[:, None], p[rows, np.minimum(accepted, self.k - 1)], 0)
        return draw(rng, self.residual(p_at, q_at, drafts, accepted), noise)


class ResidualZeroesRejected(Speculative):
    """The residual made by zeroing the rejected token in the target's probabilities (in
    place) and renormalising, instead of max(q - p, 0)."""

    def residual(self, p_at, q_at, drafts, accepted):
        rows = np.arange(len(accepted))
        rejected = accepted < self.k
        zeroed = q_at.copy()
        zeroed[rows[rejected], drafts[rows[rejected], accepted[rejected]]] = 0
        return normalized(zeroed, q_at)


class BonusFromLastDraftPosition(Speculative):
    """After k accepts, the bonus token drawn from q_k (the last draft's position) instead of
    q_{k+1}."""

    def next_token(self, rng, drafts, p, q, accepted):
        shifted = q.copy()
        shifted[:, self.k] = q[:, self.k - 1]
        return super().next_token(rng, drafts, p, shifted, accepted)


class RejectionOneStepLate(Speculative):
    """A rejection takes effect one position late: the rejected draft is kept, and the
    correction is drawn at the position after it."""

    def accept(self, rng, drafts, p, q):
        return np.minimum(super().accept(rng, drafts, p, q) + 1, self.k)


class GreedyMatchWhenSampling(Speculative):
    """At temperature > 0, a draft accepted only when it is the target's argmax; the token after
    the first mismatch drawn from the target."""

    def accept(self, rng, drafts, p, q):
        matches = drafts == np.argmax(q[:, :-1], axis=-1)
        return np.cumprod(matches, axis=1).sum(axis=1)

    def residual(self, p_at, q_at, drafts, accepted):
        return q_at


class DraftOverTargetSampleRatio(Speculative):
    """The target draws its own token x_T at each draft position, and the draft x_D is kept when
    u <= p(x_D) / q(x_T): the draft's probability of its draft over the target's probability of
    its own sample, instead of u < q(x_D) / p(x_D)."""

    def accept(self, rng, drafts, p, q):
        own = np.stack([draw(rng, q[:, i]) for i in range(self.k)], axis=1)        # [N, k]
        p_x = np.take_along_axis(p, drafts[..., None], axis=-1)[..., 0]     # [N, k]
        q_own = np.take_along_axis(q[:, :-1], own[..., None], axis=-1)[..., 0]
        passed = rng.random(drafts.shape) * q_own <= p_x      # q(x_T) > 0: x_T was drawn from q
        return np.cumprod(passed, axis=1).sum(axis=1)


class UniformOf101Values(Speculative):
    """The uniform of the accept test takes 101 values, randint(0, 100) / 100, and a draft is
    kept when u <= q(x) / p(x): a ratio between two hundredths is rounded up to the next, and
    u = 0 keeps a draft the target gives probability 0 once in 101."""

    def accept(self, rng, drafts, p, q):
        p_x = np.take_along_axis(p, drafts[..., None], axis=-1)[..., 0]     # [N, k]
        q_x = np.take_along_axis(q[:, :-1], drafts[..., None], axis=-1)[..., 0]
        u = rng.integers(0, 101, size=drafts.shape) / 100
        return np.cumprod(u * p_x <= q_x, axis=1).sum(axis=1)


def inverse_cdf(probs: np.ndarray, u: np.ndarray) -> np.ndarray:
    """One token per row of probs [N, V] from the uniform u [N] in [0, 1): the token whose
    interval of the cumulative distribution holds u (never one of probability 0)."""
    cdf = np.cumsum(probs, axis=-1)
    return np.minimum((cdf / cdf[:, -1:] <= u[:, None]).sum(axis=-1), probs.shape[-1] - 1)


class SharedSeedFirstStep(Speculative):
    """In a request's first step, the draft's sampler and the target's are seeded alike: the
    i-th draft x_i and the target's own sample y_i at that position come from one uniform, each
    through its own cumulative distribution. x_i is kept only when it equals y_i; at the first
    mismatch the position takes a token drawn from the target's law at the next position (after
    x_i), as the engine's loop fills a rejected position, and the step ends. Later steps are
    Algorithm 2. (Had the mismatch emitted y_i, the step would be exact whatever the coupling:
    `match-target-sample`.)"""

    def __call__(self, rng, lookup, tokens, lengths, sampling):
        self._first = lengths == 0                  # nothing generated yet: the first step
        self._u = rng.random((len(lengths), self.k))
        self._i = 0
        return super().__call__(rng, lookup, tokens, lengths, sampling)

    def propose(self, rng, lookup, tokens, lengths, sampling):
        p = warp(lookup.draft(tokens, lengths), sampling)
        coupled = inverse_cdf(p, self._u[:, self._i])
        self._i += 1
        return np.where(self._first, coupled, draw(rng, p)), p

    def accept(self, rng, drafts, p, q):
        own = np.stack([inverse_cdf(q[:, i], self._u[:, i]) for i in range(self.k)], axis=1)
        matched = np.cumprod(drafts == own, axis=1).sum(axis=1)
        return np.where(self._first, matched, super().accept(rng, drafts, p, q))

    def next_token(self, rng, drafts, p, q, accepted):
        rows = np.arange(len(accepted))
        late = draw(rng, q[rows, np.minimum(accepted + 1, self.k)])   # the next position's law
        return np.where(self._first, late, super().next_token(rng, drafts, p, q, accepted))


class ControlsMissingAtDrafts(Speculative):
    """The request's temperature and top-p reach the draft and the bonus position's sampler but
    not the verifier at the drafts' positions: there the drafts are judged, and the token after a
    rejection drawn, under the target's unprocessed law (T = 1, top-p 1), as when those controls
    are read from a buffer that was never written."""

    def __call__(self, rng, lookup, tokens, lengths, sampling):
        self._position = 0                          # `target` is asked position by position
        return super().__call__(rng, lookup, tokens, lengths, sampling)

    def target(self, lookup, tokens, lengths, sampling):
        at_draft = self._position < self.k
        self._position += 1
        return super().target(lookup, tokens, lengths, SamplingParams() if at_draft else sampling)


# -- Exact schemes that look suspicious ----------------------------------------------------------

class TopKTreeOneHot:
    """A token tree of deterministic candidates: at each depth the draft's `width` most likely
    tokens, each treated as drawn from a one-hot distribution. The target walks them in order:
    candidate c is accepted with probability q(c) (u * 1 < q(c)); on a rejection the target's
    distribution becomes the residual max(q - onehot(c), 0), which is q with c removed and
    renormalised; when every candidate is rejected the next token is drawn from what is left.
    After an accept the walk goes one depth down; after `depth` accepts the bonus comes from
    the target. Exact (SpecInfer's multi-step rule with one-hot drafts)."""

    def __init__(self, width: int = 2, depth: int = 2):
        self.width, self.depth = width, depth

    def __call__(self, rng, lookup, tokens, lengths, sampling):
        tokens, lengths = tokens.copy(), lengths.copy()
        rows = np.arange(len(lengths))
        walking = np.ones(len(rows), bool)
        for _ in range(self.depth):
            candidates = np.argsort(-lookup.draft(tokens, lengths), axis=-1)[:, :self.width]
            q = warp(lookup.target(tokens, lengths), sampling)
            moved = np.zeros(len(rows), bool)
            for c in candidates.T:
                q_c = q[rows, c]
                accept = walking & ~moved & (rng.random(len(rows)) < q_c)
                tried = walking & ~moved & ~accept
                removed = q.copy()
                removed[rows, c] = 0
                q = np.where(tried[:, None], normalized(removed, q), q)
                tokens[rows[accept], lengths[accept]] = c[accept]
                moved |= accept
            stopped = walking & ~moved
            tokens[rows[stopped], lengths[stopped]] = draw(rng, q[stopped])
            lengths = lengths + walking                  # an accepted candidate or the residual
            walking &= moved
        # Every depth accepted: the bonus token from the target after the whole path.
        bonus = rows[walking]
        tokens[bonus, lengths[bonus]] = draw(rng, warp(lookup.target(tokens[bonus],
                                                                     lengths[bonus]), sampling))
        return tokens, lengths + walking


class MatchTargetSample(Speculative):
    """Drafts checked against the target's own samples: at each position the target draws a
    token given the accepted prefix; the draft is kept while it equals that sample, and the
    first differing sample is emitted. Exact whatever the draft's distribution: every emitted
    token is the target's own draw."""

    def accept(self, rng, drafts, p, q):
        self._samples = np.stack([draw(rng, q[:, i]) for i in range(q.shape[1])], axis=1)
        return np.cumprod(drafts == self._samples[:, :-1], axis=1).sum(axis=1)

    def next_token(self, rng, drafts, p, q, accepted):
        return self._samples[np.arange(len(accepted)), accepted]


class PenaltiesCountCommittedOnly(Speculative):
    """Penalties under speculation counted over the tokens committed before the step only: the
    target's distribution at draft position i ignores drafts 1..i-1 (each is scored as if it
    had not been generated yet)."""

    def __call__(self, rng, lookup, tokens, lengths, sampling):
        self._committed = lengths
        return super().__call__(rng, lookup, tokens, lengths, sampling)

    def target(self, lookup, tokens, lengths, sampling):
        logits = with_controls(lookup.target(tokens, lengths), lookup, tokens, lengths,
                               self.controls, counted=self._committed)
        return warp(logits, sampling)


def _autoregressive(rng, lookup, tokens, lengths, sampling):
    """One token per row from the target: the reference every scheme must equal."""
    tokens = tokens.copy()
    q = warp(lookup.target(tokens, lengths), sampling)
    tokens[np.arange(len(lengths)), lengths] = draw(rng, q)
    return tokens, lengths + 1


# -- The catalogue ------------------------------------------------------------------------------

T1, T07_TOP_P = SamplingParams(1.0), SamplingParams(0.7, top_p=0.9)
# Penalties strong enough to move the law: a drafted token repeated in the block is what a
# bug that forgets the drafts gets wrong.
PENALTIES = dict(repetition_penalty=1.5, presence_penalty=1.0, frequency_penalty=0.8,
                 logit_bias={3: 0.7})


def _reference(name: str, lossless: bool, source: str, step, **setting) -> Entry:
    """A catalogue entry run by `numpy_step`; its idea is the step's docstring."""
    return Entry(name, lossless, source, " ".join((step.__doc__ or "").split()),
                 lambda: numpy_step(step, name=name), **setting)


CATALOGUE = (
    # Bugs: each must be rejected.
    _reference("argmax-draft-soft-p", False, "jaymody/speculative-sampling #3, #4",
               ArgmaxDraftSoftP()),
    _reference("processed-drawn-raw-reported", False, "transformers #47932",
               ProcessedDrawnRawReported(), sampling=T07_TOP_P),
    # The bfloat16 draft's logits differ from float32's by up to 0.3 here (a 2-layer model),
    # a law off by KL ~ 2.5e-4: 10^5 samples see it about half the time, 5 x 10^5 always.
    _reference("bfloat16-drawn-float32-judged", False, "DeepSpec #31",
               Bfloat16DrawnFloat32Judged(), samples=500_000),
    _reference("always-accept", False, "transformers #28508", AlwaysAccept()),
    _reference("target-unprocessed", False, "vLLM #10198", TargetUnprocessed(),
               sampling=SamplingParams(1.0, top_p=0.8)),
    _reference("same-noise-resample", False, "vLLM #54282", SameNoiseResample()),
    _reference("residual-zeroes-rejected", False, "vllm-ascend #2881",
               ResidualZeroesRejected()),
    _reference("bonus-from-last-draft-position", False, "EAGLE PR #47",
               BonusFromLastDraftPosition()),
    _reference("rejection-one-step-late", False, "openvino.genai #4190",
               RejectionOneStepLate()),
    _reference("greedy-match-when-sampling", False, "mlxcel #902", GreedyMatchWhenSampling()),
    _reference("penalties-count-committed-only", False, "SGLang #33643, vLLM #18902",
               PenaltiesCountCommittedOnly(PENALTIES), controls=PENALTIES),
    # Found by this kit in transformers 5.24's TLI (drafting across tokenizers): with the draft's
    # head pruned to the shared tokens, `AssistantToTargetTranslator.get_target_logits` files
    # the pruned scores in assistant-id order and `get_target_ids` maps the drafted ids in the
    # order of the assistant tokenizer's `get_vocab()` (docs/conformance.md).
    _reference("permuted-draft-probabilities", False, "transformers 5.24 TLI (found by this kit)",
               PermutedDraftProbabilities()),
    # Read in openvino.genai 2026.4.1's `Sampler::validate_candidate` (src/cpp/src/sampling/
    # sampler.cpp), one defect an entry: the ratio p(x_D) / q(x_T), and the uniform of 101
    # values. At T = 1 the second moves the law by a KL of 1.7e-4, which 10^5 samples miss and
    # 5 x 10^5 see; at top-p its u = 0 keeps drafts of target probability 0, seen at 10^5
    # (bench/conformance/catalogue_bias.py).
    _reference("draft-over-target-sample-ratio", False, "openvino.genai 2026.4 validate_candidate",
               DraftOverTargetSampleRatio()),
    _reference("uniform-of-101-values", False, "openvino.genai 2026.4 validate_candidate",
               UniformOf101Values(), sampling=T07_TOP_P),
    # The first step of the same verifier: the draft's and the target's samplers both seeded
    # with the request's rng_seed, so that their first draws share a uniform, and a draft kept
    # only when it equals the target's sample; the engine's first token matches this reading
    # (bench/conformance-openvino/model.txt). At T = 1 the whole continuation is off by a KL of
    # 0.30 (catalogue_bias.py), seen from about 190 samples; its first token alone by 0.019
    # (tests/kit/test_conformance.py), from about 1,000; at 10^5 each of its four tests rejects.
    _reference("shared-seed-first-step", False, "openvino.genai 2026.4 validate_candidate",
               SharedSeedFirstStep()),
    # vLLM 0.32's CPU fallback `_expand_kernel_impl` fills a copy of the expanded temperature
    # and top-p, and the rejection sampler reads the uninitialised original (vLLM #55005).
    _reference("controls-missing-at-drafts", False, "vLLM #55005 (CPU)",
               ControlsMissingAtDrafts(), sampling=T07_TOP_P),
    # Exact schemes, some of which look wrong: each must pass.
    _reference("autoregressive", True, "the definition", _autoregressive),
    _reference("speculative", True, "Chen et al. 2023, Algorithm 2", Speculative()),
    _reference("speculative-t0.7-top-p", True, "Chen et al. 2023, Algorithm 2", Speculative(),
               sampling=T07_TOP_P),
    _reference("speculative-penalties", True, "drafts counted as generated (issue 64)",
               Speculative(PENALTIES), controls=PENALTIES),
    _reference("top-k-tree-one-hot", True, "SpecInfer (Miao et al. 2024), one-hot drafts",
               TopKTreeOneHot()),
    _reference("match-target-sample", True, "disputed in mlx-swift-lm #459",
               MatchTargetSample()),
)
