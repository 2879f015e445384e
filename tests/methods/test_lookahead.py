"""Dynamic speculation lookahead (`decoding.lookahead`): every schedule gives the target's
greedy output, a row's tokens do not depend on its batch, the draft does less work where it is
unsure, and bad options are clear errors. Theorem 1 for the schedules is in
test_distribution.py."""

from pathlib import Path

import numpy as np
import pytest

import specjax
from specjax.api.generate import GenerationError, generate, prepare
from specjax.decoding import lookahead, loop
from tests.support.tiny import close_pair

WEIGHTS = Path(__file__).resolve().parents[2] / "weights"
PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3, 4], [7, 6], [5], [3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 2]]
N = 24
K = 6
SCHEDULES = {     # each a method of K drafts, given the draft model
    "heuristic": lambda draft: specjax.Speculative(draft, K, k_schedule="heuristic"),
    "heuristic-start-1": lambda draft: specjax.Speculative(draft, K, k_schedule="heuristic",
                                                           k_start=1),
    "confidence": lambda draft: specjax.Speculative(draft, K, k_schedule="confidence",
                                                    confidence_threshold=0.5),
    "ngram-heuristic": lambda draft: specjax.NGram(K, k_schedule="heuristic", k_start=2),
}


@pytest.fixture(scope="module")
def models():
    # A draft close to the target: acceptances are frequent, so lengths move both ways.
    return close_pair(vocab=8, std=0.5, noise=0.3)


@pytest.fixture(scope="module")
def greedy(models):
    return generate(models[0], PROMPTS, sampling=specjax.SamplingParams(temperature=0.0),
                    max_new_tokens=N, eos_ids=()).tokens


@pytest.mark.fast(cases=["ngram-heuristic"])
@pytest.mark.parametrize("name", SCHEDULES)
def test_schedule_gives_the_greedy_output_batched_and_alone(models, greedy, name):
    target, draft = models
    kwargs = dict(method=SCHEDULES[name](draft), sampling=specjax.SamplingParams(temperature=0.0),
                  max_new_tokens=N, eos_ids=())
    batched = generate(target, PROMPTS, **kwargs)
    assert batched.tokens == greedy
    stats = batched.stats
    assert 0 < stats.accepted < stats.drafted
    assert 1.0 <= stats.mean_draft_length < K     # the schedule did shorten some steps
    if name in ("heuristic", "confidence"):
        assert generate(target, [PROMPTS[2]], **kwargs).tokens[0] == greedy[2]


@pytest.mark.parametrize("name", ["heuristic", "confidence"])
def test_sampled_row_alone_equals_row_in_batch(models, name):
    # Each row's schedule state (its length, its stopping) is its own: batch neighbours that
    # draft longer or shorter change nothing in it.
    target, draft = models
    kwargs = dict(method=SCHEDULES[name](draft), sampling=specjax.SamplingParams(temperature=1.0),
                  max_new_tokens=N, eos_ids=())
    batch = generate(target, PROMPTS, seed=[11, 12, 13, 14], **kwargs).tokens
    assert generate(target, [PROMPTS[3]], seed=[14], **kwargs).tokens[0] == batch[3]


def test_rows_keep_their_own_heuristic_length(models):
    # After one step every row's next length follows its own acceptance: + 2 (capped at K)
    # after a fully accepted draft, - 1 (at least 1) otherwise.
    target, draft = models
    request = prepare(target, PROMPTS,
                      method=specjax.Speculative(draft=draft, k=K, k_schedule="heuristic", k_start=3),
                      sampling=specjax.SamplingParams(temperature=1.0), max_new_tokens=60,
                      eos_ids=(), seed=[1, 2, 3, 4])
    state = loop.init(request.spec, request.weights, *request.inputs)
    lengths = [np.asarray(state.carry.lookahead)]
    for _ in range(6):
        before = state
        state = loop.step(request.spec, request.weights, state)
        drafted = np.asarray(state.drafted - before.drafted)
        accepted = np.asarray(state.accepted - before.accepted)
        want = np.where(accepted == drafted, np.minimum(lengths[-1] + 2, K),
                        np.maximum(lengths[-1] - 1, 1))
        assert (drafted == lengths[-1]).all()
        lengths.append(np.asarray(state.carry.lookahead))
        np.testing.assert_array_equal(lengths[-1], want)
    assert len({tuple(x) for x in np.stack(lengths, 1)}) > 1   # rows moved differently


def test_draft_works_less_where_it_is_unsure():
    # The shipped tiny Llama pair at temperature 0: on a repeated import block the draft's top
    # probability stays above 0.2 (measured 6.5 tokens drafted per step of K = 8), on an
    # assignment list it rarely does (1.0 on these eleven lines). The tiny draft is well
    # calibrated and seldom exceeds transformers' 0.4 even on repetition, hence the lower
    # threshold. (The two prompts, 36 and 46 tokens, take the same buffer sizes: one compiled
    # program for both calls.)
    target = specjax.load(WEIGHTS / "llama-target")
    draft = specjax.load(WEIGHTS / "llama-draft")
    kwargs = dict(method=specjax.Speculative(draft=draft, k=8, k_schedule="confidence", confidence_threshold=0.2),
                  sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=24, eos_ids=())
    confident = generate(target, ["import os\nimport sys\n" * 6], **kwargs).stats
    assignments = "".join(f"{name} = {i}\n" for i, name in enumerate("abcdefghijk", 1))
    unsure = generate(target, [assignments], **kwargs).stats
    assert confident.mean_draft_length >= 5.0, confident
    assert unsure.mean_draft_length <= 2.0, unsure


@pytest.mark.fast
def test_verify_sizes():
    assert lookahead.verify_sizes(1) == (1,)
    assert lookahead.verify_sizes(4) == (1, 2, 4)
    assert lookahead.verify_sizes(20) == (1, 2, 4, 8, 16, 20)


@pytest.mark.fast
@pytest.mark.parametrize("kwargs, needle", [
    (dict(k_schedule="dynamic"), "k_schedule must be one of constant, heuristic, confidence; "
                                 "got 'dynamic'"),
    (dict(k_schedule="confidence", confidence_threshold=1.5), "got 1.5"),
    (dict(k_schedule="confidence", confidence_threshold=-0.1), "got -0.1"),
    (dict(k_schedule="confidence", confidence_threshold="high"), "got 'high'"),
    (dict(k_schedule="heuristic", k=4, k_start=5), "k_start=5 is more than k=4"),
    (dict(k_schedule="heuristic", k_start=0), "k_start must be an integer >= 1, got 0"),
    (dict(k_start=3), "k_start applies to k_schedule='heuristic'"),
    (dict(confidence_threshold=0.3), "confidence_threshold applies to k_schedule='confidence'"),
    (dict(method="ngram", k_schedule="confidence"), "n-gram lookup has none"),
    (dict(method="autoregressive", k_schedule="heuristic"),
     "k_schedule does not apply to method 'autoregressive'"),
    (dict(k_schedule="heuristic", tree=((0,), (1,))), "a token tree's shape is fixed"),
])
def test_bad_schedule_options_are_clear_errors(models, kwargs, needle):
    # Each case as the command line builds it (`methods.build`): a name and its options.
    target, draft = models
    name = kwargs.pop("method", "speculative")
    with pytest.raises(GenerationError) as info:
        method = specjax.api.methods.build(name, draft=draft if name == "speculative" else None,
                                           **kwargs)
        generate(target, PROMPTS, method)
    assert needle in str(info.value)


def test_heuristic_default_start_fits_a_small_k(models, greedy):
    # k_start defaults to min(5, k): k = 2 with the heuristic schedule is not an error.
    target, draft = models
    result = generate(target, PROMPTS,
                      method=specjax.Speculative(draft=draft, k=2, k_schedule="heuristic"),
                      sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=N,
                      eos_ids=())
    assert result.tokens == greedy


@pytest.mark.fast
def test_oracle_steps_accept_up_to_the_first_mismatch():
    from specjax.bench.oracle import oracle_steps

    # Guesses 0-2 agree, 3 does not (step 1 accepts 3 and emits the target's token 3), 4 does
    # not either (step 2 accepts none), 5-6 agree and the text ends (step 3 accepts 2).
    assert oracle_steps([True, True, True, False, False, True, True]) == [3, 0, 2]
    assert oracle_steps([False] * 3) == [0, 0, 0]
    assert oracle_steps([True] * 4) == [4]


def test_oracle_analysis_needs_the_fewest_target_calls(models, tmp_path):
    # The oracle accepts, at every step, all that any greedy draft of that step could: so from
    # the same text no schedule reaches the end in fewer target calls. Every run's steps add up
    # to the tokens generated.
    from specjax.bench import oracle

    target, draft = models
    n = 16
    prompts = [dict(id="p", category="c", ids=PROMPTS[0], max_new_tokens=n)]
    per_prompt = oracle.analyse(target, draft, prompts, ks=[3], threshold=0.5)
    runs = per_prompt[0]["runs"]
    assert set(runs) == {"oracle", "constant K=3", "heuristic K<=3", "confidence K<=3"}
    for name, run in runs.items():
        assert run["target_calls"] >= runs["oracle"]["target_calls"], name
        emitted = sum(run["accepted"]) + run["target_calls"]
        assert emitted in (n, n + 1), name        # the last step may be cut by max_new_tokens
    assert runs["constant K=3"]["drafted"] == [3] * runs["constant K=3"]["target_calls"]
    assert runs["constant K=3"]["draft_calls"] == sum(runs["constant K=3"]["drafted"])
    results = dict(per_prompt=per_prompt, summary=oracle.summary(per_prompt), notes=[],
                   created="2026-11-23T00:00:00", machine=dict(cpu_model="cpu", cpu_count=2),
                   settings=dict(target="t", draft="d", suite_version=2, max_new_tokens=n,
                                 confidence_threshold=0.5), prompts=prompts)
    assert "| oracle | " in oracle.markdown(results)
    written = oracle.plots(results, tmp_path)
    assert all((tmp_path / name).stat().st_size > 0 for name in written)
