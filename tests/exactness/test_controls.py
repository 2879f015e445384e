"""Penalties, logit bias and a minimum length (`specjax.sampling.controls`, a to d of its
docstring), exact under every method.

The rule. `apply_controls` equals `specjax.testing.law.controlled`, the rule written again in
numpy as OpenAI, vLLM and transformers state it, on random logits and histories with drafts
(a drafted token counts as generated at the positions after it).

Greedy equality. Every method, in one batch whose rows set different controls, gives each row
the tokens of autoregressive decoding of that row alone.

Theorem 1. Each case draws N = 30,000 continuations of L = 3 tokens of the tiny pair in one
call and compares them by a G-test with their exact law (`specjax.testing.law.exact_law` with
the controls: each position's target distribution given the prompt and the continuation before
it), at a family level of 0.01, Bonferroni-split over the positive cases. N is the token-tree
cases' of tests/exactness/test_distribution.py. Negative controls: the same test, seed and size must
reject a sampler whose target distribution at a verify position counts only the committed
tokens, not the drafts before it (the engines' bug: SGLang #33643, vLLM #18902), in a chain and
in a tree.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np
import pytest

import specjax
from specjax.api.generate import GenerationError, generate
from specjax.heads import dflash
from specjax.model.transformer import forward
from specjax.sampling.controls import Controls, History, apply_controls
from specjax.sampling.logits import SamplingParams
from specjax.sampling.rules import Rules
from specjax.sampling.tree import Tree
from specjax.testing import gtest, law as laws
from tests.exactness.test_distribution import NGRAM_PROMPT, PROMPT, eagle_drafter, medusa_heads
from tests.support.tiny import close_pair

V, L, N = 6, 3, 30_000
WEIGHTS = Path(__file__).resolve().parents[2] / "weights"

ALL = dict(repetition_penalty=1.6, presence_penalty=0.5, frequency_penalty=0.4,
           logit_bias={3: 0.9, 0: -0.6}, min_tokens=2)
ONE_EACH = {"repetition": dict(repetition_penalty=2.0), "presence": dict(presence_penalty=1.2),
            "frequency": dict(frequency_penalty=1.0), "bias": dict(logit_bias={3: 1.2, 0: -0.8}),
            "min-tokens": dict(min_tokens=2), "negative-penalties": dict(
                repetition_penalty=0.6, presence_penalty=-0.8, frequency_penalty=-0.5)}
EOS = (5,)          # min_tokens masks it at the first two positions; it may end the third


@pytest.fixture(scope="module")
def models():
    return close_pair(vocab=V, std=0.5, noise=0.15)


def _controls(rows, **options):
    from specjax.api.checks import check_controls
    return check_controls(specjax.SamplingParams(**options), rows, V, np.full(rows, 8, np.int32))


@pytest.mark.fast
def test_controls_follow_the_rule_as_the_engines_state_it():
    rng = np.random.default_rng(0)
    b, n, m, prompt_length, length = 3, 4, 12, 5, 8
    tokens = rng.integers(0, V, (b, m)).astype(np.int32)
    logits = rng.normal(0, 2, (b, n, V)).astype(np.float32)
    logits[0, 1, 2] = -np.inf                                     # a masked token stays masked
    raw = rng.integers(0, V, (b, n, n - 1))
    before = np.arange(n - 1)[None, None, :] < np.arange(n)[None, :, None]  # a chain's drafts
    drafted = np.where(before, raw, -1).astype(np.int32)
    drafted[2, 3, 1] = drafted[2, 3, 0]                           # a token drafted twice
    settings = [dict(repetition_penalty=1.7, presence_penalty=0.6, frequency_penalty=0.3,
                     logit_bias={1: 2.5}, min_tokens=5),
                dict(repetition_penalty=0.8, presence_penalty=-1.0, min_tokens=2),
                dict(frequency_penalty=1.9, logit_bias={0: -100.0, 4: 3.0})]
    controls = _controls(b, **{k: [s.get(k, d) for s in settings] for k, d in (
        ("repetition_penalty", 1.0), ("presence_penalty", 0.0), ("frequency_penalty", 0.0),
        ("logit_bias", None), ("min_tokens", 0))})
    stops = np.array([[5, -1], [5, 0], [-1, -1]], np.int32)
    got = np.asarray(apply_controls(logits, controls, History(
        tokens, np.full(b, length, np.int32), np.full(b, prompt_length, np.int32), stops,
        drafted)))
    for row in range(b):
        for i in range(n):
            before = [t for t in drafted[row, i] if t >= 0]
            output = np.concatenate([tokens[row, prompt_length:length], before])
            want = laws.controlled(logits[row, i][None], tokens[row, :prompt_length],
                                   output[None], eos_ids=[s for s in stops[row] if s >= 0],
                                   **settings[row])
            np.testing.assert_allclose(got[row, i], want[0], rtol=1e-6, atol=1e-6)
    # Rows that set nothing get their logits back to the bit.
    off = Controls.off(b, V)
    same = apply_controls(logits, off, History(tokens, np.full(b, length, np.int32),
                                               np.full(b, prompt_length, np.int32), stops,
                                               drafted))
    np.testing.assert_array_equal(np.asarray(same), logits)


def _methods(target, draft):
    drafter = eagle_drafter(target)
    block = dflash.init_block_drafter(target, layers=1, block_size=4, taps=(1, 2), std=0.6,
                                      mask_token_id=V - 1, seed=3)
    return {"speculative": dict(method=specjax.Speculative(draft=draft, k=3)),
            "speculative-tree": dict(method=specjax.Speculative(draft=draft, tree=Tree.full((2, 2)))),
            "ngram": dict(method=specjax.NGram(k=3)),
            "ngram-heuristic": dict(method=specjax.NGram(k=4, k_schedule="heuristic")),
            "medusa": dict(method=specjax.Medusa(heads=medusa_heads(target))),
            "eagle": dict(method=specjax.Eagle(drafter=drafter)),
            "dflash": dict(method=specjax.DFlash(drafter=block))}


ROWS = [dict(), dict(repetition_penalty=1.8), dict(presence_penalty=1.5, frequency_penalty=0.7),
        dict(logit_bias={2: 1.5, 4: -2.0}, min_tokens=6), ALL]
GREEDY_PROMPTS = [PROMPT, [3, 1], [2, 2, 2, 5, 0, 1, 4, 3], NGRAM_PROMPT, [0, 4, 4, 1]]


def _per_row(rows):
    keys = ("repetition_penalty", "presence_penalty", "frequency_penalty", "logit_bias",
            "min_tokens")
    defaults = (1.0, 0.0, 0.0, None, 0)
    return {k: [r.get(k, d) for r in rows] for k, d in zip(keys, defaults)}


# The batched calls here report log-probabilities (`LOGPROBS`, which changes no token: the rows
# alone report none), with the rows and length of the log-probability test below: the two tests
# then run one compiled program per method, not two (issue 84).
LOGPROBS, MAX_NEW = 3, 16


def test_every_method_is_greedy_equal_under_every_control_batched_and_alone(models):
    target, draft = models
    alone = [generate(target, [p], sampling=SamplingParams(temperature=0.0, **row),
                      max_new_tokens=MAX_NEW, eos_ids=EOS).tokens[0]
             for p, row in zip(GREEDY_PROMPTS, ROWS)]
    plain = generate(target, GREEDY_PROMPTS,
                     sampling=SamplingParams(temperature=0.0, logprobs=LOGPROBS),
                     max_new_tokens=MAX_NEW, eos_ids=EOS).tokens
    assert sum(a != p for a, p in zip(alone, plain)) >= 3          # the controls do something
    for name, options in _methods(target, draft).items():
        got = generate(target, GREEDY_PROMPTS,
                       sampling=SamplingParams(temperature=0.0, logprobs=LOGPROBS,
                                               **_per_row(ROWS)),
                       max_new_tokens=MAX_NEW, eos_ids=EOS, **options)
        assert got.tokens == alone, name
        assert got.stats.accepted > 0, name
        last = generate(target, [GREEDY_PROMPTS[-1]],
                        sampling=SamplingParams(temperature=0.0, **ALL), max_new_tokens=MAX_NEW,
                        eos_ids=EOS, **options)
        assert last.tokens == [alone[-1]], name


def _forgets_drafts(logits, controls, history):
    """The engines' bug: penalties counted over the committed tokens only."""
    return apply_controls(logits, controls, dataclasses.replace(history, drafted=None))


POSITIVE = {
    **{f"speculative-{name}": ("speculative", options) for name, options in ONE_EACH.items()},
    "autoregressive-all": ("autoregressive", ALL),
    "speculative-all-t0.7-top-p": ("speculative", dict(ALL, temperature=0.7, top_p=0.9)),
    "tree-all": ("speculative-tree", ALL),
    "ngram-all": ("ngram", ALL),
    "medusa-all": ("medusa", ALL),
    "eagle-all": ("eagle", ALL),
    "dflash-all": ("dflash", ALL),
}
ALPHA = 0.01 / len(POSITIVE)
NEGATIVE = {"chain-forgets-drafts": ("speculative", dict(frequency_penalty=1.5)),
            "tree-forgets-drafts": ("speculative-tree", dict(presence_penalty=1.5))}


def _draw(models, method, options, **extra):
    target, draft = models
    options = dict(options)
    sampling = SamplingParams(options.pop("temperature", 1.0), 0, options.pop("top_p", 1.0))
    prompt = NGRAM_PROMPT if method == "ngram" else PROMPT
    extra.update(_methods(target, draft).get(method, dict(method=method)))
    if method == "speculative":
        extra["method"] = dataclasses.replace(extra["method"], k=2)
    # An EOS id only where min_tokens keeps it out of the first L - 1 tokens: every row then
    # has L tokens, and the law is that of all V^L continuations.
    eos = EOS if options.get("min_tokens") == L - 1 else ()
    result = generate(target, np.tile(np.asarray(prompt, np.int32), (N, 1)),
                      sampling=sampling.replace(**options), max_new_tokens=L, seed=0,
                      eos_ids=eos, **extra)
    samples = np.array(result.tokens, np.int32)
    law = laws.exact_law(target, prompt, sampling, L, controls=dict(options, eos_ids=eos))
    return gtest.p_value(samples, law, V), result.stats


@pytest.mark.fast(cases=["speculative-all-t0.7-top-p"])
@pytest.mark.parametrize("name", POSITIVE)
def test_every_method_samples_the_controlled_target(models, name):
    p_value, stats = _draw(models, *POSITIVE[name])
    assert p_value > ALPHA, f"{name}: G-test p = {p_value:.3g} <= {ALPHA:.3g}"
    if POSITIVE[name][0] != "autoregressive":
        assert 0 < stats.accepted < stats.drafted


@pytest.mark.fast(cases=["chain-forgets-drafts"])
@pytest.mark.parametrize("name", NEGATIVE)
def test_penalties_that_forget_the_drafts_are_caught(models, name):
    p_value, _ = _draw(models, *NEGATIVE[name], rules=Rules(controls=_forgets_drafts))
    assert p_value < ALPHA, f"{name} not caught: p = {p_value:.3g}"


@pytest.mark.parametrize("options, match", [
    (dict(repetition_penalty=0.0), "repetition_penalty must be a finite number > 0"),
    (dict(repetition_penalty=float("nan")), "repetition_penalty"),
    (dict(presence_penalty=2.5), r"presence_penalty must be in \[-2, 2\]"),
    (dict(frequency_penalty=[0.1]), "frequency_penalty has 1 values for 2 prompts"),
    (dict(logit_bias={6: 1.0}), r"logit_bias has token id 6, outside the vocabulary \[0, 6\)"),
    (dict(logit_bias={1: 101.0}), r"logit_bias\[1\] must be a number in \[-100, 100\]"),
    (dict(logit_bias=[1.0, 2.0]), "logit_bias must be a dict"),
    (dict(min_tokens=9), "min_tokens=9 exceeds max_new_tokens=8"),
    (dict(min_tokens=-1), "min_tokens must be an integer >= 0"),
])
def test_bad_controls_are_named_errors(models, options, match):
    with pytest.raises(GenerationError, match=match):
        generate(models[0], [PROMPT, [1, 2]], sampling=SamplingParams(**options),
                 max_new_tokens=8)


def test_the_command_line_takes_the_controls(capsys):
    from specjax.cli.main import main
    args = ["generate", "--preset", "tiny-llama", "--prompt", "def f(x):", "-n", "8", "--json",
            "--method", "speculative", "-k", "2", "--repetition-penalty", "1.3",
            "--frequency-penalty", "0.5", "--logit-bias", "5:30", "--logit-bias", "9:-1",
            "--min-tokens", "8", "--logprobs", "2", "--stop", "never there",
            "--regex", "[a-z ]+"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    settings = report["settings"]
    assert (settings["repetition_penalty"], settings["frequency_penalty"], settings["min_tokens"],
            settings["logit_bias"]) == (1.3, 0.5, 8, {"5": 30.0, "9": -1.0})
    target = specjax.load(report["target_path"])
    want = generate(target, ["def f(x):"],
                    sampling=SamplingParams(temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.5, logit_bias={5: 30.0, 9: -1.0}, min_tokens=8, regex="[a-z ]+"),
                    max_new_tokens=8)
    plain = generate(target, ["def f(x):"], sampling=SamplingParams(temperature=0.0),
                     max_new_tokens=8)
    assert report["results"][0]["tokens"] == want.tokens[0] != plain.tokens[0]
    shown = report["results"][0]["logprobs"]
    assert [t["token"] for t in shown] == want.tokens[0]
    assert all(len(t["top"]) == 2 and t["top"][0][1] >= t["top"][1][1] for t in shown)


# -- Log-probabilities -------------------------------------------------------------------------

# The reference's programs take one shape: every prompt and continuation below, padded to
# `_SEQ` tokens (the forward is causal, so the padding after them changes no logit before it),
# and every position's row of logits, padded to `_SEQ` rows. One forward program and one
# `probs_from_logits` program then serve every call, rather than one per length (issue 84).
_SEQ = 24                           # the longest prompt (8) and MAX_NEW tokens
_forward = jax.jit(forward, static_argnums=1)


def _reference_logprobs(target, prompt, tokens, sampling, options, eos):
    """Each new token's log-probability and the ranking of the vocabulary at its position,
    from one full-sequence forward pass of the target over the prompt and the tokens, the
    controls of `law.controlled` and the sampling transforms (temperature 0: the log-softmax
    of the controlled logits)."""
    import jax.numpy as jnp
    from specjax.sampling.logits import probs_from_logits
    seq = np.zeros((1, _SEQ), np.int32)
    seq[0, :len(prompt) + len(tokens)] = list(prompt) + list(tokens)
    logits, _ = _forward(target.params, target.config, jnp.asarray(seq), jnp.arange(_SEQ)[None])
    # Sliced in numpy: a slice of the device array is a program of its own for each length.
    logits = np.asarray(logits)[0, len(prompt) - 1:len(prompt) - 1 + len(tokens)]
    rows = np.concatenate([laws.controlled(logits[i][None], prompt, np.asarray(tokens[:i])[None],
                                           eos_ids=eos, **options) for i in range(len(tokens))])
    if sampling.temperature == 0:
        shifted = rows - rows.max(axis=-1, keepdims=True)
        return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    padded = np.zeros((_SEQ, rows.shape[1]), rows.dtype)
    padded[:len(rows)] = rows
    probs = np.asarray(probs_from_logits(padded, sampling), np.float64)[:len(rows)]
    with np.errstate(divide="ignore"):           # the tokens top-p removed: log 0 = -inf
        return np.log(probs)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_logprobs_are_the_target_law_at_each_token_for_every_method(models, temperature):
    target, draft = models
    options = dict(ALL)
    sampling = SamplingParams(temperature, 0, 0.9 if temperature else 1.0)
    prompts = GREEDY_PROMPTS            # the greedy test's rows and length: its programs
    for name, method in {"autoregressive": dict(), **_methods(target, draft)}.items():
        result = generate(target, prompts,
                          sampling=sampling.replace(logprobs=LOGPROBS, **options),
                          max_new_tokens=MAX_NEW, eos_ids=EOS, seed=4, **method)
        for prompt, tokens, reported in zip(prompts, result.tokens, result.logprobs):
            want = _reference_logprobs(target, prompt, tokens, sampling, options, EOS)
            assert [r.token for r in reported] == tokens, name
            got = np.array([r.logprob for r in reported])
            np.testing.assert_allclose(got, want[np.arange(len(tokens)), tokens], atol=2e-5,
                                       err_msg=name)
            for r, row in zip(reported, want):
                ids = [i for i, _ in r.top]
                assert ids == list(np.argsort(-row, kind="stable")[:3]), name
                np.testing.assert_allclose([x for _, x in r.top], row[ids], atol=2e-5)
    with pytest.raises(GenerationError, match="logprobs must be at most 6"):
        generate(target, prompts, sampling=SamplingParams(logprobs=7), max_new_tokens=2)


# -- Stop strings --------------------------------------------------------------------------------

def test_stop_strings_cut_every_method_alike_across_token_boundaries():
    from specjax.api.generate import stream
    target = specjax.load(WEIGHTS / "llama-target")
    draft = specjax.load(WEIGHTS / "llama-draft")
    prompts = ["def f(x):", "import os"]
    # With the log-probabilities the calls below report, so that it is their autoregressive
    # program (they change no token).
    full = generate(target, prompts, sampling=SamplingParams(temperature=0.0, logprobs=1),
                    max_new_tokens=30)
    eos = set(target.config.eos_token_ids)
    ended = ["eos" if row and row[-1] in eos else "length" for row in full.tokens]
    assert full.finish_reasons == ended and "length" in ended
    text = full.texts[0]
    pieces = [target.tokenizer.decode(full.tokens[0][:j]) for j in range(31)]
    # A stop string that begins inside a token and ends inside a later one.
    begin = next(len(p) + 1 for p, q in zip(pieces, pieces[1:]) if len(q) - len(p) >= 3
                 and len(p) > 5)
    stop = text[begin:begin + 4]
    assert not any(len(p) == begin for p in pieces)               # not at a token boundary
    end = text.index(stop)
    kept = max(j for j, p in enumerate(pieces) if len(p) <= end)
    methods = {"autoregressive": {}, "speculative": dict(method=specjax.Speculative(draft=draft, k=3)),
               "ngram": dict(method='ngram'),
               "speculative-tree": dict(method=specjax.Speculative(draft=draft, tree=Tree.full((2, 2))))}
    for name, options in methods.items():
        got = generate(target, prompts,
                       sampling=SamplingParams(temperature=0.0, stop=[stop, "zzqq"], logprobs=1),
                       max_new_tokens=30, **options)
        assert got.texts[0] == text[:end], name
        assert got.tokens[0] == full.tokens[0][:kept] and len(got.logprobs[0]) == kept, name
        assert got.tokens[1] == full.tokens[1] and got.texts[1] == full.texts[1], name
        assert got.finish_reasons == ["stop", ended[1]], name
        steps = list(stream(target, prompts,
                            sampling=SamplingParams(temperature=0.0, stop=[[stop], []]),
                            max_new_tokens=30, **options))
        yielded = [sum((s[b] for s, _ in steps[:-1]), []) for b in range(2)]
        assert yielded == steps[-1][1].tokens == got.tokens, name
        assert steps[-1][1].finish_reasons == got.finish_reasons, name
    alone = list(stream(target, prompts[:1],
                        sampling=SamplingParams(temperature=0.0, stop=[stop]),
                        max_new_tokens=30))
    assert len(alone) - 1 < 30                                    # streaming stops at the stop
    for bad, match in (("x", "stop must be a list of strings"), ([""], "non-empty strings"),
                       ([["a"]], "stop has 1 lists for 2 prompts")):
        with pytest.raises(GenerationError, match=match):
            generate(target, prompts, sampling=SamplingParams(stop=bad), max_new_tokens=2)
    tiny, _ = close_pair(vocab=V, std=0.5, noise=0.15)
    with pytest.raises(GenerationError, match="no tokenizer"):
        generate(tiny, [PROMPT], sampling=SamplingParams(stop=["a"]), max_new_tokens=2)


def test_bench_times_each_method_with_and_without_the_controls(tmp_path, capsys):
    from specjax.cli.main import main
    assert main(["bench", "--controls", "--preset", "tiny-llama", "--methods", "ngram",
                 "--quick", "--max-new-tokens", "4", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "controls.json").read_text())
    assert [r["method"] for r in report["rows"]] == ["autoregressive", "ngram"]
    for row in report["rows"]:
        assert all(v > 0 for v in row["tokens_per_second"].values())
        assert row["call_ratio"] == pytest.approx(row["seconds_per_target_call"]["controls"]
                                                  / row["seconds_per_target_call"]["plain"])
    assert "| ngram |" in (tmp_path / "controls.md").read_text()


# -- Constrained output --------------------------------------------------------------------------
#
# On the tiny pair, whose tokens have no text, the automaton is built by the same compiler over
# a vocabulary of letters: token i spells the letter "abcde"[i], token 5 is the EOS id.

LETTERS = {bytes([ord("a") + i]): [i] for i in range(5)}
REGEX = "(a|b[cd])[a-e]*"              # a first token of two, a forced second after b
CONSTRAINED = {"autoregressive": "autoregressive", "speculative": "speculative",
               "tree": "speculative-tree", "eagle": "eagle", "dflash": "dflash"}
ALPHA_CONSTRAINED = 0.01 / len(CONSTRAINED)


def _letters():
    from specjax.sampling.constraints import from_vocabulary
    return from_vocabulary(REGEX, LETTERS, V)


def _draw_constrained(models, method, **extra):
    target, draft = models
    options = dict(_methods(target, draft).get(method, dict(method=method)))
    if method == "speculative":
        options["method"] = dataclasses.replace(options["method"], k=2)
    options.update(extra)
    result = generate(target, np.tile(np.asarray(PROMPT, np.int32), (N, 1)),
                      sampling=SamplingParams(temperature=1.0, regex=_letters()),
                      max_new_tokens=L, seed=0, eos_ids=(5,), **options)
    samples = np.array([row + [5] * (L - len(row)) for row in result.tokens], np.int32)
    law = laws.exact_law(target, PROMPT, SamplingParams(1.0), L, automaton=_letters(),
                         eos_ids=(5,))
    return gtest.p_value(samples, law, V), result.stats


@pytest.mark.parametrize("name", CONSTRAINED)
def test_every_method_samples_the_constrained_target(models, name):
    p_value, stats = _draw_constrained(models, CONSTRAINED[name])
    assert p_value > ALPHA_CONSTRAINED, f"{name}: G-test p = {p_value:.3g}"
    if name != "autoregressive":
        assert 0 < stats.accepted < stats.drafted


def _accepts_forbidden_drafts(draft_tokens, draft_probs, target_probs, keys, num_drafted=None,
                              **kwargs):
    """A verifier that lets through a draft the automaton forbids (q = 0): it is scored as if
    the target agreed with the draft there."""
    from specjax.sampling.rejection import verify
    k = draft_tokens.shape[1]
    q = target_probs[:, :k]
    import jax.numpy as jnp
    picked = jnp.take_along_axis(q, draft_tokens[..., None], axis=-1)[..., 0]
    p_x = jnp.take_along_axis(draft_probs, draft_tokens[..., None], axis=-1)[..., 0]
    at_draft = jnp.arange(q.shape[-1]) == draft_tokens[..., None]
    fixed = jnp.where((picked == 0)[..., None] & at_draft, p_x[..., None], q)
    return verify(draft_tokens, draft_probs, target_probs.at[:, :k].set(fixed), keys,
                  num_drafted=num_drafted, **kwargs)


def _proposes_anything(keys, logits, sampling):
    """A draft that half the time ignores the automaton (which steers its logits): half its
    mass is uniform over the vocabulary, so it proposes forbidden tokens."""
    from specjax.sampling.logits import probs_from_logits, sample_rows
    p = 0.5 * probs_from_logits(logits, sampling) + 0.5 / logits.shape[-1]
    return sample_rows(keys, p), p


def test_a_draft_the_automaton_forbids_accepted_is_caught(models):
    p_value, _ = _draw_constrained(models, "speculative", rules=Rules(
        propose=_proposes_anything, verify=_accepts_forbidden_drafts))
    assert p_value < ALPHA_CONSTRAINED, f"not caught: p = {p_value:.3g}"


def _walk(automaton, state, tokens):
    """The automaton's state after `tokens` from `state`: -1 once one is forbidden; the EOS id
    ends a path, allowed only in an accepting state."""
    for token in tokens:
        if state < 0 or token == EOS[0]:
            return state if state >= 0 and automaton.accepting[state] else -1
        state = int(automaton.table[state, token])
    return state


STEERED = {"speculative": {}, "speculative-tree": {}, "medusa": {}, "eagle": {},
           "eagle-static": dict(tree=Tree.full((2, 2))), "dflash": {}}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_drafter_drafts_within_the_automaton_and_the_bias(models, temperature):
    """The drafters steer their own logits (`decoding.extras.steered`): along every drafted path
    the automaton allows each token given the path before it, and a token banned by a bias of
    -100 is never drafted. Without the steering, the first steps of every drafter here draft
    forbidden tokens (the tiny drafters know nothing of the regex)."""
    from specjax.api.explain import explain
    target, draft = models
    automaton = _letters()
    banned = 4
    for name, extra in STEERED.items():
        method = _methods(target, draft)[name.removesuffix("-static")]["method"]
        steps = explain(target, PROMPT, dataclasses.replace(method, **extra),
                        SamplingParams(temperature=temperature, regex=automaton,
                                       logit_bias={banned: -100.0}),
                        steps=3, seed=1, eos_ids=EOS)
        state, paths = automaton.start, 0
        for step in steps:
            if hasattr(step, "nodes"):
                parent = {node: up for node, up, _ in step.nodes}
                token = {node: x for node, _, x in step.nodes}
                for node in token:
                    path, at = [], node
                    while at:
                        path.insert(0, token[at])
                        at = parent[at]
                    paths += 1
                    assert _walk(automaton, state, path) >= 0, (name, path)
                    assert banned not in path, (name, path)
            else:
                drafts = [d.token for d in step.drafts]
                paths += len(drafts)
                assert _walk(automaton, state, drafts) >= 0, (name, drafts)
                assert banned not in drafts, (name, drafts)
            state = _walk(automaton, state, step.new_tokens)
        assert paths > 0, name


SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"},
    "size": {"enum": ["small", "large"]}}, "required": ["name", "ok", "size"]}


def test_constrained_outputs_are_valid_and_every_method_agrees():
    import re
    import jsonschema
    target = specjax.load(WEIGHTS / "llama-target")
    draft = specjax.load(WEIGHTS / "llama-draft")
    drafter = specjax.load(WEIGHTS / "llama-eagle")
    prompts = ["def f(x):", "import os", "class A:", "# a note", "x = 1", "for i in"] * 2
    regex = r"(yes|no), [0-9]{2,3}( and [a-z]{1,5})?"
    sampled = generate(target, prompts,
                       sampling=SamplingParams(temperature=1.0, json_schema=[SCHEMA] * 6 + [None] * 6),
                       max_new_tokens=48, seed=list(range(12)))
    eos = set(target.config.eos_token_ids)
    ended = [(text, tokens) for text, tokens in zip(sampled.texts[:6], sampled.tokens[:6])
             if tokens and tokens[-1] in eos]
    assert len(ended) >= 4
    for text, _ in ended:
        jsonschema.validate(json.loads(text), SCHEMA)
    # Why each row ended: a row cut by the length limit says so (its text need not parse); a
    # constrained row that drew EOS did so after a complete document, which nothing may follow
    # (the schema's regex ends at the closing brace), so the constraint ended it; a free row
    # that drew EOS ended by it.
    for b, (tokens, reason) in enumerate(zip(sampled.tokens, sampled.finish_reasons)):
        stopped = bool(tokens) and tokens[-1] in eos
        assert reason == ("length" if not stopped else "constraint" if b < 6 else "eos"), b
    assert "constraint" in sampled.finish_reasons
    cut = generate(target, prompts,
                   sampling=SamplingParams(temperature=1.0, json_schema=[SCHEMA] * 6 + [None] * 6),
                   max_new_tokens=[8] * 6 + [48] * 6, seed=list(range(12)))  # one program
    assert cut.finish_reasons[:6] == ["length"] * 6 and cut.tokens[6:] == sampled.tokens[6:]
    for text in cut.texts[:6]:                      # cut short: no document, and it says so
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)
    free = generate(target, prompts[6:], sampling=SamplingParams(temperature=1.0),
                    max_new_tokens=48, seed=list(range(6, 12)))
    assert free.tokens == sampled.tokens[6:]            # free rows beside constrained ones
    matched = generate(target, prompts[:6],
                       sampling=SamplingParams(temperature=1.0, regex=regex),
                       max_new_tokens=24, seed=4)
    assert all(re.fullmatch(regex, text) for text, tokens in zip(matched.texts, matched.tokens)
               if tokens[-1] in eos)
    # Nothing can follow "... and " and five letters: such a row ended by the constraint; a
    # shorter match could have gone on, so a row that drew EOS there ended by "eos".
    for text, tokens, reason in zip(matched.texts, matched.tokens, matched.finish_reasons):
        closed = re.fullmatch(r"(yes|no), [0-9]{2,3} and [a-z]{5}", text)
        assert reason == ("length" if tokens[-1] not in eos else
                          "constraint" if closed else "eos"), (text, reason)
    # Greedy: every method gives each row the autoregressive tokens, constrained rows beside
    # free ones in one batch.
    mixed = [regex, None, regex]
    want = generate(target, prompts[:3],
                    sampling=SamplingParams(temperature=0.0, regex=mixed),
                    max_new_tokens=20)
    assert re.fullmatch(regex, want.texts[0]) and re.fullmatch(regex, want.texts[2])
    for options in (dict(method=specjax.Speculative(draft=draft, k=3)), dict(method='ngram'),
                    dict(method=specjax.Eagle(drafter=drafter)),
                    dict(method=specjax.Speculative(draft=draft, tree=Tree.full((2, 2))))):
        got = generate(target, prompts[:3],
                       sampling=SamplingParams(temperature=0.0, regex=mixed),
                       max_new_tokens=20, **options)
        assert got.tokens == want.tokens, options["method"]


def test_bad_constraints_are_named_errors(models):
    from specjax.sampling.constraints import ConstraintError, from_vocabulary
    target = specjax.load(WEIGHTS / "llama-target")
    for options, match in ((dict(regex="(unclosed"), "cannot be compiled"),
                           (dict(json_schema={"type": "object", "properties": 3}),
                            "json_schema cannot be compiled"),
                           (dict(json_schema="{not json"), "json_schema cannot be compiled"),
                           (dict(regex="a", json_schema=SCHEMA), "not both"),
                           (dict(regex="a", eos_ids=()), "needs an EOS id"),
                           (dict(regex=["a"]), "regex has 1 values for 2 prompts"),
                           (dict(regex=3), "regex must be a string")):
        with pytest.raises(GenerationError, match=match):
            eos = {"eos_ids": options.pop("eos_ids")} if "eos_ids" in options else {}
            generate(target, ["a", "b"], sampling=SamplingParams(**options), max_new_tokens=2,
                     **eos)
    with pytest.raises(GenerationError, match="no tokenizer"):
        generate(models[0], [PROMPT], sampling=SamplingParams(regex="a"), max_new_tokens=2)
    with pytest.raises(ConstraintError, match="no token of the vocabulary can continue"):
        from_vocabulary("z", LETTERS, V)
