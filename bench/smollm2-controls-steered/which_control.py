"""Which control costs EAGLE its acceptance: SmolLM2 greedy, the bench suite's prompts but
long-code-editing, 64 new tokens, EAGLE's own tree; tokens per target call (exact) with no
control, the bench's controls, those without the repetition penalty, and the repetition penalty
alone. Each run is checked against autoregressive decoding under the same controls.

    PYTHONPATH=. python bench/smollm2-controls-steered/which_control.py
"""
import specjax
from specjax.io.fetch import fetch
from specjax.io import chat
from specjax.bench.prompts import SUITE
target = specjax.load(fetch("smollm2"))
eagle = specjax.load("/work/main/weights/smollm2-eagle")
prompts = [chat.encode(target, chat.render(target, p["prompt"])) if p.get("chat") else p["prompt"]
           for p in SUITE["prompts"] if p["category"] != "long-code-editing"]
bias = {i: -1.0 for i in range(100, 116)}
for name, c in [("plain", {}), ("all", dict(repetition_penalty=1.1, presence_penalty=0.2, frequency_penalty=0.2, logit_bias=bias)),
                ("no-repetition", dict(presence_penalty=0.2, frequency_penalty=0.2, logit_bias=bias)),
                ("repetition-only", dict(repetition_penalty=1.1))]:
    sampling = specjax.SamplingParams(temperature=0.0, **c)
    r = specjax.generate(target, prompts, specjax.Eagle(eagle), sampling, max_new_tokens=64)
    a = specjax.generate(target, prompts, sampling=sampling, max_new_tokens=64)
    assert r.tokens == a.tokens, name
    print(name, round(r.stats.tokens_per_target_call, 3), flush=True)
