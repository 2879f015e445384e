"""`python -m specjax bench --settings`: what a new sampling setting costs a running process.

For each method, on the suite's first code prompt: one `generate` call of one new token
compiles the program (temperature 0); then --reps rounds each time a call with the same setting
again and calls with a new one (temperature 0.7, top-p 0.9, min-p 0.05, another seed, another
max_new_tokens in the same bucket). A call of one new token is the time to the first token:
prefill and one step. Reported per method: the median time with the old setting, with each new
one, and their ratio (1.0: the new setting reuses the compiled program; a recompile shows as
seconds). Writes settings.json and settings.md to --out.
"""

from __future__ import annotations

import datetime
import statistics
import time

from specjax.api.checks import check_compatible, encode_prompts
from specjax.api.generate import generate
from specjax.bench.common import Progress, fmt, machine, write_report
from specjax.bench.prompts import SUITE
from specjax.api.generate import SAMPLING_FIELDS
from specjax.api.methods import TYPES, build_shared
from specjax.sampling.params import SamplingParams
from specjax.io.checkpoint import load
from specjax.presets import drafter_path, heads_path, model_paths

SCHEMA = "specjax.bench.settings/1"
# Each new setting, as generate's keywords over the old one (greedy, 1 token, seed 0).
NEW = {"temperature 0.7": dict(temperature=0.7), "top-p 0.9": dict(temperature=0.7, top_p=0.9),
       "min-p 0.05": dict(temperature=1.0, min_p=0.05), "seed 1": dict(seed=1),
       "max_new_tokens 2": dict(max_new_tokens=2)}


def models(args, wanted: list[str]):
    """The target; by method, what each wanted method reads beside it (`Method.loads`: the
    draft, heads or a drafter, None where not given); and the methods among `wanted` that what
    was loaded can run."""
    needs = {TYPES[m].loads for m in wanted}
    target_path, draft_path, _ = model_paths(args, "draft" in needs)
    target = load(target_path, dtype=args.dtype)
    draft = load(draft_path, dtype=args.dtype) if draft_path is not None else None
    if draft is not None:
        check_compatible(target, draft)
    heads_dir, _ = heads_path(args)
    drafter_dir, _ = drafter_path(args)
    found = {"draft": draft,
             "heads": load(heads_dir) if heads_dir is not None and "heads" in needs else None,
             # --drafter holds one kind or the other (EAGLE, DFlash)
             "drafter": load(drafter_dir) if drafter_dir is not None and "drafter" in needs
             else None}
    beside = {m: found[TYPES[m].loads] for m in wanted if TYPES[m].loads}
    methods = [m for m in wanted
               if not TYPES[m].loads or isinstance(beside[m], TYPES[m].kind())]
    return target, beside, methods


def draft_name(beside: dict) -> str | None:
    """The name of the draft model among what the methods read, if one was loaded."""
    return next((w.name for m, w in beside.items() if TYPES[m].loads == "draft" and w), None)


def method_object(method: str, beside: dict, k: int, **options):
    """The method's object for a bench run: k for a method that drafts a chain of k, what the
    method reads beside the target under its keyword, and `options` where it takes them."""
    entry = TYPES[method]
    if entry.chain:
        options["k"] = k
    if entry.loads:
        options[entry.loads] = beside[method]
    return build_shared(method, **options)


def run(args, settings: dict) -> int:
    target, beside, methods = models(args, settings["methods"])
    prompt = next(p for p in SUITE["prompts"] if not p.get("chat"))
    ids = encode_prompts(target, [prompt["prompt"]])[0]
    progress = Progress(len(methods) * (1 + settings["reps"] * (1 + len(NEW))))
    rows = []
    for method in methods:
        fixed = {}
        if "candidates" in TYPES[method].options() and not TYPES[method].chain:
            fixed["candidates"] = "top"  # a tree's default scheme follows the temperatures
        chosen = method_object(method, beside, settings["ks"][0], **fixed)

        def seconds(**change):
            law = {k: v for k, v in change.items() if k in SAMPLING_FIELDS}
            run = dict(dict(max_new_tokens=1, seed=0, eos_ids=()),
                       **{k: v for k, v in change.items() if k not in law})
            start = time.perf_counter()
            generate(target, [ids], chosen, SamplingParams(**dict(dict(temperature=0.0), **law)),
                     **run)
            progress.update(method)
            return time.perf_counter() - start

        first = seconds()
        times = {name: [] for name in ("same", *NEW)}
        for _ in range(settings["reps"]):
            times["same"].append(seconds())
            for name, change in NEW.items():
                times[name].append(seconds(**change))
        same = statistics.median(times["same"])
        rows.append({"method": method, "first_call_s": first, "same_s": same,
                     "new_s": {name: statistics.median(times[name]) for name in NEW},
                     "ratio": {name: statistics.median(times[name]) / same for name in NEW}})
    progress.close()
    results = {
        "schema": SCHEMA,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(None),
        "settings": dict(target=target.name, draft=draft_name(beside),
                         dtype=args.dtype, reps=settings["reps"], k=settings["ks"][0],
                         prompt=prompt["id"], prompt_tokens=len(ids)),
        "rows": rows,
    }
    write_report(args.out, "settings", results, lambda results, out: [], markdown)
    return 0


def markdown(results: dict) -> str:
    s = results["settings"]
    lines = [f"# Time to the first token after a settings change: {s['target']}", "",
             f"{results['created']} · {results['machine']['cpu_model']} · prompt {s['prompt']} "
             f"({s['prompt_tokens']} tokens) · one new token per call · medians of {s['reps']}",
             "", "| method | first call (compiles) | same setting | "
             + " | ".join(NEW) + " |", "|---|--:|--:|" + "--:|" * len(NEW)]
    for row in results["rows"]:
        lines.append(f"| {row['method']} | {fmt(row['first_call_s'], '.2f', ' s')} | "
                     f"{fmt(row['same_s'] * 1e3, '.1f', ' ms')} | " + " | ".join(
                         f"{fmt(row['new_s'][n] * 1e3, '.1f', ' ms')} "
                         f"({fmt(row['ratio'][n], '.2f', 'x')})" for n in NEW) + " |")
    return "\n".join(lines) + "\n"
