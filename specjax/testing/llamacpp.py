"""A real client: llama.cpp's own sampling and speculative decoding, run in process through
xllamacpp (its server's completion handler) on the pair written as GGUF files, as samplers
`check` can judge.

    report = testing.check(llamacpp_sampler("draft-probabilistic", k=2), length=4)

The pair is written with the `gguf` package's writer (`write_gguf`, on `io.gguf_write`), in the
layout llama.cpp's converter writes (q and k rows permuted for its RoPE), and specjax's own GGUF
reader loads the files back with the pair's logits (tests/kit/test_llamacpp.py). Their vocabulary is
the pair's V tokens, then three that only make the file a valid byte-level BPE vocabulary (a
merge, BOS and EOS): their embedding and output rows are zero, and every request bans them by
`logit_bias`, so llama.cpp samples from the pair's V tokens with the pair's probabilities. A
token's text is one byte, its id (GPT-2's byte alphabet), which is how a completion's text is
read back.

Every sampler stage but the setting's is switched off, and the chain is given in specjax's
order: temperature, then top-k, top-p and min-p (`sampling.logits`). One completion per sample,
each with its own seed. The modes (`MODES`): plain sampling, the control; a draft model
(DRAFT_SIMPLE) with greedy drafting, llama.cpp's default, where the target samples and a draft
token is kept while it matches; the same with `probabilistic` drafting (rejection sampling,
llama.cpp PR #27694); and n-gram lookup (NGRAM_SIMPLE). xllamacpp is optional: without it the
kit works and this client says what to install.
"""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

import numpy as np

from specjax.io.gguf_write import write_llama
from specjax.model.transformer import Model
from specjax.sampling.params import SamplingParams
from specjax.testing.law import Pair

__all__ = ["EXTRA_TOKENS", "MODES", "engine_version", "llamacpp_sampler", "write_gguf"]

MODES = ("plain", "draft-greedy", "draft-probabilistic", "ngram-simple")
EXTRA_TOKENS = 3           # a merge, BOS and EOS, past the pair's vocabulary; always banned
_BYTE_TOKENS = 33          # GPT-2's byte alphabet spells bytes 0-32 as chr(256 + byte)
INSTALL = "pip install xllamacpp (llama.cpp's server in process, prebuilt CPU wheels)"

def write_gguf(model: Model, path: str | Path) -> Path:
    """`model` (a float32 Llama of at most 32 tokens, such as a `Pair`'s) as a GGUF file that
    llama.cpp and `specjax.load` read, its vocabulary padded by `EXTRA_TOKENS` (module
    docstring)."""
    config = model.config
    if (config.arch != "llama" or config.tie_embeddings or config.qk_norm
            or config.dtype != "float32"):
        raise ValueError("write_gguf writes an untied float32 Llama without q/k norms")
    vocab = config.vocab_size
    if vocab + 1 > _BYTE_TOKENS:
        raise ValueError(f"write_gguf spells each token as one byte: at most "
                         f"{_BYTE_TOKENS - 1} tokens, got {vocab}")

    def vocabulary(writer):
        spelled = [chr(256 + i) for i in range(vocab)]
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("gpt-2")
        writer.add_token_list(spelled + [spelled[0] + spelled[1], "<s>", "</s>"])
        writer.add_token_types([1] * (vocab + 1) + [3, 3])      # normal; BOS and EOS: control
        writer.add_token_merges([f"{spelled[0]} {spelled[1]}"])
        writer.add_bos_token_id(vocab + 1)
        writer.add_eos_token_id(vocab + 2)
        writer.add_add_bos_token(False)

    return write_llama(model, path, vocabulary=vocabulary, pad_rows=EXTRA_TOKENS)


def _xllamacpp():
    try:        # an optional dependency: only this client needs it
        import xllamacpp
    except ImportError:
        raise ImportError(f"the llama.cpp client needs xllamacpp: {INSTALL}") from None
    return xllamacpp


def engine_version() -> str:
    """xllamacpp's version (it names the llama.cpp build it wraps)."""
    return str(getattr(_xllamacpp(), "__version__", "unknown"))


@functools.lru_cache(maxsize=2)
def _files(pair: Pair) -> tuple[str, str]:
    directory = Path(tempfile.mkdtemp(prefix="specjax-llamacpp-"))
    return (str(write_gguf(pair.target, directory / "target.gguf")),
            str(write_gguf(pair.draft, directory / "draft.gguf")))


@functools.lru_cache(maxsize=4)
def _server(pair: Pair, mode: str, k: int):
    """One in-process server per pair, mode and k: a slot, one thread (the model is tiny)."""
    xl = _xllamacpp()
    target, draft = _files(pair)
    params = xl.CommonParams()
    params.model.path = target
    params.n_ctx = 64
    params.n_parallel = 1
    params.warmup = False
    params.verbosity = -1
    for cpu in (params.cpuparams, params.cpuparams_batch):
        cpu.n_threads = 1
    kinds = xl.common_speculative_type
    if mode.startswith("draft-"):
        params.speculative.types = [kinds.COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE]
        drafting = params.speculative.draft
        drafting.mparams.path = draft
        drafting.n_max, drafting.n_min, drafting.p_min = k, 0, 0.0    # always draft k
        drafting.probabilistic = mode == "draft-probabilistic"
        for cpu in (drafting.cpuparams, drafting.cpuparams_batch):
            cpu.n_threads = 1
    elif mode == "ngram-simple":      # the last token looked up, the k after its match drafted
        params.speculative.types = [kinds.COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE]
        lookup = params.speculative.ngram_simple
        lookup.size_n, lookup.size_m, lookup.min_hits = 1, k, 1
    return xl.Server(params)


def _request(prompt, length: int, seed: int, sampling: SamplingParams, vocab: int) -> dict:
    """A completion of `length` tokens under `sampling` alone: every other stage neutral."""
    return {"prompt": [int(t) for t in prompt], "n_predict": length, "seed": seed,
            "temperature": float(sampling.temperature), "top_k": int(sampling.top_k),
            "top_p": float(sampling.top_p), "min_p": float(sampling.min_p),
            "samplers": ["temperature", "top_k", "top_p", "min_p"],
            "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
            "dry_multiplier": 0.0, "typical_p": 1.0, "xtc_probability": 0.0,
            "top_n_sigma": -1.0, "mirostat": 0, "dynatemp_range": 0.0, "n_probs": 0,
            "logit_bias": [[vocab + i, False] for i in range(EXTRA_TOKENS)],
            "cache_prompt": False, "stream": False}


def llamacpp_sampler(mode: str = "draft-probabilistic", k: int = 2, name: str | None = None):
    """A sampler running llama.cpp's completion in `mode` (`MODES`), drafting up to `k` tokens
    a step where it drafts. A request of L tokens drafts at most L - 1 of them (its first token
    comes from the prompt's evaluation): check with length k + 2 or more to exercise k."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")

    def sampler(pair, prompt, seed, *, samples, length, sampling: SamplingParams):
        server = _server(pair, mode, k)
        out = np.empty((samples, length), np.int32)
        drafted = accepted = 0
        for i in range(samples):
            reply = server.handle_completions(
                _request(prompt, length, seed * samples + i, sampling, pair.vocab))
            if isinstance(reply, str):
                reply = json.loads(reply)
            if "choices" not in reply:
                raise RuntimeError(f"llama.cpp refused the request: {reply}")
            ids = [ord(c) for c in reply["choices"][0]["text"]]      # a token is its byte
            if len(ids) != length or max(ids) >= pair.vocab:
                raise RuntimeError(f"llama.cpp returned {ids!r} for {length} tokens of a "
                                   f"{pair.vocab}-token vocabulary")
            out[i] = ids
            timings = reply.get("timings", {})
            drafted += timings.get("draft_n", 0)
            accepted += timings.get("draft_n_accepted", 0)
        sampler.drafted, sampler.accepted = drafted, accepted
        return out

    sampler.__name__ = name or f"llama.cpp {mode}" + (f" k={k}" if mode != "plain" else "")
    sampler.drafted = sampler.accepted = 0
    return sampler

