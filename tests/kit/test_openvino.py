"""OpenVINO GenAI as a client of specjax.testing (issue 86): the client's requests, answers and
errors without the engine (a fake engine that samples the exact law of the setting it is sent
stands in for the worker), and, where the engine's environment is installed
(`SPECJAX_OPENVINO_PYTHON`), its control and negative control."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from specjax import testing
from specjax.sampling.params import SamplingParams
from specjax.testing import clients, openvino
from specjax.testing.law import exact_law

T07_TOP_P = SamplingParams(0.7, top_p=0.9)


def law_engine(pair):
    """A stand-in for the worker: each request answered with `samples` draws from the target's
    exact law under the setting the request carries (not the one the check asked for), seeded by
    the request's first seed. What the client sends is what it gets sampled."""
    def engine(request):
        sent = request["sampling"]
        setting = SamplingParams(sent["temperature"], top_k=sent["top_k"], top_p=sent["top_p"],
                                 min_p=sent["min_p"])
        law = exact_law(pair.target, request["prompt"], setting, request["length"])
        rng = np.random.default_rng(request["first_seed"])
        cells = rng.choice(law.size, size=request["samples"], p=law / law.sum())
        digits = pair.vocab ** np.arange(request["length"] - 1, -1, -1)
        engine.requests.append(request)
        return {"tokens": (cells[:, None] // digits % pair.vocab).tolist(), "precision": "f32"}
    engine.requests = []
    return engine


def test_the_request_carries_the_mode_setting_prompt_and_seeds():
    sent = openvino.request(("t", "d"), "prompt-lookup", 3, "f32", False,
                            SamplingParams(0.8, top_k=4, min_p=0.05), np.array([1, 4, 2]),
                            length=3, samples=7, first_seed=70)
    assert sent == dict(target="t", draft="d", mode="prompt-lookup", k=3, precision="f32",
                        prefix_caching=False, prompt=[1, 4, 2], length=3, samples=7,
                        first_seed=70, sampling={"temperature": 0.8, "top_p": 1.0, "top_k": 4,
                                                 "min_p": 0.05})
    # An override replaces what is sent, not what the law is computed under.
    assert openvino.request(("t", "d"), "plain", 2, "f32", False, T07_TOP_P, [1], 3, 1, 0,
                            {"top_p": 1.0})["sampling"]["top_p"] == 1.0


def test_the_client_splits_requests_into_chunks_with_consecutive_seeds(monkeypatch):
    monkeypatch.setattr(openvino, "CHUNK", 4)
    pair = testing.pair()
    engine = law_engine(pair)
    out = openvino.openvino_sampler("draft", engine=engine)(
        pair, np.array(pair.prompt), 3, samples=10, length=3, sampling=SamplingParams(1.0))
    assert out.shape == (10, 3) and out.dtype == np.int64
    assert [(r["samples"], r["first_seed"]) for r in engine.requests] == [(4, 30), (4, 34),
                                                                         (2, 38)]


@pytest.mark.parametrize("tokens, message", [
    ([[0, 1, 2]] * 3, r"shape \(3, 3\)"), ([[0, 1, 6]] * 4, r"in \[0, 6\]"),
    ([[0, -1, 2]] * 4, r"in \[-1, 2\]")])
def test_an_answer_of_the_wrong_shape_or_range_is_an_error(tokens, message):
    with pytest.raises(RuntimeError, match=message):
        openvino.tokens_of({"tokens": tokens}, count=4, length=3, vocab=6)


def test_the_mechanics_on_a_law_engine_control_accepted_broken_request_rejected():
    # The client's path to the check, on the fake engine: the control (the setting sent as
    # asked) passes, and top-p left out of the request while the law keeps it is rejected.
    # 4,000 samples at T = 0.7 with top-p 0.9, each check at 0.005 (one family at 0.01); seed 0.
    pair = testing.pair()
    good = testing.check(openvino.openvino_sampler("plain", engine=law_engine(pair)),
                         sampling=T07_TOP_P, samples=4_000, level=0.005)
    bad = testing.check(openvino.openvino_sampler("plain", engine=law_engine(pair),
                                                  request_overrides={"top_p": 1.0}),
                        sampling=T07_TOP_P, samples=4_000, level=0.005)
    assert good.lossless, str(good)
    assert not bad.lossless, str(bad)


def test_a_missing_openvino_is_a_named_error_that_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.delenv(openvino.ENV, raising=False)
    with pytest.raises(openvino.OpenVINOMissing,
                       match=f"{openvino.ENV} is not set: .*pip install openvino-genai"):
        openvino.openvino_python()
    monkeypatch.setenv(openvino.ENV, str(tmp_path / "no-python"))
    with pytest.raises(openvino.OpenVINOMissing, match="is not an executable Python"):
        testing.check(openvino.openvino_sampler("plain"), samples=10)


def test_an_environment_without_openvino_is_named(monkeypatch):
    # A Python that runs but has no openvino-genai: this very one.
    monkeypatch.setenv(openvino.ENV, sys.executable)
    with pytest.raises(openvino.OpenVINOMissing, match="lacks openvino-genai"):
        openvino.engine_version()


@pytest.mark.parametrize("options, message", [
    (dict(mode="ngram"), "mode must be one of plain, draft, prompt-lookup"),
    (dict(k=0), r"k must be an integer in \[1, 8\]"), (dict(k=True), "k must be"),
    (dict(precision="bf16"), "precision must be one of f32, default"),
    (dict(prefix_caching=1), "prefix_caching must be True or False"),
    (dict(request_overrides={"seed": 1}), "unknown field 'seed'"),
    (dict(request_overrides=[1]), "request_overrides must be a dict"),
])
def test_openvino_sampler_refuses_bad_options(options, message):
    with pytest.raises(ValueError, match=message):
        openvino.openvino_sampler(**options)


def test_the_default_check_is_every_mode_at_one_setting():
    names = [e.name for e in clients.openvino_entries()]
    assert names == ["OpenVINO plain t1", "OpenVINO draft t1", "OpenVINO prompt-lookup t1"]
    full = clients.openvino_entries(settings=tuple(clients.OPENVINO_SETTINGS),
                                    pairs=tuple(testing.PAIRS), findings=True)
    assert len(full) == 3 * 3 * 2 + 3 and len({e.name for e in full}) == len(full)


@pytest.mark.parametrize("argv, message", [
    (["--openvino"], f"{openvino.ENV} is not set"),
    (["--openvino", "--openvino-samples", "0"], "--openvino-samples must be >= 1"),
    (["--openvino-full"], "--openvino-full needs --openvino"),
])
def test_the_command_line_names_what_openvino_lacks(argv, message, monkeypatch, capsys):
    from specjax.cli.main import main
    monkeypatch.delenv(openvino.ENV, raising=False)
    assert main(["check", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def _have_openvino() -> bool:
    try:
        return bool(openvino.engine_version())
    except openvino.OpenVINOMissing:
        return False


@pytest.mark.skipif(not _have_openvino(),
                    reason=f"no OpenVINO GenAI: set {openvino.ENV} (docs/conformance.md)")
def test_openvino_plain_sampling_passes_and_a_request_without_top_p_is_rejected():
    # The client's mechanics on the engine itself: plain sampling at T = 0.7 with top-p 0.9,
    # float32 (the control), is accepted; the same request with top-p left out while the law
    # keeps it (the negative control) is rejected. 4,000 samples each, one family at 0.01.
    good = testing.check(openvino.openvino_sampler("plain"), sampling=T07_TOP_P, samples=4_000,
                         level=0.005)
    bad = testing.check(openvino.openvino_sampler("plain", request_overrides={"top_p": 1.0}),
                        sampling=T07_TOP_P, samples=4_000, level=0.005)
    assert good.lossless, str(good)
    assert not bad.lossless, str(bad)


def test_the_command_line_announces_each_engine_check_before_its_row(monkeypatch, capsys):
    # `check --openvino` on the law engine in place of the worker: a "starting" line (the
    # check, its mode, setting, pair and sample size) comes before each check's row, one row
    # after each; the catalogue's own entries, run with them, get no such line.
    from types import SimpleNamespace
    from specjax.cli.main import main
    pair = testing.pair()
    monkeypatch.setattr(openvino, "engine_version", lambda: "fake")
    monkeypatch.setattr(openvino, "_files", lambda pair: ("target", "draft"))
    monkeypatch.setattr(openvino, "_worker", lambda: SimpleNamespace(ask=law_engine(pair)))
    names = [e.name for e in clients.openvino_entries()]
    assert main(["check", "--openvino", "--openvino-samples", "300",
                 "--only", "always-accept", *names]) == 0
    lines = capsys.readouterr().out.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("starting ")]
    assert len(starts) == len(names)
    for i, name in zip(starts, names):
        mode = name.split()[1]
        assert lines[i].startswith(f"starting {name}: OpenVINO GenAI's {mode} decoding; T=1, "
                                   f"pair close, 300 samples"), lines[i]
        assert lines[i + 1].startswith(name) and "client" in lines[i + 1]
    assert not any(line.startswith("starting always-accept") for line in lines)
    assert any(line.startswith("always-accept ") and "REJECTED" in line for line in lines)
