"""`python -m specjax bench --controls`: what penalties, a logit bias and a JSON schema cost a
decoding run.

For each method (autoregressive, and those of --methods that the models allow), on each of the
suite's prompts but the long-code-editing one: a run without controls, a run with a repetition
penalty of 1.1, presence and frequency penalties of 0.2 and a logit bias on 16 ids, and a run
constrained to a small JSON schema (`JSON_SCHEMA`; it stops at an EOS id once complete), each
--warmup times untimed and then --reps times in turn (plain, controlled, JSON, plain, ...), so
that they see the same state of the host. Reported per method: the median tokens/s of each, the
tokens per target call of each (the controls change the text, so the calls can differ too), the
time of a target call (a step) with and without the penalties (their own cost), and the JSON
run's tokens/s against autoregressive decoding's under the same schema. Writes controls.json
and controls.md to --out.
"""

from __future__ import annotations

import datetime
import statistics

from specjax.api.checks import encode_prompts
from specjax.api.generate import generate, prepare
from specjax.bench.common import Progress, fmt, machine, write_report
from specjax.bench.prompts import SUITE
from specjax.bench.settings import draft_name, method_object, models
from specjax.sampling.params import SamplingParams
from specjax.io import chat

SCHEMA = "specjax.bench.controls/1"
CONTROLS = dict(repetition_penalty=1.1, presence_penalty=0.2, frequency_penalty=0.2,
                logit_bias={i: -1.0 for i in range(100, 116)})
# The constrained runs: a small record, each row's output one such JSON document (they stop at
# the target's EOS ids once it is complete).
JSON_SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 40}, "year": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
    "done": {"type": "boolean"}}, "required": ["title", "year", "tags", "done"]}
VARIANTS = {"plain": dict(run=dict(eos_ids=())),
            "controls": dict(sampling=CONTROLS, run=dict(eos_ids=())),
            "json": dict(sampling=dict(json_schema=JSON_SCHEMA))}


def run(args, settings: dict) -> int:
    target, beside, methods = models(args, settings["methods"])
    prompts = [p for p in SUITE["prompts"] if p["category"] != "long-code-editing"]
    texts = [chat.render(target, p["prompt"]) if p.get("chat") and target.chat_template
             else p["prompt"] for p in prompts]
    ids = encode_prompts(target, texts)
    runs = settings["warmup"] + settings["reps"]
    progress = Progress(len(methods) * len(ids) * len(VARIANTS) * runs)
    rows = []
    for method in methods:
        chosen = method_object(method, beside, settings["ks"][-1])
        law = dict(temperature=settings["temperature"], top_p=settings["top_p"])
        seconds = {name: [] for name in VARIANTS}
        tokens = dict.fromkeys(VARIANTS, 0)
        calls = dict.fromkeys(VARIANTS, 0)
        for prompt in ids:
            requests = {name: prepare(target, [prompt], chosen,
                                      SamplingParams(**law, **variant.get("sampling", {})),
                                      max_new_tokens=settings["max_new_tokens"],
                                      **variant.get("run", {}))
                        for name, variant in VARIANTS.items()}
            per_prompt = {name: [] for name in VARIANTS}
            for i in range(runs):
                for name, request in requests.items():
                    result = generate(request.reseeded(settings["seed"] + i))
                    progress.update(method)
                    if i >= settings["warmup"]:
                        per_prompt[name].append(result.stats.run_s)
                        tokens[name] += result.stats.new_tokens
                        calls[name] += result.stats.target_calls
            for name in seconds:
                seconds[name].append(statistics.median(per_prompt[name]))
        rate = {name: tokens[name] / settings["reps"] / sum(seconds[name]) for name in seconds}
        per_call = {name: sum(seconds[name]) / (calls[name] / settings["reps"])
                    for name in seconds}
        rows.append({"method": method, "tokens_per_second": rate,
                     "ratio": rate["controls"] / rate["plain"],
                     "json_ratio": rate["json"] / rate["plain"],
                     "seconds_per_target_call": per_call,
                     "call_ratio": per_call["controls"] / per_call["plain"],
                     "tokens_per_target_call": {n: tokens[n] / calls[n] for n in tokens}})
    progress.close()
    results = {
        "schema": SCHEMA,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(None),
        "settings": dict(target=target.name,
                         draft=draft_name(beside),
                         dtype=args.dtype, reps=settings["reps"], warmup=settings["warmup"],
                         k=settings["ks"][-1], max_new_tokens=settings["max_new_tokens"],
                         temperature=settings["temperature"], top_p=settings["top_p"],
                         prompts=[p["id"] for p in prompts],
                         controls={k: (v if k != "logit_bias" else f"-1 on ids {min(v)}-{max(v)}")
                                   for k, v in CONTROLS.items()}, json_schema=JSON_SCHEMA),
        "rows": rows,
    }
    write_report(args.out, "controls", results, lambda results, out: [], markdown)
    return 0


def markdown(results: dict) -> str:
    s = results["settings"]
    lines = [f"# What penalties and a logit bias cost: {s['target']} ({s['dtype']})", "",
             f"{results['created']} · {results['machine']['cpu_model']} · "
             f"{len(s['prompts'])} prompts · {s['max_new_tokens']} new tokens · temperature "
             f"{s['temperature']} · medians of {s['reps']} runs a prompt, plain and controlled "
             f"in turn · controls: {s['controls']}", "",
             "| method | tokens/s plain | tokens/s controlled | ratio | ms a step plain | "
             "ms a step controlled | ratio | tokens/call plain | tokens/call controlled | "
             "tokens/s JSON | tokens/call JSON | JSON vs autoregressive JSON |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    base = {row["method"]: row["tokens_per_second"]["json"] for row in results["rows"]}
    for row in results["rows"]:
        r, c = row["tokens_per_second"], row["tokens_per_target_call"]
        t = row["seconds_per_target_call"]
        lines.append(f"| {row['method']} | {fmt(r['plain'], '.1f')} | "
                     f"{fmt(r['controls'], '.1f')} | {fmt(row['ratio'], '.3f', 'x')} | "
                     f"{fmt(t['plain'] * 1e3, '.2f')} | {fmt(t['controls'] * 1e3, '.2f')} | "
                     f"{fmt(row['call_ratio'], '.3f', 'x')} | "
                     f"{fmt(c['plain'], '.2f')} | {fmt(c['controls'], '.2f')} | "
                     f"{fmt(r['json'], '.1f')} | {fmt(c['json'], '.2f')} | "
                     f"{fmt(r['json'] / base['autoregressive'], '.2f', 'x')} |")
    return "\n".join(lines) + "\n"
