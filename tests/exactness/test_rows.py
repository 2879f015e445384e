"""Sampling parameters, lengths and stop ids as per-row data (`RowSettings`).

What must hold: each row is sampled exactly under its own temperature / top-k / top-p / min-p
(the law of `probs_from_logits`, end to end by a G-test per row group, with negative controls);
greedy rows of a mixed batch equal autoregressive greedy decoding token for token; min-p is the
documented step and agrees with transformers' warper; changing any of these settings, the seed,
max_new_tokens or the prompt length within its bucket reuses the compiled program; and the
per-row metrics add up.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

import specjax
from specjax.api.generate import GenerationError, generate
from specjax.heads.medusa import HeadsConfig, init_heads
from specjax.sampling.logits import Sampling, SamplingParams, probs_from_logits, sample_rows
from specjax.sampling.rules import Rules
from specjax.testing import gtest
from specjax.testing.law import close_pair, exact_law

V, L = 6, 3
PROMPT = (1, 4, 2, 1, 4)
NGRAM_PROMPT = (2, 5, 3, 2, 5, 3, 2, 5)


@pytest.fixture(scope="module")
def models():
    return close_pair(vocab=V, std=0.5, noise=0.15)


@pytest.fixture(scope="module")
def heads(models):
    target, _ = models
    config = HeadsConfig(num_heads=3, num_blocks=1, hidden_size=target.config.d_model,
                                 vocab_size=V, subset_size=5)
    return init_heads(config, target, token_ids=[2, 0, 1, 3, 5], seed=3, std=0.5)


# -- min-p: the step, its place in the order, and transformers' warper ---------------------------

def reference_probs(logits: np.ndarray, t: float, k: int, p: float, m: float) -> np.ndarray:
    """The module docstring of `specjax.sampling.logits`, step by step in float64 numpy."""
    x = np.asarray(logits, np.float64)
    if t == 0:
        return np.eye(len(x))[np.argmax(x)]
    scaled = (x - x.max()) / t
    order = np.argsort(-x, kind="stable")
    keep = np.zeros(len(x), bool)
    keep[order[:k if 0 < k < len(x) else len(x)]] = True                  # top-k
    probs = np.where(keep, np.exp(scaled), 0.0)
    probs /= probs.sum()
    if p < 1:                                                              # top-p
        cum_before = np.cumsum(probs[order]) - probs[order]
        nucleus = np.zeros(len(x), bool)
        nucleus[order[(cum_before < p) | (np.arange(len(x)) == 0)]] = True
        keep &= nucleus
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum()
    keep &= probs >= m * probs.max()                                       # min-p
    probs = np.where(keep, np.exp(scaled), 0.0)
    return probs / probs.sum()


@settings(max_examples=60, deadline=None, derandomize=True)
@given(logits=st.lists(st.floats(-4, 4, width=32), min_size=2, max_size=8),
       t=st.sampled_from([0.0, 0.5, 1.0, 2.0]), k=st.integers(0, 8),
       p=st.sampled_from([1.0, 0.95, 0.7, 0.3]), m=st.sampled_from([0.0, 0.05, 0.3, 0.9, 1.0]))
def test_min_p_exact_law_on_small_vocabularies(logits, t, k, p, m):
    x = np.asarray(logits, np.float32)
    if len(np.unique(x)) < len(x):
        x = x + np.arange(len(x), dtype=np.float32) * 1e-3     # no ties: the law is then unique
    got = np.asarray(probs_from_logits(x, SamplingParams(t, k, p, m)), np.float64)
    np.testing.assert_allclose(got, reference_probs(x, t, k, p, m), atol=1e-5)


def test_min_p_agrees_with_transformers_warpers():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 2, (16, 64)).astype(np.float32)
    for t, k, p, m in [(1.0, 0, 1.0, 0.1), (0.7, 20, 0.9, 0.05), (1.3, 0, 0.8, 0.3)]:
        scores = torch.from_numpy(logits.copy())
        for warper in (transformers.TemperatureLogitsWarper(t),
                       *([transformers.TopKLogitsWarper(k)] if k else []),
                       *([transformers.TopPLogitsWarper(p)] if p < 1 else []),
                       transformers.MinPLogitsWarper(m)):
            scores = warper(None, scores)
        expected = torch.softmax(scores, dim=-1).numpy()
        got = np.asarray(probs_from_logits(logits, SamplingParams(t, k, p, m)))
        np.testing.assert_allclose(got, expected, atol=1e-6, err_msg=str((t, k, p, m)))


def test_min_p_comes_after_top_p():
    # probabilities 0.5, 0.3, 0.2. top-p 0.6 keeps {0.5, 0.3} -> {0.625, 0.375}; min-p 0.65 of
    # the largest then drops 0.375 (< 0.406): one token left. Min-p first would keep 0.5 and 0.3
    # (>= 0.325), and top-p would keep both again: two tokens. The documented order gives one.
    logits = np.log(np.array([0.5, 0.3, 0.2], np.float32))
    got = np.asarray(probs_from_logits(logits, SamplingParams(1.0, 0, 0.6, 0.65)))
    np.testing.assert_allclose(got, [1.0, 0.0, 0.0], atol=1e-6)
    assert (np.asarray(probs_from_logits(logits, SamplingParams(1.0, 0, 1.0, 0.65))) > 0).sum() == 1
    assert (np.asarray(probs_from_logits(logits, SamplingParams(1.0, 0, 0.6, 0.0))) > 0).sum() == 2


def test_per_row_parameters_equal_each_rows_own():
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 2, (6, 3, 40)).astype(np.float32)      # [B, positions, V]
    rows = [SamplingParams(0.0), SamplingParams(1.0), SamplingParams(0.7, 5),
            SamplingParams(1.2, 0, 0.8), SamplingParams(0.9, 0, 1.0, 0.2),
            SamplingParams(0.5, 10, 0.9, 0.1)]
    got = np.asarray(jax.jit(probs_from_logits)(logits, Sampling.of(rows)))
    for b, params in enumerate(rows):
        np.testing.assert_array_equal(got[b], np.asarray(probs_from_logits(logits[b], params)))


# -- Each row under its own law, end to end -------------------------------------------------------

# Row groups of one batch, each with its own setting; every group is G-tested against its law.
GROUPS = [SamplingParams(1.0), SamplingParams(0.7, 0, 0.9), SamplingParams(1.0, 3),
          SamplingParams(0.8, 0, 1.0, 0.2)]
ROWS_PER_GROUP = 25_000
TREE = ((0,), (1,), (0, 0), (1, 0))
CASES = {           # each case's method, given the draft and the heads
    "speculative-k2": lambda draft, heads: specjax.Speculative(draft, k=2),
    "ngram-k2": lambda draft, heads: specjax.NGram(k=2),
    "tree-2x2-distinct": lambda draft, heads: specjax.Speculative(draft, tree=TREE,
                                                                  candidates="distinct"),
    "medusa-2x2-iid": lambda draft, heads: specjax.Medusa(heads, tree=TREE, candidates="iid"),
}
# One test per group and case at a family level of 0.01 (Bonferroni), as test_distribution.py.
ALPHA = 0.01 / (len(CASES) * len(GROUPS))


def prompt_of(name: str) -> list[int]:
    return NGRAM_PROMPT if name.startswith("ngram") else PROMPT


def draw_groups(models, heads, name: str, rules=None) -> list[np.ndarray]:
    target, draft = models
    per_row = lambda name: np.repeat([getattr(g, name) for g in GROUPS], ROWS_PER_GROUP)  # noqa: E731
    sampling = SamplingParams(*map(per_row, ("temperature", "top_k", "top_p", "min_p")))
    result = generate(target,
                      np.tile(np.asarray(prompt_of(name), np.int32),
                              (len(GROUPS) * ROWS_PER_GROUP, 1)),
                      CASES[name](draft, heads), sampling, max_new_tokens=L, eos_ids=(),
                      seed=11, rules=rules)
    samples = np.array(result.tokens, np.int32)
    return [samples[i * ROWS_PER_GROUP:(i + 1) * ROWS_PER_GROUP] for i in range(len(GROUPS))]


@pytest.mark.parametrize("name", CASES)
def test_each_row_group_samples_its_own_target_law(models, heads, name):
    target, _ = models
    laws = [exact_law(target, prompt_of(name), g, L) for g in GROUPS]
    groups = draw_groups(models, heads, name)
    for group, law, params in zip(groups, laws, GROUPS):
        p_value = gtest.p_value(group, law, V)
        assert p_value > ALPHA, f"{name} {params}: G-test p = {p_value:.3g} <= {ALPHA:.3g}"
    # Negative control on the same samples: each group against the next group's law is
    # rejected, so the test sees which setting a row was sampled under.
    for i, group in enumerate(groups):
        p_value = gtest.p_value(group, laws[(i + 1) % len(GROUPS)], V)
        assert p_value < ALPHA, f"{name}: group {i} passed the law of group {i + 1}: p = {p_value:.3g}"


def _propose_with_the_first_rows_settings(keys, logits, sampling):
    """A draft that samples every row with row 0's setting but reports each row's own p: the
    bug of a sampler whose parameters are not per row."""
    first = jax.tree.map(lambda a: jnp.broadcast_to(a[0], a.shape), sampling)
    return sample_rows(keys, probs_from_logits(logits, first)), probs_from_logits(logits, sampling)


def test_a_draft_ignoring_per_row_settings_is_caught(models, heads):
    target, _ = models
    groups = draw_groups(models, heads, "speculative-k2",
                         rules=Rules(propose=_propose_with_the_first_rows_settings))
    p_values = [gtest.p_value(group, exact_law(target, PROMPT, g, L), V)
                for group, g in zip(groups[1:], GROUPS[1:])]
    assert min(p_values) < ALPHA, p_values


# -- Greedy rows of a mixed batch -----------------------------------------------------------------

@pytest.mark.parametrize("method", [
    lambda draft, heads: specjax.Speculative(draft, k=3),
    lambda draft, heads: specjax.NGram(k=3),
    lambda draft, heads: specjax.Speculative(draft, tree=((0,), (1,), (0, 0)),
                                             candidates="distinct"),
    lambda draft, heads: specjax.Medusa(heads, tree=((0,), (1,), (0, 0)), candidates="iid"),
], ids=["speculative", "ngram", "tree", "medusa"])
def test_greedy_rows_of_a_mixed_batch_equal_autoregressive_greedy(models, heads, method):
    target, draft = models
    prompts = [list(PROMPT), list(NGRAM_PROMPT), [3, 1, 4, 1, 5], [2, 2, 5]]
    greedy = generate(target, prompts, sampling=SamplingParams(temperature=0.0),
                      max_new_tokens=12, eos_ids=())
    mixed = generate(target, prompts, method(draft, heads),
                     SamplingParams(temperature=[0.0, 0.9, 0.0, 1.0], top_p=[1.0, 0.9, 0.5, 1.0],
                                    min_p=[0.0, 0.1, 0.3, 0.0]),
                     max_new_tokens=12, eos_ids=(), seed=5)
    assert mixed.tokens[0] == greedy.tokens[0]
    assert mixed.tokens[2] == greedy.tokens[2]


# -- No recompiles --------------------------------------------------------------------------------

def test_new_settings_reuse_the_compiled_program(models, heads):
    target, draft = models
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **kw: compiles.append(event)
        if event == "/jax/core/compile/backend_compile_duration" else None)

    # A tree's candidate scheme is static; its default ("top" when every row is greedy, else
    # "distinct") would change with the temperatures, so it is fixed here.
    methods = {"autoregressive": "autoregressive", "speculative": specjax.Speculative(draft, k=3),
               "ngram": specjax.NGram(k=3),
               "medusa": specjax.Medusa(heads, tree=((0,), (1,), (0, 0)), candidates="top")}

    def call(method, prompt_len, max_new_tokens, seed, eos_ids=None, **sampling):
        prompts = [[1 + (i % 5) for i in range(prompt_len)]] * 3
        return generate(target, prompts, methods[method], SamplingParams(**sampling),
                        max_new_tokens=max_new_tokens, seed=seed, eos_ids=eos_ids)

    variants = [dict(temperature=0.7, max_new_tokens=10, seed=1),
                dict(temperature=[0.0, 1.0, 0.5], top_k=[0, 3, 2], top_p=0.9, seed=2,
                     max_new_tokens=12),
                dict(temperature=1.2, min_p=[0.1, 0.0, 0.5], max_new_tokens=[3, 8, 12],
                     eos_ids=[[1], [], [2, 3]], seed=[4, 5, 6])]
    # The small host-side helpers (per-row seeds to keys, ...) compile once per process.
    for variant in variants:
        call("autoregressive", 5, **variant)
    for method in ("autoregressive", "speculative", "ngram", "medusa"):
        call(method, 5, temperature=0.0, max_new_tokens=10, seed=0)      # compiles `method`
        before = len(compiles)
        for prompt_len, variant in zip((5, 6, 7), variants):     # all in one prompt bucket
            call(method, prompt_len, **variant)
        assert len(compiles) == before, f"{method}: {len(compiles) - before} recompiles"
    assert compiles, "the listener saw no compile at all"


# -- Per-row metrics and validation ---------------------------------------------------------------

@pytest.mark.parametrize("method", ["speculative", "ngram", "medusa"])
def test_row_stats_add_up(models, heads, method):
    target, draft = models
    chosen = {"speculative": specjax.Speculative(draft, k=3), "ngram": specjax.NGram(k=3),
              "medusa": specjax.Medusa(heads, tree=((0,), (1,), (0, 0)))}[method]
    result = generate(target, [list(PROMPT), list(NGRAM_PROMPT), [3, 1, 4]], chosen,
                      SamplingParams(temperature=[0.0, 1.0, 0.6]),
                      max_new_tokens=[5, 17, 11], eos_ids=(), seed=3)
    depth = 2 if method == "medusa" else 3
    for row, tokens in zip(result.row_stats, result.tokens):
        hist = np.array(row.accepted_histogram)
        assert len(hist) == depth + 1
        assert row.new_tokens == len(tokens)
        assert hist.sum() == row.target_calls                      # one entry per call
        assert (hist * np.arange(len(hist))).sum() == row.accepted  # accepted drafts
        # Each call emits its accepted drafts and one more token; only the last call may be cut
        # short by max_new_tokens.
        emitted = row.accepted + row.target_calls
        assert emitted - depth <= row.new_tokens <= emitted
    assert [len(t) for t in result.tokens] == [5, 17, 11]
    for name in ("target_calls", "draft_calls", "drafted", "accepted", "new_tokens"):
        assert getattr(result.stats, name) == sum(getattr(r, name) for r in result.row_stats)
    assert result.stats.accepted_histogram == tuple(
        np.sum([r.accepted_histogram for r in result.row_stats], axis=0).tolist())


def test_stop_ids_per_row(models):
    target, _ = models
    free = generate(target, [list(PROMPT)] * 2, sampling=SamplingParams(temperature=0.0),
                    max_new_tokens=12, eos_ids=())
    stop = free.tokens[0][4]
    result = generate(target, [list(PROMPT)] * 2, sampling=SamplingParams(temperature=0.0),
                      max_new_tokens=12, eos_ids=[[stop], []])
    assert result.tokens[0] == free.tokens[0][:free.tokens[0].index(stop) + 1]
    assert result.tokens[1] == free.tokens[1]


@pytest.mark.parametrize("kwargs, shown", [
    (lambda: dict(sampling=SamplingParams(temperature=[0.0, -1.0])), "-1.0"),
    (lambda: dict(sampling=SamplingParams(min_p=1.5)), "1.5"),
    (lambda: dict(sampling=SamplingParams(top_k=[1, 2, 3])), "3 values for 2 prompts"),
    (lambda: dict(sampling=SamplingParams(top_p=[[0.5], [0.5]])), "flat list"),
    (lambda: dict(max_new_tokens=[4, 0]), "max_new_tokens"),
    (lambda: dict(eos_ids=[[1], [2], [3]]), "3 lists"),
    (lambda: dict(eos_ids=[-2]), "-2"), (lambda: dict(eos_ids=5), "eos_ids"),
    (lambda: dict(sampling=SamplingParams(min_p="x")), "'x'"),
])
def test_bad_per_row_values_are_named_errors(models, kwargs, shown):
    # Made inside the check: a SamplingParams checks its values when made.
    target, _ = models
    with pytest.raises(GenerationError, match=None) as error:
        generate(target, [list(PROMPT)] * 2, **kwargs())
    assert shown in str(error.value)


# -- Prepared requests ---------------------------------------------------------------------------

def test_a_prepared_request_runs_as_its_arguments_would(models):
    """`generate(request)` and `stream(request)` give what `generate(target, prompts, **options)`
    gives; `reseeded(s)` what `prepare(..., seed=s)` gives (the CLI and the bench prepare once)."""
    from specjax.api.generate import prepare, stream

    target, draft = models
    options = dict(method=specjax.Speculative(draft=draft, k=3),
                   sampling=SamplingParams(temperature=[0.0, 1.0, 0.7]), max_new_tokens=9,
                   eos_ids=())
    prompts = [list(PROMPT), list(NGRAM_PROMPT), [3, 1, 4]]
    request = prepare(target, prompts, seed=1, **options)
    assert generate(request).tokens == generate(target, prompts, seed=1, **options).tokens
    streamed = [[] for _ in prompts]
    for step, last in stream(request):
        for row, new in zip(streamed, step):
            row.extend(new)
    assert streamed == last.tokens == generate(request).tokens
    for seed in (2, [7, 8, 9]):
        again = generate(request.reseeded(seed)).tokens
        assert again == generate(target, prompts, seed=seed, **options).tokens
    assert generate(request.reseeded(2)).tokens != generate(request).tokens    # row 1 samples
    with pytest.raises(GenerationError, match="got sampling beside it"):
        generate(request, sampling=SamplingParams(temperature=0.5))
    with pytest.raises(GenerationError, match="prompts beside it"):
        generate(request, prompts)
    with pytest.raises(GenerationError, match="prompts are required"):
        generate(target)
