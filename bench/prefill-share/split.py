"""What a shared prefill program could save (issue 74, item 2): on SmolLM2, each method's
compile time of its prefill alone (`loop.programs(spec).init`) against its whole-generation
program (`run`), each in a fresh process with no persistent compilation cache.

    python bench/prefill-share/split.py > bench/prefill-share/split.json
"""

import json
import os
import subprocess
import sys
import time

CHILD = r"""
import json, sys, time
import specjax
from specjax.api.generate import prepare
from specjax.decoding import loop
from specjax.io.fetch import fetch
from specjax.presets import PRESETS, WEIGHTS
from specjax.sampling.logits import SamplingParams

method, part = sys.argv[1], sys.argv[2]
preset = PRESETS["smollm2"]
target = specjax.load(fetch("smollm2"))
weights = {"speculative": ("draft", preset.draft), "medusa": ("heads", preset.heads),
           "eagle": ("drafter", preset.drafter)}
options = {}
if method in weights:
    name, directory = weights[method]
    options[name] = specjax.load(WEIGHTS / directory)
built = specjax.api.methods.build_shared(method, **options)
ids = target.tokenizer.encode("def fibonacci(n):").ids
request = prepare(target, [ids], built, SamplingParams(temperature=0.0), max_new_tokens=64)
program = getattr(loop.programs(request.spec), part)
start = time.perf_counter()
lowered = program.lower(request.weights, *request.inputs)
lowered_s = time.perf_counter() - start
lowered.compile()
print(json.dumps({"method": method, "part": part, "lower_s": round(lowered_s, 2),
                  "compile_s": round(time.perf_counter() - start - lowered_s, 2)}))
"""

rows = []
for method in ("autoregressive", "speculative", "ngram", "medusa", "eagle"):
    for part in ("init", "run"):
        out = subprocess.run([sys.executable, "-c", CHILD, method, part], capture_output=True,
                             text=True, env={**os.environ, "SPECJAX_COMPILE_CACHE": "off"})
        if out.returncode:
            sys.exit(out.stderr)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(rows[-1], file=sys.stderr)
print(json.dumps(rows, indent=1))
