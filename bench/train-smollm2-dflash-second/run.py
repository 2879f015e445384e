"""Issue 63, item 5: the SmolLM2 DFlash drafter trained on half of data/eagle2 against the shipped
EAGLE drafter, in one process.

    PYTHONPATH=. python bench/train-smollm2-dflash-second/run.py DRAFTER_DIR OUT_DIR

1. Tokens per target call and acceptance by block position (DFlash) or depth (EAGLE) on the 10
   held-out chat questions (`specjax.train.prompts.EVAL_QUESTIONS`, in the chat template), 64 new
   tokens, at T = 0 and at T = 1 (seed 0): exact counts, not timings.
2. Tokens/s on the bench's quick prompts (one short prompt per category), greedy, 64 new tokens,
   float32 and bfloat16: DFlash (its whole block) and EAGLE (its own tree) in turn, one warm-up
   and three timed runs each, the median kept.
"""
import json
import statistics
import sys
import time
from pathlib import Path

import specjax
from specjax.bench.common import machine
from specjax.bench.prompts import SUITE
from specjax.io import chat
from specjax.io.fetch import fetch
from specjax.train.prompts import EVAL_QUESTIONS

drafter_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
EAGLE = Path(__file__).resolve().parents[2] / "weights" / "smollm2-eagle"
result = {"host": machine(None), "drafter": str(drafter_dir), "questions": [], "speed": []}


def encode(target, prompt):
    return (chat.encode(target, chat.render(target, prompt["prompt"])) if prompt.get("chat")
            else prompt["prompt"])


def stats_row(r):
    return {"tokens_per_target_call": round(r.stats.tokens_per_target_call, 3),
            "acceptance_by_position": [None if a is None else round(float(a), 3)
                                       for a in r.stats.acceptance_by_position]}


for dtype in ("float32", "bfloat16"):
    target = specjax.load(fetch("smollm2"), dtype=dtype)
    methods = {"dflash": dict(method=specjax.DFlash(drafter=specjax.load(drafter_dir))),
               "eagle": dict(method=specjax.Eagle(drafter=specjax.load(EAGLE)))}
    if dtype == "float32":
        questions = [chat.encode(target, chat.render(target, q)) for q in EVAL_QUESTIONS]
        for temperature in (0.0, 1.0):
            for name, options in methods.items():
                r = specjax.generate(target, questions,
                                     sampling=specjax.SamplingParams(temperature=temperature),
                                     max_new_tokens=64, seed=0, **options)
                row = {"method": name, "temperature": temperature, **stats_row(r)}
                result["questions"].append(row)
                print(json.dumps(row), flush=True)
    quick = [encode(target, p) for p in SUITE["prompts"] if p.get("quick")]
    times = {name: [] for name in methods}
    counts = {}
    for rep in range(4):                      # the first a warm-up
        for name, options in methods.items():
            tokens, calls, seconds = 0, 0, 0.0
            for prompt in quick:
                start = time.perf_counter()
                r = specjax.generate(target, [prompt],
                                     sampling=specjax.SamplingParams(temperature=0.0),
                                     max_new_tokens=64, **options)
                seconds += time.perf_counter() - start
                tokens += r.stats.new_tokens
                calls += r.stats.target_calls
            if rep:
                times[name].append(tokens / seconds)
            counts[name] = (tokens, calls)
    for name in methods:
        row = {"dtype": dtype, "method": name, "tokens_per_second":
               round(statistics.median(times[name]), 2),
               "runs": [round(t, 2) for t in times[name]],
               "tokens_per_target_call": round(counts[name][0] / counts[name][1], 3)}
        result["speed"].append(row)
        print(json.dumps(row), flush=True)
    eagle_speed = result["speed"][-1]["tokens_per_second"]
    result["speed"][-2]["vs_eagle"] = round(result["speed"][-2]["tokens_per_second"]
                                            / eagle_speed, 3)
out.mkdir(parents=True, exist_ok=True)
(out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
print(out / "result.json")
