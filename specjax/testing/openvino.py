"""A real client: OpenVINO GenAI's sampling and speculative decoding (on the CPU) as samplers
`check` can judge.

    report = testing.check(openvino_sampler("draft", k=2), samples=20_000)

OpenVINO GenAI runs in a virtual environment of its own, in a subprocess
(`openvino_worker.py`): optimum-intel, which exports the pair, pins a transformers below 5.6.
`SPECJAX_OPENVINO_PYTHON` names that environment's Python; without it, or where it has no
openvino-genai, the client raises `OpenVINOMissing`, which says what to install, and the rest
of the kit works as before.

The pair is written as two Hugging Face checkpoints and exported to OpenVINO IR by optimum-intel
at float32 (`optimum-cli export openvino --weight-format fp32`), once: the export is cached
under `~/.cache/specjax/openvino/<hash of the checkpoints>` (`SPECJAX_OPENVINO_CACHE` moves it).
Samples come from `ContinuousBatchingPipeline` on the CPU, float32 inference for the target and
the draft (`INFERENCE_PRECISION_HINT=f32`; `precision="default"` leaves the plugin's own, which
is a finding), prefix caching off (`prefix_caching=True` turns it on, another finding), token-id
prompts, one request per sample with its own seed (`seed * samples + i`), `ignore_eos` with
`min_new_tokens=0` and exactly `length` new tokens. The modes (`MODES`): plain sampling, the
control; a draft model (`num_assistant_tokens = k`); prompt lookup (a 1-token match, up to k
tokens).
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import numbers
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from specjax.io import checkpoint
from specjax.sampling.params import SamplingParams
from specjax.testing.engine_worker import EngineWorker, engine_python, installed_versions
from specjax.testing.law import Pair

__all__ = ["ENV", "MODES", "OpenVINOMissing", "PRECISIONS", "engine_version",
           "openvino_sampler", "request"]

ENV = "SPECJAX_OPENVINO_PYTHON"
CACHE_ENV = "SPECJAX_OPENVINO_CACHE"
MODES = ("plain", "draft", "prompt-lookup")
PRECISIONS = ("f32", "default")
CHUNK = 5_000              # requests a call of the worker: bounded memory, a steady pace
WORKER = Path(__file__).resolve().parent / "openvino_worker.py"
INSTALL = (f"python3 -m venv ENV && ENV/bin/pip install openvino-genai "
           f"'optimum-intel[openvino]' (and ENV/bin/pip uninstall -y torchvision if its import "
           f"breaks), then set {ENV}=ENV/bin/python")


class OpenVINOMissing(ImportError):
    """No OpenVINO GenAI to run: the message says what to install."""


def openvino_python() -> str:
    """The Python of OpenVINO GenAI's environment (`SPECJAX_OPENVINO_PYTHON`), checked to
    exist."""
    return engine_python(ENV, OpenVINOMissing, "the OpenVINO client runs OpenVINO GenAI in its "
                         "own virtual environment (optimum-intel pins a transformers this one "
                         "cannot share)", INSTALL)


def engine_version() -> str:
    """openvino-genai's version in its environment (read from its metadata, without importing
    it)."""
    return _version(openvino_python())


@functools.lru_cache(maxsize=4)
def _version(python: str) -> str:
    found = installed_versions(python, "openvino-genai", "optimum-intel")
    if found is None:
        raise OpenVINOMissing(f"{ENV}={python!r} lacks openvino-genai or optimum-intel: "
                              f"{INSTALL}")
    return found[0]


def _cache() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache/specjax/openvino")


@functools.lru_cache(maxsize=4)
def _files(pair: Pair) -> tuple[str, str]:
    """The pair exported to OpenVINO IR at float32: the target's and the draft's directories,
    exported once per pair (keyed by the checkpoints' bytes) and cached."""
    source = Path(tempfile.mkdtemp(prefix="specjax-openvino-"))
    digest = hashlib.sha256()
    for role in ("target", "draft"):
        checkpoint.save(getattr(pair, role), source / role)
        for file in sorted((source / role).iterdir()):
            digest.update(file.name.encode() + file.read_bytes())
    out = _cache() / digest.hexdigest()[:16]
    cli = str(Path(openvino_python()).parent / "optimum-cli")
    for role in ("target", "draft"):
        if not (out / role / "openvino_model.xml").exists():
            done = subprocess.run([cli, "export", "openvino", "--model", str(source / role),
                                   "--task", "text-generation-with-past", "--weight-format",
                                   "fp32", str(out / role)], capture_output=True, text=True)
            if done.returncode:
                tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
                raise RuntimeError(f"optimum-cli could not export the pair's {role} "
                                   f"({source / role}):\n{tail}")
    return str(out / "target"), str(out / "draft")


_WORKERS: list[EngineWorker] = []


def _worker() -> EngineWorker:
    """The running worker, started on first use (and again if it ended)."""
    if not _WORKERS or _WORKERS[0].process.poll() is not None:
        _WORKERS[:] = [EngineWorker("OpenVINO GenAI", [openvino_python(), "-I", str(WORKER)],
                                    dict(os.environ))]
    return _WORKERS[0]


atexit.register(lambda: [w.close() for w in _WORKERS])


def request(pair_files: tuple[str, str], mode: str, k: int, precision: str,
            prefix_caching: bool, sampling: SamplingParams, prompt, length: int, samples: int,
            first_seed: int, overrides: dict | None = None) -> dict:
    """The worker's request: the setting as the law has it, with `overrides` replacing fields
    of what is sent (the negative control)."""
    setting = {"temperature": float(sampling.temperature), "top_p": float(sampling.top_p),
               "top_k": int(sampling.top_k), "min_p": float(sampling.min_p),
               **(overrides or {})}
    return dict(target=pair_files[0], draft=pair_files[1], mode=mode, k=k, precision=precision,
                prefix_caching=prefix_caching, sampling=setting,
                prompt=[int(t) for t in prompt], length=length, samples=samples,
                first_seed=first_seed)


def tokens_of(answer: dict, count: int, length: int, vocab: int) -> np.ndarray:
    """The answer's tokens, [count, length], checked in shape and range."""
    tokens = np.asarray(answer["tokens"], np.int64)
    if tokens.shape != (count, length) or tokens.min() < 0 or tokens.max() >= vocab:
        raise RuntimeError(f"OpenVINO GenAI returned tokens of shape {tokens.shape} in "
                           f"[{tokens.min()}, {tokens.max()}] for {count} x {length} of a "
                           f"{vocab}-token vocabulary")
    return tokens


def _validate(mode, k, precision, prefix_caching, request_overrides) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 1 <= k <= 8:
        raise ValueError(f"k must be an integer in [1, 8], got {k!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if not isinstance(prefix_caching, bool):
        raise ValueError(f"prefix_caching must be True or False, got {prefix_caching!r}")
    if request_overrides is not None and not isinstance(request_overrides, dict):
        raise ValueError(f"request_overrides must be a dict, got {request_overrides!r}")
    unknown = set(request_overrides or {}) - {"temperature", "top_p", "top_k", "min_p"}
    if unknown:
        raise ValueError(f"request_overrides: unknown field {sorted(unknown)[0]!r}")


def openvino_sampler(mode: str = "draft", k: int = 2, precision: str = "f32",
                     prefix_caching: bool = False, name: str | None = None,
                     request_overrides: dict | None = None, engine=None):
    """A sampler running OpenVINO GenAI in `mode` (`MODES`), drafting `k` tokens a step where
    it drafts, at `precision` (`PRECISIONS`: float32, or the plugin's default) and with or
    without prefix caching. `request_overrides` replaces fields of the setting sent to the
    engine (temperature, top_p, top_k, min_p) while the law keeps the asked one: the client's
    negative control ({"top_p": 1.0} leaves top-p out of the request). `engine`, a function of
    a request returning an answer, stands in for the worker (tests without OpenVINO)."""
    _validate(mode, k, precision, prefix_caching, request_overrides)

    def sampler(pair, prompt, seed, *, samples, length, sampling: SamplingParams):
        files = ("target", "draft") if engine else _files(pair)
        ask = engine or _worker().ask
        out = np.empty((samples, length), np.int64)
        for start in range(0, samples, CHUNK):
            count = min(CHUNK, samples - start)
            answer = ask(request(files, mode, k, precision, prefix_caching, sampling, prompt,
                                 length, count, seed * samples + start, request_overrides))
            out[start:start + count] = tokens_of(answer, count, length, pair.vocab)
            sampler.precision = answer.get("precision", "unknown")
        sampler.version = _WORKERS[0].version if _WORKERS and not engine else "fake"
        return out

    sampler.__name__ = name or (f"OpenVINO {mode}" + (f" k={k}" if mode != "plain" else "")
                                + (" default-precision" if precision == "default" else "")
                                + (" prefix-caching" if prefix_caching else ""))
    sampler.precision = None
    return sampler
