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

import numpy as np
import pytest

import specjax
from specjax import testing
from specjax.sampling.params import SamplingParams
from specjax.testing.law import pair as named_pair

llamacpp = pytest.importorskip("specjax.testing.llamacpp")
pytest.importorskip("xllamacpp", reason=llamacpp.INSTALL)
pytest.importorskip("gguf", reason="pip install gguf")

N, LENGTH = 6_000, 4


def test_the_pair_written_as_gguf_is_the_pair(tmp_path):
    pair = named_pair("close")
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
    with pytest.raises(ValueError, match="at most 32 tokens"):
        big = specjax.random_model(pair.target.config.replace(vocab_size=40), seed=1)
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
