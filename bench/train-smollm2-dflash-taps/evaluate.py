"""Tokens per target call of SmolLM2 DFlash drafters, greedy, 64 new tokens, exact counts: the
bench suite's prompts without long-code-editing (as bench/train-smollm2-dflash-first/ measured)
and the 10 held-out chat questions (`EVAL_QUESTIONS`), with acceptance by block position.

    PYTHONPATH=. python bench/train-smollm2-dflash-taps/evaluate.py NAME=DIR ... > OUT.json
"""
import json
import sys

import specjax
from specjax.bench.prompts import SUITE
from specjax.io import chat
from specjax.io.fetch import fetch
from specjax.train.prompts import EVAL_QUESTIONS

target = specjax.load(fetch("smollm2"))
sets = {"suite": [chat.encode(target, chat.render(target, p["prompt"])) if p.get("chat")
                  else p["prompt"] for p in SUITE["prompts"]
                  if p["category"] != "long-code-editing"],
        "questions": [chat.encode(target, chat.render(target, q)) for q in EVAL_QUESTIONS]}
rows = []
for argument in sys.argv[1:]:
    name, path = argument.split("=", 1)
    drafter = specjax.load(path)
    for prompts_name, prompts in sets.items():
        r = specjax.generate(target, prompts, method=specjax.DFlash(drafter=drafter),
                             sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=64)
        rows.append({"drafter": name, "prompts": prompts_name,
                     "tokens_per_target_call": round(r.stats.tokens_per_target_call, 3),
                     "acceptance_by_position": [None if a is None else round(float(a), 3)
                                                for a in r.stats.acceptance_by_position]})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
print(json.dumps(rows, indent=1))
