"""A method added from outside specjax/: a decoding module and a class, both in this file alone.

"Repeat" drafts the row's last token again, k times, as a chain that the standard rejection step
verifies (a one-hot draft, like n-gram lookup's). Nothing in specjax/ names it: `generate`,
`explain` and the lossless kit run it from its object, as docs/layout.md's worked example says
(the files a new method touches: its decoding module and its class, here this one file).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from specjax import testing
from specjax.api.methods import CLASSES, Bound, Method
from specjax.decoding.config import Drafting
from specjax.decoding.prefill import prefill
from specjax.decoding.speculative import score_and_verify
from specjax.decoding.state import DecodeState, commit, last_tokens, step_keys
from specjax.decoding import trace
from specjax.sampling.params import check_int
from specjax.sampling.rules import Rules
from specjax.testing.check import LEVEL
from tests.exactness.test_distribution import _broken_verify

# -- Its decoding module: the static spec, init, step and layout ----------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class RepeatSpec(Drafting):
    """A chain of k copies of the last token (`Drafting.k`); its module is this file, whose
    `init`, `step` and `layout` the loop runs."""
    name: ClassVar[str] = "repeat"


def init(spec, weights, prompts, prompt_length):
    """Prefill: the target reads the prompts; the method carries nothing of its own."""
    return prefill(weights.target, spec.target_config, prompts, prompt_length,
                   spec.buffer_length, shards=spec.data_shards).cache, None


def layout(spec, rows, cache) -> None:
    return None


def step(spec, weights, state: DecodeState) -> DecodeState:
    """Draft the last token k times (p one-hot), then score, verify and commit as speculative
    sampling does."""
    k = spec.method.k
    last, _ = last_tokens(state, 1)                                          # [B, 1]
    draft_tokens = jnp.repeat(last, k, axis=1)                               # [B, K]
    draft_probs = jax.nn.one_hot(draft_tokens, spec.vocab_size)             # [B, K, V]
    verified = score_and_verify(spec, weights, state, draft_tokens, draft_probs,
                                step_keys(state))
    drafted = jnp.full_like(state.length, k)
    state = trace.record(spec, state, draft_tokens, drafted, verified)
    return commit(spec, state, verified.new, verified.n_accepted, verified.cache,
                  drafted=drafted, nan=verified.nan, scores=verified.scores)


# -- Its class ------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Repeat(Method):
    """Drafts the last token again, k times a step."""
    k: int = 2
    spec: ClassVar = RepeatSpec
    chain: ClassVar = True

    def __post_init__(self):
        check_int("k", self.k, 1)

    def bind(self, target, greedy, mesh) -> Bound:
        return Bound(RepeatSpec(k=self.k), room=self.k)


# -- It runs through generate, explain and the kit ------------------------------------------------

PROMPTS = [[1, 2, 3, 2], [4, 4], [5, 0, 3]]


def test_the_toy_method_is_declared_here_alone():
    assert Repeat not in CLASSES and "repeat" not in {cls.name for cls in CLASSES}
    assert (Repeat.name, Repeat.drafts, Repeat.options(), Repeat.loads) == (
        "repeat", True, ("k",), None)
    assert RepeatSpec.module is sys.modules[__name__]


def test_greedy_output_equals_autoregressive():
    target = testing.pair("close").target
    greedy = specjax.SamplingParams(temperature=0.0)
    plain = specjax.generate(target, PROMPTS, "autoregressive", greedy, max_new_tokens=12,
                             eos_ids=())
    for k in (1, 3):
        repeated = specjax.generate(target, PROMPTS, Repeat(k=k), greedy, max_new_tokens=12,
                                    eos_ids=())
        assert repeated.tokens == plain.tokens, k
        assert repeated.stats.method == "repeat"
        assert repeated.stats.tokens_per_target_call >= 1.0


def test_explain_shows_the_repeated_drafts_and_the_tokens_generate_gives():
    target = testing.pair("close").target
    sampling = specjax.SamplingParams(temperature=1.0)
    steps = specjax.explain(target, PROMPTS[0], Repeat(k=2), sampling, steps=4, seed=3,
                            max_new_tokens=12)
    assert len(steps) == 4
    last = PROMPTS[0][-1]
    for s in steps:
        assert [d.token for d in s.drafts][:1] == [last]          # the row's last token again
        assert all(d.token == last and d.p == 1.0 for d in s.drafts)
        last = s.new_tokens[-1]
    made = [t for s in steps for t in s.new_tokens]
    out = specjax.generate(target, [PROMPTS[0]], Repeat(k=2), sampling, max_new_tokens=12,
                           seed=3)
    assert out.tokens[0][:len(made)] == made


def _sampler(rules=None):
    def sampler(pair, prompt, seed, *, samples, length, sampling, controls=None):
        prompts = np.tile(np.asarray(prompt, np.int32), (samples, 1))
        out = specjax.generate(pair.target, prompts, Repeat(k=2), sampling,
                               max_new_tokens=length, seed=seed, eos_ids=(), rules=rules)
        return np.array(out.tokens, np.int32)
    return sampler


def test_the_kit_finds_it_lossless_and_a_broken_accept_step_not():
    # The kit's own level (family-wise 0.01) and test, on its "close" pair at T = 1, 30,000
    # continuations of 3 tokens, seed 0. Negative control: the same method with every draft
    # accepted (the accept test skipped), which the same check must catch.
    good = testing.check(_sampler(), samples=30_000, seed=0, level=LEVEL)
    bad = testing.check(_sampler(Rules(verify=_broken_verify(accept_rule="always"))),
                        samples=30_000, seed=0, level=LEVEL)
    assert good.lossless, str(good)
    assert not bad.lossless, str(bad)
