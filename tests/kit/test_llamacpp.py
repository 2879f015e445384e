"""The llama.cpp client of the lossless check (`specjax.testing.llamacpp`, issue 75).

The pair written as GGUF is the pair: specjax's GGUF reader loads both files back with the
pair's logits to the bit, and the padding tokens score 0 (banned by every request). Each of
the client's modes, run through llama.cpp's in-process server, is judged by `check` at T = 1 on
continuations of 4 tokens (a draft of k = 2 fits); the draft modes must really draft. Level:
the kit's, 0.01 family-wise over a check's five tests; N = 6,000 a mode, at which the check sees
a KL of about 0.08 nats (the full-size runs, 50,000 a setting, are `python -m specjax check
--llama-cpp`, recorded in docs/conformance.md). Negative control: the same engine sampling at
T = 0.8 where the law is T = 1 is rejected at the same size and seed.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

import specjax
from specjax import testing
from specjax.io.checkpoint import random_model
from specjax.sampling.params import SamplingParams
from specjax.testing.law import pair as named_pair

llamacpp = pytest.importorskip("specjax.testing.llamacpp")
pytest.importorskip("xllamacpp", reason=llamacpp.INSTALL)
pytest.importorskip("gguf", reason="pip install gguf")

N, LENGTH = 6_000, 4


@pytest.mark.parametrize("name", ["close", "wide"])
def test_the_pair_written_as_gguf_is_the_pair(tmp_path, name):
    pair = named_pair(name)
    prompt = np.asarray([list(pair.prompt) + [3, 0, 5]], np.int32)
    positions = np.arange(prompt.shape[1])[None]
    for name, model in (("target", pair.target), ("draft", pair.draft)):
        loaded = specjax.load(llamacpp.write_gguf(model, tmp_path / f"{name}.gguf"))
        assert loaded.config.vocab_size == pair.vocab + llamacpp.EXTRA_TOKENS
        want, _ = specjax.forward(model.params, model.config, prompt, positions)
        got, _ = specjax.forward(loaded.params, loaded.config, prompt, positions)
        got = np.asarray(got)
        np.testing.assert_array_equal(got[..., :pair.vocab], np.asarray(want), err_msg=name)
        np.testing.assert_array_equal(got[..., pair.vocab:], 0.0, err_msg=name)
    if name == "wide":
        return
    with pytest.raises(ValueError, match="at most 32 tokens"):
        big = random_model(pair.target.config.replace(vocab_size=40), seed=1)
        llamacpp.write_gguf(big, tmp_path / "big.gguf")


@pytest.mark.parametrize("mode", llamacpp.MODES)
def test_each_mode_samples_the_target_law(mode):
    sampler = llamacpp.llamacpp_sampler(mode, k=2)
    report = testing.check(sampler, samples=N, length=LENGTH, sampling=SamplingParams(1.0))
    assert report.lossless, report
    if mode != "plain":            # the mode drafted, and llama.cpp kept some drafts
        assert sampler.drafted >= N // 2 and 0 < sampler.accepted < sampler.drafted, (
            sampler.drafted, sampler.accepted)


def test_the_engine_at_another_temperature_is_rejected():
    plain = llamacpp.llamacpp_sampler("plain")

    def cooler(pair, prompt, seed, *, samples, length, sampling):
        return plain(pair, prompt, seed, samples=samples, length=length,
                     sampling=sampling.replace(temperature=0.8))

    report = testing.check(cooler, samples=N, length=LENGTH, sampling=SamplingParams(1.0))
    assert not report.lossless, report


def test_the_command_line_checks_llama_cpp(capsys):
    from specjax.cli.main import main
    assert main(["check", "--llama-cpp", "--only", "llama.cpp plain t1",
                 "--llama-cpp-samples", "2000"]) == 0
    out = capsys.readouterr().out
    assert "llama.cpp: xllamacpp " in out and "llama.cpp plain t1" in out and "lossless" in out
    assert main(["check", "--llama-cpp", "--llama-cpp-samples", "0"]) == 2


def test_the_wide_pair_drafts_past_llama_cpps_top_10():
    # What the wide pair is for: llama.cpp's draft sampler keeps its draft's 10 likeliest
    # tokens, so the draft must put real mass past them, at the prompt and after it.
    pair = named_pair("wide")
    assert pair.vocab == 32
    prompt = np.asarray([pair.prompt], np.int32)
    logits, _ = specjax.forward(pair.draft.params, pair.draft.config, prompt,
                                np.arange(prompt.shape[1])[None])
    p = np.sort(np.asarray(jax.nn.softmax(logits[0], axis=-1)), axis=-1)[:, ::-1]
    assert p[-1, 10:].sum() > 0.15, p[-1, 10:].sum()
    assert np.median(p[:, 10:].sum(axis=-1)) > 0.15


def test_the_wide_pair_control_and_drafting():
    # Plain sampling of the wide pair is accepted (the control) at 3 tokens, and probabilistic
    # drafting does draft there (its verdict, at 50,000 samples, is docs/conformance.md's).
    report = testing.check(llamacpp.llamacpp_sampler("plain"), pair="wide", samples=N, length=3,
                           sampling=SamplingParams(1.0))
    assert report.lossless, report
    sampler = llamacpp.llamacpp_sampler("draft-probabilistic", k=2)
    sampler(named_pair("wide"), np.asarray(named_pair("wide").prompt), 0, samples=200, length=3,
            sampling=SamplingParams(1.0))
    assert sampler.drafted >= 200 and 0 < sampler.accepted < sampler.drafted


def test_the_smollm2_draft_written_as_gguf_and_the_identity_rows(tmp_path):
    # The draft llama.cpp's draft-simple mode runs in the greedy-identity check (issue 75): the
    # shipped SmolLM2 draft written with SmolLM2's own GGUF's tokenizer (`io.gguf_write`), which
    # specjax's reader loads back with the draft's logits to the bit. Then the identity rows'
    # mechanics on llama.cpp: Q8_0 n-gram lookup over the check's prompts, 16 tokens each.
    from specjax.io.fetch import fetch, source_gguf
    from specjax.io.gguf_write import write_llama
    from specjax.testing import identity
    source = source_gguf(fetch("smollm2"))
    draft = specjax.load(Path(__file__).resolve().parents[2] / "weights" / "smollm2-draft")
    loaded = specjax.load(write_llama(draft, tmp_path / "draft.gguf", like=source))
    assert loaded.config.vocab_size == draft.config.vocab_size and loaded.config.tie_embeddings
    ids = np.asarray([draft.tokenizer.encode("def add(a, b):\n    return").ids])
    assert loaded.tokenizer.encode("def add(a, b):\n    return").ids == list(ids[0])
    positions = np.arange(ids.shape[1])[None]
    want, _ = specjax.forward(draft.params, draft.config, ids, positions)
    got, _ = specjax.forward(loaded.params, loaded.config, ids, positions)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    rows = identity.llamacpp_rows(["Q8_0"], ["ngram-simple"], tokens=16)
    assert [(r.engine, r.method) for r in rows] == [("llama.cpp Q8_0", "ngram-simple k=4")]
    assert len(rows[0].first) == sum(map(len, identity.PROMPTS.values()))


def test_the_default_check_is_every_mode_at_t1_and_full_is_the_table(capsys):
    # Issue 86, item 5: `--llama-cpp` answers in minutes (every mode at T = 1, the suite's pair,
    # at a size that sees a KL of about 5e-3); `--llama-cpp-full` is the recorded table.
    from specjax.cli.main import main
    from specjax.testing import clients
    quick = clients.llamacpp_entries()
    assert [e.name for e in quick] == [f"llama.cpp {m} t1" for m in llamacpp.MODES]
    assert {e.samples for e in quick} == {clients.LLAMACPP_QUICK_SAMPLES}
    assert len(clients.llamacpp_entries(full=True)) == 33
    assert main(["check", "--llama-cpp-full"]) == 2
    assert "--llama-cpp-full needs --llama-cpp" in capsys.readouterr().err
