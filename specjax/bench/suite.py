"""Benchmarks autoregressive, speculative, n-gram, Medusa, EAGLE and DFlash decoding on a fixed
prompt suite, and how prefill and decoding times grow with the prompt's length.

Suite. Every prompt of the suite (specjax/bench/prompts.py: code completion, code editing, long
code editing, prose and chat) runs through every method and every K: --warmup untimed runs,
then --reps timed runs of `specjax.generate` (the whole loop compiled as one program; compile
time is recorded apart). Per prompt the medians over the timed runs are reported; the summary
holds the medians of those over the prompts:

  tokens/s          new tokens / run time
  speedup           tokens/s over autoregressive tokens/s of the same engine in the same run:
                    per prompt, the ratio of the two medians over the timed runs; in the
                    summary, the ratio of the two medians over the prompts (the same
                    statistic on both sides, so it equals the tokens/s column over the
                    autoregressive row's)
  vs specjax AR     the same ratio over specjax's autoregressive tokens/s (transformers
                    against specjax)
  vs llama.cpp's fastest
                    with llama.cpp beside it (`specjax.bench.llamacpp`, which also runs its
                    plain decoding in F16, Q8_0 and Q4_1): tokens/s over the fastest llama.cpp
                    plain decoding in the run, in decode tokens/s and end to end, each over the
                    fastest of its own column (the precision it ran in is the row's engine)
  spread            the run-to-run spread of the ratio to its left: timed run i of every prompt
                    makes suite run i, whose ratio is the median over the prompts of their
                    run-i tokens/s over the baseline's; spread = (max - min) / median of the
                    --reps suite-run ratios (none with one timed run). The full range, not a
                    standard deviation: over a handful of runs a standard deviation is itself
                    unreliable, and the range says directly how far the ratio moved from one
                    run of the suite to another
  acceptance a      accepted drafted tokens / drafted tokens
  tokens/call       new tokens per target call
  c                 cost ratio: draft time per token / target time per token, from both models'
                    autoregressive decoding of the same prompt in the same run; 0 for n-gram
  theory            E / (c K + 1) with E = (1 - a^(K+1)) / (1 - a) (Leviathan et al. 2023,
                    Eq. 1 and Theorem 3.8): the speedup that the measured a and c imply when a
                    target call on K + 1 tokens costs what a call on one token costs
  measured/theory   speedup / theory
  step cost         tokens/call / speedup: the time of one step (its target call and its
                    drafting) over one autoregressive step's; for n-gram lookup, whose drafting
                    costs next to nothing, the cost of a verify call on K + 1 (or a tree's)
                    tokens relative to a one-token call

Token trees (--trees 2,2,1 3,2,1 ...): each full tree of those widths per depth also runs with
speculative, n-gram, Medusa and EAGLE decoding (`generate(..., tree=...)`), in rows labelled
"tree 2,2,1" beside the chains; the chain theory above does not apply to them. EAGLE-2 dynamic
trees (--dynamic-trees 4,4,8 ...: depth, top-k, total tokens) run with EAGLE, in rows labelled
"dynamic 4,4,8".

Medusa (with --heads DIR, or a preset that ships heads) and EAGLE (with --drafter DIR, or a
preset that ships a drafter): rows for the heads' or the drafter's own tree ("heads' tree",
"drafter's tree") and for each --trees tree; EAGLE also runs a chain of each K of --ks. They have no c or theory: the heads and the drafter
run inside the target's step, so their cost is not a separate model's decoding
(scripts/bench_forward.py --medusa and --eagle time it); step cost still gives a step's time over
an autoregressive step's.

Lookahead schedules (--k-schedules constant,heuristic,confidence): each K also runs with the
other schedules (`generate(..., k_schedule=...)`, `decoding.lookahead`), K then being the most a
step drafts; rows labelled "≤K heuristic" / "≤K confidence", with drafted/call the tokens
drafted per target call. The chain theory assumes K drafts every step, so those rows have none.
--oracle runs the oracle analysis instead of the suite's timings (`specjax.bench.oracle`), and
--batch 1,8,32 the batch sweep (`specjax.bench.batch`): many rows in one call, per batch size.

N-gram steps that find no match draft nothing; a counts only tokens actually drafted, so the
theory (K drafts every step) is an upper bound there.

Context sweep (--contexts N1,N2,...; default 50,500,1500, none with --quick). For each length N
the prompt is the first N tokens, in the target's tokenizer, of the source of the standard
library's `textwrap` module as the running Python ships it (the Python version is recorded).
Greedy autoregressive decoding with EOS ignored, on each engine:

  prefill_s         the time of a run that generates 1 token: the prompt's prefill and the
                    first token
  per_token_ms      (time of a run of 1 + M tokens - time of a run of 1 token) / M, M = 32: one
                    decode step with about N tokens in the cache

Each timed run of 1 token is paired with one of 1 + M; medians over the --reps pairs after
max(1, --warmup) untimed ones (the first compiles), spreads (max - min) / median as above. A
length whose prompt and 1 + M new tokens do not fit the target's context window is skipped
with a note.

Peers, when transformers and torch are importable (the `bench` extra), run in the same process
on the same weights: `generate`, prompt lookup (`prompt_lookup_num_tokens=K`,
`max_matching_ngram_size` = --max-ngram) and assisted generation with the same draft
(`assistant_model=`) in two settings:

  speculative          K tokens per step: num_assistant_tokens=K, a constant schedule and no
                       confidence cut-off, the setting that matches specjax's
  speculative-dynamic  transformers' own default: up to num_assistant_tokens=20 per step, and
                       the draft stops early once its top probability falls under
                       assistant_confidence_threshold=0.4 (transformers re-fits that threshold
                       while generating when scikit-learn is installed; a note says when it is
                       not). num_assistant_tokens_schedule stays at transformers' default, which
                       is "constant" in transformers 5.23 (the 20 is not adjusted)

transformers reads these from the draft's generation_config, which the two settings share, so
every assisted run sets all three first. torch gets torch.set_num_threads(<cores>), the thread
count JAX's CPU backend uses. Peer speedups are over transformers' own `generate`; their
tokens/call counts target forward calls, prefill included.

results.json records the machine: CPU model, core count, usable threads, and the versions of
Python, jax, jaxlib, numpy, torch and transformers. Writes results.json, results.md and, with
matplotlib, speedup_vs_k.png, acceptance_vs_k.png and, when the rows carry histograms of
accepted drafts per step, tokens_per_call_vs_k.png (measured against (1 - a^(K+1)) / (1 - a))
and acceptance_by_position.png into --out (default bench-out/). Each figure's legend series
are listed under "figures" in results.json.
"""

from __future__ import annotations

import datetime
import inspect
import platform
import textwrap

from specjax.api.checks import check_compatible, encode_prompts
from specjax.bench import suite_jobs, suite_rows
from specjax.bench.common import (
    SWEEP_DECODE_TOKENS,
    Progress,
    encode_suite,
    load_pair,
    machine,
    write_report,
)
from specjax.bench.llamacpp import FASTEST_KINDS, GGUF_TYPES, LlamaCpp
from specjax.bench.peers import Peers
from specjax.bench.prompts import SUITE
from specjax.bench.report import k_label, markdown, plots
from specjax.io.checkpoint import load
from specjax.io.sidecar import tree_to_json
from specjax.presets import CLIError, heads_path, load_drafters, model_paths

SCHEMA = "specjax.bench/1"


def run(args, settings: dict) -> int:
    """`bench` without --oracle or --batch: the suite and the context sweep, written to --out."""
    notes: list[str] = []
    target_path, draft_path, no_draft = model_paths(args, "speculative" in settings["methods"])
    if "speculative" in settings["methods"] and draft_path is None:
        settings["methods"].remove("speculative")
        notes.append(f"speculative skipped: {no_draft}")
    heads = _beside(args, settings, notes, "medusa", heads_path, "heads")
    drafter, block_drafter = _drafters(args, settings, notes)
    target, draft = load_pair(target_path, draft_path, args.dtype, settings, notes)
    if draft is not None:
        check_compatible(target, draft)
    prompts = encode_suite(target, draft, SUITE["prompts"], settings, notes)
    contexts = _sweep_prompts(target, settings["contexts"], notes)
    peers = Peers.create(target, draft, settings, args.dtype, notes) if settings["peers"] else None
    llamacpp = LlamaCpp.create(target, settings, args.dtype, notes) if settings["peers"] else None
    fastest = [LlamaCpp.create(target, settings, args.dtype, notes, kind)
               for kind in FASTEST_KINDS if kind != GGUF_TYPES[args.dtype]] if llamacpp else []

    prompt_jobs = suite_jobs.jobs(prompts, settings, target, draft, peers,
                                  dict(heads=heads, drafter=drafter, block_drafter=block_drafter),
                                  llamacpp, [peer for peer in fastest if peer is not None])
    context_jobs = suite_jobs.sweep_jobs(contexts, settings, target, peers)
    progress = Progress(len(prompt_jobs) + len(context_jobs))
    for job in prompt_jobs + context_jobs:
        progress.update(job["label"])
        job["result"] = job.pop("run")()
    progress.close()

    rows = suite_rows.rows(prompt_jobs, settings)
    categories = list(dict.fromkeys(p["category"] for p in prompts))
    results = {
        "schema": SCHEMA, "suite_version": SUITE["version"],
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(peers),
        "settings": _settings(settings, args, target, draft, heads, drafter, peers),
        "prompts": [{k: p[k] for k in ("id", "category", "chat", "prompt_tokens",
                                       "max_new_tokens")} for p in prompts],
        "rows": rows,
        "summary": suite_rows.summarize(rows, "all"),
        "by_category": [r for c in categories
                        for r in suite_rows.summarize([x for x in rows if x["category"] == c], c)],
        "context_sweep": suite_rows.sweep_rows(context_jobs),
        "notes": notes,
    }
    mismatched = [r for r in results["summary"] if r["same_tokens_as_specjax_autoregressive"] is False]
    if mismatched:
        notes.append("greedy outputs that differ from specjax autoregressive's: " + ", ".join(
            f"{r['engine']} {r['method']} {k_label(r)}" for r in mismatched))
    write_report(args.out, "results", results, plots, markdown,
                 printed=lambda r: markdown(r, heading=False))
    return 0


def _settings(settings, args, target, draft, heads, drafter, peers) -> dict:
    """The run's settings as results.json records them: the bench's, and what ran."""
    return {**settings, "target": target.name, "target_path": str(target.path),
            "draft": draft.name if draft is not None else None,
            "draft_path": str(draft.path) if draft is not None else None,
            "heads": heads.name if heads is not None else None,
            "heads_tree": ([list(p) for p in heads.tree.paths]
                           if heads is not None and heads.tree is not None else None),
            "drafter": drafter.name if drafter is not None else None,
            "drafter_tree": tree_to_json(
                drafter.sampled_tree if drafter.sampled_tree is not None
                and settings["temperature"] > 0 else drafter.tree) if drafter else None,
            "dtype": args.dtype, "peers": peers is not None,
            "context_text": f"textwrap source of Python {platform.python_version()}",
            "context_decode_tokens": SWEEP_DECODE_TOKENS}


def _beside(args, settings, notes: list[str], method: str, find, flag: str):
    """What `method` needs beside the target (Medusa heads, an EAGLE drafter), loaded; None,
    with the method dropped and a note, when there is none."""
    if method not in settings["methods"]:
        if getattr(args, flag):
            raise CLIError(f"--{flag} applies when --methods includes {method}")
        return None
    path, missing = find(args)
    if path is None:
        settings["methods"].remove(method)
        notes.append(f"{method} skipped: {missing}")
        return None
    return load(path)


def _drafters(args, settings, notes: list[str]):
    """The EAGLE drafter and the DFlash drafter the methods need (`presets.load_drafters`); a
    method without its kind is dropped with a note."""
    found, missing = load_drafters(args, settings["methods"])
    for method, why in missing.items():
        settings["methods"].remove(method)
        notes.append(f"{method} skipped: {why}")
    return found.get("eagle"), found.get("dflash")


def _sweep_prompts(target, contexts: list[int], notes: list[str]) -> list[dict]:
    """For each context length N, the first N tokens of `textwrap`'s source (module docstring);
    lengths that the source or the target's context window cannot hold are skipped with a note."""
    if not contexts:
        return []
    ids = encode_prompts(target, [inspect.getsource(textwrap)])[0]
    window = target.config.max_positions
    prompts = []
    for n in contexts:
        if n > len(ids):
            notes.append(f"context {n} skipped: the textwrap source is {len(ids)} tokens long")
        elif n + 1 + SWEEP_DECODE_TOKENS > window:
            notes.append(f"context {n} skipped: {n} + {1 + SWEEP_DECODE_TOKENS} tokens exceed "
                         f"the context window of {window}")
        else:
            prompts.append(dict(context_tokens=n, ids=ids[:n]))
    return prompts
