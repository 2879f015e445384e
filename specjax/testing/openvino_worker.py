"""The OpenVINO GenAI side of `specjax.testing.openvino`, run by the engine's own Python
(optimum-intel pins a transformers that cannot share the kit's environment):
`python -I openvino_worker.py`.

It reads one request a line on stdin (JSON: the exported target and draft directories, the
mode, k, the precision, prefix caching, the setting, the prompt, the seeds) and answers each with
one JSON line on stdout: the sampled tokens and the inference precision the target's compiled
model ran at, or the error. Everything else the engine prints goes to stderr. One pipeline is
kept, for the last directories, mode, k, precision and prefix caching asked.

It imports openvino and openvino_genai, and nothing of specjax. Run it with `python -I`: its
directory also holds the client, `openvino.py`, which would shadow OpenVINO.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import numpy as np
import openvino
import openvino_genai as ov_genai

F32 = {"INFERENCE_PRECISION_HINT": "f32"}


def pipeline(request: dict):
    """A `ContinuousBatchingPipeline` on the CPU for the request's target and mode: a draft model
    (`draft`), prompt lookup (`prompt-lookup`) or neither (`plain`); float32 inference for the
    target and the draft unless the request asks for the plugin's default precision; prefix
    caching as asked (off unless asked: on, it breaks speculation)."""
    scheduler = ov_genai.SchedulerConfig()
    scheduler.enable_prefix_caching = bool(request["prefix_caching"])
    scheduler.cache_size = 1                       # GB of KV cache: the pairs are tiny
    precision = F32 if request["precision"] == "f32" else {}
    properties = dict(precision)
    if request["mode"] == "draft":
        properties["draft_model"] = ov_genai.draft_model(request["draft"], "CPU", **precision)
    elif request["mode"] == "prompt-lookup":
        properties["prompt_lookup"] = True
    return ov_genai.ContinuousBatchingPipeline(request["target"], scheduler, "CPU", properties)


def config(request: dict, seed: int):
    """The request's `GenerationConfig`: sampling at its setting with its own seed, exactly
    `length` new tokens through `ignore_eos` with `min_new_tokens = 0` (a positive minimum bans
    the exported tokenizer's EOS id, 2, which is a real token of the pairs), and the mode's
    drafting: `k` assistant tokens, or prompt lookup of up to k tokens after a 1-token match."""
    setting = request["sampling"]
    c = ov_genai.GenerationConfig()
    c.do_sample = True
    c.temperature = setting["temperature"]
    c.top_p = setting["top_p"]
    c.top_k = setting["top_k"]                     # 0: no top-k
    if setting["min_p"]:
        c.min_p = setting["min_p"]                 # an AttributeError where it has none
    c.rng_seed = seed
    c.max_new_tokens = request["length"]
    c.min_new_tokens = 0
    c.ignore_eos = True
    if request["mode"] != "plain":
        c.num_assistant_tokens = request["k"]
    if request["mode"] == "prompt-lookup":
        c.max_ngram_size = 1
    return c


def precision_of(request: dict) -> str:
    """The inference precision the CPU plugin compiles the target at, with the request's
    properties: f32 when asked, its own default otherwise (bf16 where the CPU has it)."""
    model = os.path.join(request["target"], "openvino_model.xml")
    compiled = openvino.Core().compile_model(model, "CPU",
                                             F32 if request["precision"] == "f32" else {})
    hint = compiled.get_property("INFERENCE_PRECISION_HINT")      # an openvino.Type
    return hint.to_string() if hasattr(hint, "to_string") else str(hint)


def sample(pipe, request: dict) -> dict:
    """`samples` continuations of the prompt, request i seeded `first_seed + i`."""
    n = request["samples"]
    prompt = openvino.Tensor(np.asarray([request["prompt"]], np.int64))   # [1, P]
    configs = [config(request, request["first_seed"] + i) for i in range(n)]
    results = pipe.generate([prompt] * n, configs)
    return {"tokens": [list(r.m_generation_ids[0]) for r in results]}


def serve(answers) -> None:
    """Answer requests until stdin closes."""
    pipe, key, precision = None, None, None
    answers.write(json.dumps({"version": ov_genai.__version__,
                              "openvino": openvino.__version__}) + "\n")
    answers.flush()
    for line in sys.stdin:
        request = json.loads(line)
        try:
            wanted = tuple(request[f] for f in ("target", "draft", "mode", "precision",
                                                "prefix_caching"))
            if wanted != key:
                pipe, key = None, None            # one pipeline at a time: free the last first
                pipe, key = pipeline(request), wanted
                precision = precision_of(request)
            answer = dict(sample(pipe, request), precision=precision)
        except Exception as e:                    # the client raises it; the log has the trace
            traceback.print_exc()
            answer = {"error": f"{type(e).__name__}: {e}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


def main() -> None:
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)                                 # the engine's prints go to stderr
    serve(answers)


if __name__ == "__main__":
    main()
