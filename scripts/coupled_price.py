"""The coupled rule's price: tokens per target call (and tokens/s) under Algorithm 2 and under the
coupled rule, side by side in one run, for each method on SmolLM2-135M-Instruct at T = 0.7 with
top-p 0.9 and at T = 1, over the bench's prompts (code completion, code editing, prose and chat;
not the long module), each prompt with its own seed.

    python scripts/coupled_price.py [--dtype float32] [--tokens 64] [--out bench/coupled-price]

Each (method, setting, rule) is compiled once by a first run, then every prompt is generated
once; tokens per call is new tokens over target calls summed over the prompts, tokens/s new
tokens over the summed run time. Writes results.json and a table (table.txt) to --out, a line
per finished row, so a stopped run keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import specjax
from specjax.api.generate import release_programs
from specjax.bench.common import machine
from specjax.bench.prompts import PROMPTS
from specjax.io import chat
from specjax.io.fetch import fetch
from specjax.presets import PRESETS, WEIGHTS
from specjax.sampling.params import SamplingParams

SETTINGS = {"T=0.7 top-p 0.9": SamplingParams(temperature=0.7, top_p=0.9),
            "T=1": SamplingParams(temperature=1.0)}


def methods(target) -> dict:
    preset = PRESETS["smollm2"]
    draft = specjax.load(WEIGHTS / preset.draft, dtype=target.config.dtype)
    drafter = specjax.load(WEIGHTS / preset.drafter)
    heads = specjax.load(WEIGHTS / preset.heads)
    return {"speculative k=4": specjax.Speculative(draft, k=4),
            "ngram (default)": specjax.NGram(),
            "medusa (its tree)": specjax.Medusa(heads),
            "eagle (default)": specjax.Eagle(drafter),
            "eagle (its tree)": specjax.Eagle(drafter, tree=drafter.tree)}


def prompt_ids(target) -> list[list[int]]:
    out = []
    for p in PROMPTS:
        if p["category"] == "long-code-editing":
            continue
        out.append(chat.encode(target, chat.render(target, p["prompt"])) if p.get("chat")
                   else list(target.tokenizer.encode(p["prompt"]).ids))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", default="bench/coupled-price")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = specjax.load(fetch("smollm2"), dtype=args.dtype)
    prompts = prompt_ids(target)
    # Resumes: rows already in results.json are kept, not measured again.
    done = json.loads((out / "results.json").read_text())["rows"] if (
        out / "results.json").exists() else []
    rows = list(done)
    host = machine(None)["cpu_model"]
    header = (f"SmolLM2-135M-Instruct {args.dtype}, {len(prompts)} bench prompts, "
              f"{args.tokens} new tokens each, prompt i with seed i; host {host}\n\n"
              f"{'method':<24} {'setting':<16} {'rule':<12} {'tokens/call':>11} {'tokens/s':>9}")
    (out / "table.txt").write_text(header + "\n" + "".join(_line(r) + "\n" for r in rows))
    for name, method in methods(target).items():
        for setting, sampling in SETTINGS.items():
            for rule in ("algorithm 2", "coupled"):
                if any((r["method"], r["setting"], r["rule"]) == (name, setting, rule)
                       for r in rows):
                    continue
                coupled = rule == "coupled"
                specjax.generate(target, [prompts[0]], method, sampling,
                                 max_new_tokens=args.tokens, coupled=coupled)   # compiles
                new = calls = 0
                seconds = 0.0
                for i, ids in enumerate(prompts):
                    r = specjax.generate(target, [ids], method, sampling, seed=i,
                                         max_new_tokens=args.tokens, coupled=coupled)
                    new += r.stats.new_tokens
                    calls += r.stats.target_calls
                    seconds += r.stats.run_s
                row = dict(method=name, setting=setting, rule=rule, new_tokens=new,
                           target_calls=calls, tokens_per_call=new / calls,
                           tokens_per_s=new / seconds)
                rows.append(row)
                line = _line(row)
                print(line, flush=True)
                with open(out / "table.txt", "a") as f:
                    f.write(line + "\n")
                (out / "results.json").write_text(json.dumps(
                    dict(dtype=args.dtype, tokens=args.tokens, prompts=len(prompts),
                         date=time.strftime("%Y-%m-%d"), host=host, rows=rows), indent=1))
        # Each method's programs freed before the next: a process keeps every compiled
        # program's memory maps, and this sweep's ran past Linux's limit.
        release_programs()


def _line(row: dict) -> str:
    return (f"{row['method']:<24} {row['setting']:<16} {row['rule']:<12} "
            f"{row['tokens_per_call']:>11.3f} {row['tokens_per_s']:>9.1f}")


if __name__ == "__main__":
    main()
