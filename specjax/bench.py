"""Benchmarks autoregressive, speculative, n-gram and Medusa decoding on a fixed prompt suite, and
how prefill and decoding times grow with the prompt's length.

Suite. Every prompt of the suite (specjax/bench_prompts.py: code completion, code editing, long
code editing, prose and chat) runs through every method and every K: --warmup untimed runs,
then --reps timed runs of `specjax.generate` (the whole loop compiled as one program; compile
time is recorded apart). Per prompt the medians over the timed runs are reported; the summary
holds the medians of those over the prompts:

  tokens/s          new tokens / run time
  speedup           tokens/s over autoregressive tokens/s: same prompt, same engine, same run
  vs specjax AR     tokens/s over specjax's autoregressive tokens/s (transformers against specjax)
  spread            the run-to-run spread of the ratio to its left: timed run i of every prompt
                    makes suite run i, whose ratio is the median over the prompts of their run-i
                    ratios; spread = (max - min) / median of the --reps suite-run ratios (none
                    with one timed run). The full range, not a standard deviation: over a
                    handful of runs a standard deviation is itself unreliable, and the range
                    says directly how far the ratio moved from one run of the suite to another
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
speculative, n-gram and Medusa decoding (`generate(..., tree=...)`), in rows labelled "tree
2,2,1" beside the chains; the chain theory above does not apply to them.

Medusa (with --heads DIR, or a preset that ships heads): rows for the heads' own tree ("heads'
tree") and for each --trees tree. They have no c or theory: the heads run inside the target's
step, so their cost is not a separate model's decoding (scripts/bench_forward.py --medusa
times it); step cost still gives a step's time over an autoregressive step's.

Lookahead schedules (--k-schedules constant,heuristic,confidence): each K also runs with the
other schedules (`generate(..., k_schedule=...)`, `decoding.lookahead`), K then being the most a
step drafts; rows labelled "≤K heuristic" / "≤K confidence", with drafted/call the tokens
drafted per target call. The chain theory assumes K drafts every step, so those rows have none.
--oracle runs the oracle analysis instead of the suite's timings (`specjax.oracle`), and
--batch 1,8,32 the batch sweep (`specjax.bench_batch`): many rows in one call, per batch size.

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

import argparse
import datetime
import importlib.metadata
import importlib.util
import inspect
import json
import os
import platform
import statistics
import sys
import textwrap
import time
from pathlib import Path

from specjax.cli_common import (CLIError, add_model_arguments, enable_compile_cache, heads_path,
                                load_model, make_mesh, model_paths, parse_mesh)

SCHEMA = "specjax.bench/1"
ALL_METHODS = ("autoregressive", "speculative", "ngram", "medusa")
HEADS_TREE = "heads"       # the tree key of medusa rows that use the tree shipped with the heads
FULL = dict(ks="2,4,6", reps=5, warmup=1, max_new_tokens=128, contexts="50,500,1500")
QUICK = dict(ks="2", reps=1, warmup=0, max_new_tokens=16, contexts="none")
CONSTANT = "constant"      # the lookahead schedule of rows that draft K every step
METRICS = ("tokens_per_second", "speedup", "speedup_vs_specjax_autoregressive", "acceptance_rate",
           "tokens_per_target_call", "step_cost", "cost_ratio", "theoretical_speedup",
           "measured_over_theoretical", "mean_draft_length")
SWEEP_DECODE_TOKENS = 32   # M: tokens decoded after the first one, for the per-token time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--methods", default=",".join(ALL_METHODS),
                        help="comma-separated subset of " + ",".join(ALL_METHODS) +
                             " (autoregressive, the baseline, always runs)")
    parser.add_argument("--ks", help="comma-separated K values (default 2,4,6; --quick: 2)")
    parser.add_argument("--reps", type=int, help="timed runs per setting (default 5; --quick: 1)")
    parser.add_argument("--warmup", type=int, help="untimed runs first (default 1; --quick: 0)")
    parser.add_argument("--max-new-tokens", type=int,
                        help="tokens per run (default 128; --quick: 16); lowered for a prompt "
                             "that would not fit the context window")
    parser.add_argument("--contexts",
                        help="comma-separated prompt lengths in tokens for the context sweep, "
                             "or none (default 50,500,1500; --quick: none)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--seed", type=int, default=0, help="timed run i uses seed + i")
    parser.add_argument("--trees", nargs="+", metavar="WIDTHS",
                        help="also run token trees, each the full tree of these widths per depth "
                             "(e.g. --trees 2,2,1 3,2,1), for speculative, ngram and medusa "
                             "(which always runs its heads' own tree too); default none")
    parser.add_argument("--k-schedules", default="constant", metavar="SCHEDULES",
                        help="comma-separated lookahead schedules to run for each K (constant, "
                             "heuristic, confidence; default constant): K is the most a step "
                             "drafts; n-gram runs constant and heuristic only")
    parser.add_argument("--confidence-threshold", type=float, default=0.4,
                        help="the confidence schedule's threshold (default 0.4)")
    parser.add_argument("--oracle", action="store_true",
                        help="instead of the suite's timings, the oracle lookahead analysis "
                             "(specjax.oracle): greedy, the draft's oracle, constant and dynamic "
                             "draft lengths per step, figures and call counts")
    parser.add_argument("--batch", metavar="SIZES",
                        help="comma-separated batch sizes, e.g. 1,8,32: instead of the suite's "
                             "timings, the batch sweep (specjax.bench_batch): B suite prompts in "
                             "one generate call per method and K, against transformers")
    parser.add_argument("--max-ngram", type=int, default=3,
                        help="longest n-gram looked up (default 3)")
    parser.add_argument("--quick", action="store_true",
                        help="one short prompt per category, K=2, 1 run, 16 tokens, no context "
                             "sweep, no peers")
    parser.add_argument("--peers", action=argparse.BooleanOptionalAction, default=None,
                        help="also run transformers (default: when installed; off with --quick)")
    parser.add_argument("--out", default="bench-out", help="output directory (default bench-out)")
    parser.set_defaults(run=run)


def run(args) -> int:
    from specjax.bench_prompts import SUITE
    from specjax.checkpoint import load
    from specjax.generate import check_compatible

    settings = _settings(args)
    enable_compile_cache()
    if args.oracle:
        from specjax import oracle

        return oracle.run(args, settings)
    if settings["batch"]:
        from specjax import bench_batch

        return bench_batch.run(args, settings)
    notes: list[str] = []
    target_path, draft_path, no_draft = model_paths(args, "speculative" in settings["methods"])
    if "speculative" in settings["methods"] and draft_path is None:
        settings["methods"].remove("speculative")
        notes.append(f"speculative skipped: {no_draft}")
    heads = None
    if "medusa" in settings["methods"]:
        path, no_heads = heads_path(args)
        if path is None:
            settings["methods"].remove("medusa")
            notes.append(f"medusa skipped: {no_heads}")
        else:
            heads = load(path)
    elif args.heads:
        raise CLIError("--heads applies when --methods includes medusa")
    target, draft = load_pair(target_path, draft_path, args.dtype, settings, notes)
    if draft is not None:
        check_compatible(target, draft)
    prompts = _encode_suite(target, draft, SUITE["prompts"], settings, notes)
    contexts = _sweep_prompts(target, settings["contexts"], notes)
    peers = Peers.create(target, draft, settings, args.dtype, notes) if settings["peers"] else None

    suite_jobs = _jobs(prompts, settings, target, draft, peers, heads)
    sweep_jobs = _sweep_jobs(contexts, settings, target, peers)
    progress = Progress(len(suite_jobs) + len(sweep_jobs))
    for job in suite_jobs + sweep_jobs:
        progress.update(job["label"])
        job["result"] = job.pop("run")()
    progress.close()

    rows = _rows(suite_jobs, settings)
    categories = list(dict.fromkeys(p["category"] for p in prompts))
    results = {
        "schema": SCHEMA, "suite_version": SUITE["version"],
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": _machine(peers),
        "settings": {**settings, "target": target.name, "target_path": str(target.path),
                     "draft": draft.name if draft is not None else None,
                     "draft_path": str(draft.path) if draft is not None else None,
                     "heads": heads.name if heads is not None else None,
                     "heads_tree": ([list(p) for p in heads.tree.paths]
                                    if heads is not None and heads.tree is not None else None),
                     "dtype": args.dtype, "peers": peers is not None,
                     "context_text": f"textwrap source of Python {platform.python_version()}",
                     "context_decode_tokens": SWEEP_DECODE_TOKENS},
        "prompts": [{k: p[k] for k in ("id", "category", "chat", "prompt_tokens",
                                       "max_new_tokens")} for p in prompts],
        "rows": rows,
        "summary": summarize(rows, "all"),
        "by_category": [r for c in categories
                        for r in summarize([x for x in rows if x["category"] == c], c)],
        "context_sweep": _sweep_rows(sweep_jobs),
        "notes": notes,
    }
    mismatched = [r for r in results["summary"] if r["same_tokens_as_specjax_autoregressive"] is False]
    if mismatched:
        notes.append("greedy outputs that differ from specjax autoregressive's: " + ", ".join(
            f"{r['engine']} {r['method']} {_k_label(r)}" for r in mismatched))
    write_report(args.out, "results", results, plots, markdown,
                 printed=lambda r: markdown(r, heading=False))
    return 0


def load_pair(target_path, draft_path, dtype: str, settings: dict, notes: list[str]):
    """The target and the draft (None without a path), on the --mesh if one was given: the
    target split, the draft replicated, the layout noted."""
    mesh = make_mesh(settings["mesh"])
    target = load_model(target_path, dtype, mesh)
    draft = load_model(draft_path, dtype, mesh, shard=False) if draft_path is not None else None
    if mesh is not None:
        from specjax.mesh import plan

        notes.append(f"mesh data={settings['mesh'][0]} x model={settings['mesh'][1]} on "
                     f"{mesh.devices.flat[0].platform}: {plan(target.config, mesh)}; the draft "
                     "replicated")
    return target, draft


def write_report(out, stem: str, results: dict, plots, markdown, printed=None) -> None:
    """Draws the figures (`plots(results, out)`, which may add notes), then writes
    <stem>.json and <stem>.md into `out` and prints the report (`printed(results)`, by default
    the markdown) and the files written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = plots(results, out)
    (out / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / f"{stem}.md").write_text(markdown(results))
    print((printed or markdown)(results), end="")
    print("\nwrote " + ", ".join(str(out / f) for f in [f"{stem}.json", f"{stem}.md", *written]))


def pyplot(results: dict):
    """matplotlib.pyplot on the Agg backend, or None with a note in results when matplotlib is
    not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        results["notes"].append("figures skipped: matplotlib is not installed "
                                "(pip install specjax[bench])")
        return None
    return plt


def _settings(args) -> dict:
    base = QUICK if args.quick else FULL
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not methods or any(m not in ALL_METHODS for m in methods):
        raise CLIError(f"--methods must be a comma-separated subset of {','.join(ALL_METHODS)}, "
                       f"got {args.methods!r}")
    contexts_text = base["contexts"] if args.contexts is None else args.contexts
    contexts = ([] if contexts_text.strip().lower() == "none"
                else positive_ints("--contexts", contexts_text))
    pick = lambda name: base[name] if getattr(args, name) is None else getattr(args, name)  # noqa: E731
    settings = dict(methods=[m for m in ALL_METHODS if m in methods or m == "autoregressive"],
                    ks=positive_ints("--ks", pick("ks")), reps=pick("reps"),
                    warmup=pick("warmup"), max_new_tokens=pick("max_new_tokens"),
                    contexts=contexts, temperature=args.temperature, seed=args.seed,
                    max_ngram=args.max_ngram, quick=args.quick, trees=_trees(args.trees),
                    k_schedules=_schedules(args.k_schedules),
                    confidence_threshold=args.confidence_threshold,
                    batch=positive_ints("--batch", args.batch) if args.batch else [],
                    mesh=parse_mesh(args.mesh),
                    peers=args.peers if args.peers is not None else not args.quick)
    for name, minimum in (("reps", 1), ("warmup", 0), ("max_new_tokens", 1), ("max_ngram", 1),
                          ("seed", 0)):
        if settings[name] < minimum:
            raise CLIError(f"--{name.replace('_', '-')} must be >= {minimum}, got {settings[name]}")
    if not 0.0 <= settings["confidence_threshold"] <= 1.0:
        raise CLIError(f"--confidence-threshold must be in [0, 1], got "
                       f"{settings['confidence_threshold']}")
    if settings["batch"] and args.oracle:
        raise CLIError("--batch and --oracle are two different runs; pick one")
    if settings["mesh"] and args.oracle:
        raise CLIError("--mesh does not apply to --oracle (it counts calls, on one device)")
    ignored = [name for name, given in (("--trees", settings["trees"]),
                                        ("--k-schedules", settings["k_schedules"] != [CONSTANT]),
                                        ("--contexts", args.contexts is not None)) if given]
    if settings["batch"] and ignored:
        raise CLIError(f"{ignored[0]} does not apply to --batch (the batch sweep runs chains of "
                       "constant K, without the context sweep)")
    if settings["seed"] >= 2**31:
        raise CLIError(f"--seed must be below 2^31, got {settings['seed']}")
    from specjax.logits import SamplingParams

    SamplingParams(temperature=args.temperature)   # ValueError naming a bad temperature
    return settings


def _schedules(text: str) -> list[str]:
    from specjax.decoding.lookahead import SCHEDULES

    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names or any(n not in SCHEDULES for n in names):
        raise CLIError(f"--k-schedules must be a comma-separated subset of "
                       f"{','.join(SCHEDULES)}, got {text!r}")
    return [n for n in SCHEDULES if n in names]


def _trees(texts: list[str] | None) -> list[str]:
    """--trees: each validated as a full tree's widths, kept as the canonical text "3,2,1"."""
    from specjax.tree import parse_widths

    return [",".join(map(str, parse_widths(t).full_widths())) for t in texts or []]


def positive_ints(option: str, text: str) -> list[int]:
    """"2,4,6" -> [2, 4, 6]: sorted, without repeats; a CLIError naming the option and the text
    for anything else."""
    try:
        values = sorted({int(v) for v in text.split(",")})
    except ValueError:
        values = []
    if not values or values[0] < 1:
        raise CLIError(f"{option} must be comma-separated positive integers, got {text!r}")
    return values


def _encode_suite(target, draft, suite, settings, notes) -> list[dict]:
    from specjax import chat
    from specjax.generate import encode_prompts

    prompts, shortened = [], []
    context = min(m.config.max_positions for m in (target, draft) if m is not None)
    for entry in suite:
        if settings["quick"] and not entry["quick"]:
            continue
        use_chat = bool(entry.get("chat")) and bool(target.chat_template)
        ids = (chat.encode(target, chat.render(target, entry["prompt"])) if use_chat
               else encode_prompts(target, [entry["prompt"]])[0])
        n = min(settings["max_new_tokens"], context - len(ids))
        if n < 1:
            notes.append(f"{entry['id']} skipped: its {len(ids)} tokens fill the context window")
            continue
        if n < settings["max_new_tokens"]:
            shortened.append(f"{entry['id']} ({n})")
        prompts.append(dict(entry, chat=use_chat, ids=ids, prompt_tokens=len(ids),
                            max_new_tokens=n))
    if shortened:
        notes.append("max_new_tokens lowered to fit the context window: " + ", ".join(shortened))
    return prompts


def _sweep_prompts(target, contexts: list[int], notes: list[str]) -> list[dict]:
    """For each context length N, the first N tokens of `textwrap`'s source (module docstring);
    lengths that the source or the target's context window cannot hold are skipped with a note."""
    from specjax.generate import encode_prompts

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


# -- Measurements -------------------------------------------------------------------------------

def _jobs(prompts, settings, target, draft, peers, heads=None) -> list[dict]:
    """One job per (prompt, engine, method, K or tree); `run` returns the timed runs' records."""
    jobs = []

    def add(prompt, engine, method, k, run_job, tree=None, schedule=CONSTANT):
        label = (f"{prompt['id']} {engine} {method}" + (f" K={k}" if k else "")
                 + (f" tree {tree}" if tree else "")
                 + (f" {schedule}" if schedule != CONSTANT else ""))
        jobs.append(dict(prompt=prompt, engine=engine, method=method, k=k, tree=tree,
                         schedule=schedule, label=label, run=run_job))

    for p in prompts:
        ks = {m: settings["ks"] if m in ("speculative", "ngram") else [None]
              for m in settings["methods"]}
        for method in settings["methods"]:
            if method == "medusa":
                add(p, "specjax", method, None,
                    _specjax_job(p, settings, target, method, None, None, HEADS_TREE, heads),
                    HEADS_TREE)
            else:
                for k in ks[method]:
                    for schedule in _method_schedules(method, settings):
                        add(p, "specjax", method, k,
                            _specjax_job(p, settings, target, method, k, draft,
                                         schedule=schedule), schedule=schedule)
            for tree in settings["trees"] if method != "autoregressive" else []:
                add(p, "specjax", method, None,
                    _specjax_job(p, settings, target, method, None, draft, tree, heads), tree)
        if "speculative" in settings["methods"]:
            # The draft decoding on its own, for the cost ratio c.
            add(p, "specjax", "draft-autoregressive", None,
                _specjax_job(p, settings, draft, "autoregressive", None, None))
        if peers is not None:
            for method in (m for m in settings["methods"] if m != "medusa"):   # no peer
                for k in ks[method]:
                    add(p, "transformers", method, k, peers.job(p, method, k))
            if "speculative" in settings["methods"]:
                add(p, "transformers", "speculative-dynamic", None,
                    peers.job(p, "speculative-dynamic", None))
    return jobs


def _method_schedules(method: str, settings) -> list[str]:
    """The lookahead schedules that apply to `method` among --k-schedules."""
    if method == "speculative":
        return settings["k_schedules"]
    if method == "ngram":
        return [s for s in settings["k_schedules"] if s != "confidence"]
    return [CONSTANT]


def _specjax_job(prompt, settings, model, method, k, draft, tree=None, heads=None,
                 schedule=CONSTANT):
    def run_job() -> dict:
        from specjax.generate import generate
        from specjax.tree import parse_widths

        extra = dict(heads=heads) if method == "medusa" else dict(draft=draft, k=k or 1)
        if schedule != CONSTANT:
            extra["k_schedule"] = schedule
        if schedule == "confidence":
            extra["confidence_threshold"] = settings["confidence_threshold"]
        results, compile_s = timed_runs(settings, lambda seed: generate(
            model, [prompt["ids"]], method=method, **extra,
            tree=parse_widths(tree) if tree and tree != HEADS_TREE else None,
            max_new_tokens=prompt["max_new_tokens"], temperature=settings["temperature"],
            seed=seed, max_ngram=settings["max_ngram"], mesh=make_mesh(settings["mesh"])))
        records = [dict(new_tokens=s.new_tokens, run_s=s.run_s,
                        acceptance_rate=s.acceptance_rate if s.drafted else None,
                        tokens_per_target_call=s.tokens_per_target_call,
                        mean_draft_length=(s.mean_draft_length
                                           if method != "autoregressive" else None),
                        accepted_histogram=list(s.accepted_histogram), tokens=r.tokens[0])
                   for r, s in ((r, r.stats) for r in results)]
        return dict(records=records, compile_s=compile_s)
    return run_job


def timed_runs(settings, generate_with_seed) -> tuple[list, float]:
    """--warmup untimed calls, then --reps timed ones, timed run i with seed --seed + i: the
    timed runs' results and the first call's compile seconds."""
    results, compile_s = [], 0.0
    for i in range(settings["warmup"] + settings["reps"]):
        result = generate_with_seed(settings["seed"] + max(0, i - settings["warmup"]))
        compile_s = result.stats.compile_s if i == 0 else compile_s
        if i >= settings["warmup"]:
            results.append(result)
    return results, compile_s


def _sweep_jobs(contexts, settings, target, peers) -> list[dict]:
    """One job per (context length, engine); `run` returns the timed runs' seconds."""
    jobs = []
    for c in contexts:
        n = c["context_tokens"]
        jobs.append(dict(engine="specjax", context_tokens=n, label=f"context {n} specjax",
                         run=_specjax_sweep_job(c["ids"], settings, target)))
        if peers is not None:
            jobs.append(dict(engine="transformers", context_tokens=n,
                             label=f"context {n} transformers",
                             run=peers.sweep_job(c["ids"], settings)))
    return jobs


def _specjax_sweep_job(ids, settings, target):
    def seconds(new_tokens: int) -> float:
        from specjax.generate import generate

        return generate(target, [ids], method="autoregressive", max_new_tokens=new_tokens,
                        temperature=0.0, eos_ids=(), mesh=make_mesh(settings["mesh"])).stats.run_s
    return lambda: _sweep_times(seconds, settings)


def _sweep_times(seconds, settings) -> dict:
    """Times of runs of 1 and 1 + M new tokens, paired; `seconds(n)` times one greedy run of n
    new tokens on the job's prompt. Warm-up pairs first: the first run of each length compiles
    (specjax) or pays one-time costs (transformers)."""
    m = SWEEP_DECODE_TOKENS
    for _ in range(max(1, settings["warmup"])):
        seconds(1), seconds(1 + m)
    prefill_s, per_token_s = [], []
    for _ in range(settings["reps"]):
        one, more = seconds(1), seconds(1 + m)
        prefill_s.append(one)
        per_token_s.append((more - one) / m)
    return dict(prefill_s=prefill_s, per_token_s=per_token_s)


def _sweep_rows(jobs) -> list[dict]:
    """One row per (context length, engine): medians and spreads over the timed pairs, and the
    per-token time over the same engine's at the shortest context measured."""
    rows = []
    for job in jobs:
        prefill, per_token = job["result"]["prefill_s"], job["result"]["per_token_s"]
        rows.append(dict(engine=job["engine"], context_tokens=job["context_tokens"],
                         prefill_s=_median(prefill), prefill_spread=_spread(prefill),
                         per_token_ms=1000 * _median(per_token),
                         per_token_spread=_spread(per_token), runs=len(prefill)))
    for row in rows:
        shortest = min((r for r in rows if r["engine"] == row["engine"]),
                       key=lambda r: r["context_tokens"])
        row["per_token_over_shortest"] = _ratio(row["per_token_ms"], shortest["per_token_ms"])
    return rows


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _ratio(a, b):
    return a / b if a is not None and b else None


def _spread(values) -> float | None:
    """(max - min) / median of repeated measurements; None with fewer than two."""
    values = [v for v in values if v is not None]
    if len(values) < 2 or statistics.median(values) <= 0:
        return None
    return (max(values) - min(values)) / statistics.median(values)


def _rows(jobs, settings) -> list[dict]:
    """Per-prompt rows: medians over the timed runs, speedups, cost ratio and theory."""
    measured = {}
    for job in jobs:
        recs = job["result"]["records"]
        per_run = [_ratio(r["new_tokens"], r["run_s"]) for r in recs]
        measured[(job["prompt"]["id"], job["engine"], job["method"], job["k"],
                  job.get("tree"), job.get("schedule", CONSTANT))] = dict(
            prompt_id=job["prompt"]["id"], category=job["prompt"]["category"],
            engine=job["engine"], method=job["method"], k=job["k"], tree=job.get("tree"),
            schedule=job.get("schedule", CONSTANT),
            new_tokens=int(_median([r["new_tokens"] for r in recs])),
            tokens_per_second=_median(per_run), per_run_tokens_per_second=per_run,
            run_s=_median([r["run_s"] for r in recs]), compile_s=job["result"]["compile_s"],
            acceptance_rate=_median([r["acceptance_rate"] for r in recs]),
            tokens_per_target_call=_median([r["tokens_per_target_call"] for r in recs]),
            mean_draft_length=_median([r.get("mean_draft_length") for r in recs]),
            accepted_histogram=_pooled([r.get("accepted_histogram") for r in recs]),
            tokens=recs[0]["tokens"])
    tokens = {key: row.pop("tokens") for key, row in measured.items()}
    rows = []
    for (pid, engine, method, k, tree, schedule), row in measured.items():
        if method == "draft-autoregressive":
            continue
        own_ar = measured[(pid, engine, "autoregressive", None, None, CONSTANT)]
        specjax_ar = measured[(pid, "specjax", "autoregressive", None, None, CONSTANT)]
        row["speedup"] = _ratio(row["tokens_per_second"], own_ar["tokens_per_second"])
        row["speedup_vs_specjax_autoregressive"] = _ratio(row["tokens_per_second"],
                                                          specjax_ar["tokens_per_second"])
        # Timed run i against the baseline's run i, for the spread of the suite's ratios.
        for key, base in (("per_run_speedup", own_ar),
                          ("per_run_speedup_vs_specjax_autoregressive", specjax_ar)):
            row[key] = [_ratio(a, b) for a, b in zip(row["per_run_tokens_per_second"],
                                                     base["per_run_tokens_per_second"])]
        # Greedy decoding with any method is the target's greedy output: a live check.
        row["same_tokens_as_specjax_autoregressive"] = (
            tokens[(pid, engine, method, k, tree, schedule)]
            == tokens[(pid, "specjax", "autoregressive", None, None, CONSTANT)]
            if settings["temperature"] == 0 else None)
        cost = None
        if engine == "specjax" and method == "speculative":
            draft_ar = measured[(pid, "specjax", "draft-autoregressive", None, None, CONSTANT)]
            cost = _ratio(specjax_ar["tokens_per_second"], draft_ar["tokens_per_second"])
            row["draft_tokens_per_second"] = draft_ar["tokens_per_second"]
        elif engine == "specjax" and method == "ngram":
            cost = 0.0
        row["cost_ratio"] = cost
        if method == "autoregressive":
            row["theoretical_speedup"] = 1.0
        elif schedule != CONSTANT:
            row["theoretical_speedup"] = None     # the chain theory assumes K drafts per step
        else:
            row["theoretical_speedup"] = theoretical_speedup(row["acceptance_rate"], k, cost)
        row["measured_over_theoretical"] = _ratio(row["speedup"], row["theoretical_speedup"])
        # The time of one step (a target call and its drafting) over an autoregressive step's.
        row["step_cost"] = _ratio(row["tokens_per_target_call"], row["speedup"])
        rows.append(row)
    return rows


def theoretical_speedup(a: float | None, k: int | None, c: float | None) -> float | None:
    """E / (c K + 1) with E = (1 - a^(K+1)) / (1 - a), the expected tokens per target call
    (Leviathan et al. 2023, Eq. 1 and Theorem 3.8); None when a or c is unknown."""
    if a is None or k is None or c is None:
        return None
    return expected_tokens_per_call(a, k) / (c * k + 1.0)


def summarize(rows: list[dict], category: str) -> list[dict]:
    """One row per (engine, method, K): medians over the prompts, and the run-to-run spread of
    the two speedups (module docstring)."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["engine"], row["method"], row["k"], row.get("tree"),
                           row.get("schedule", CONSTANT)), []).append(row)
    out = []
    for (engine, method, k, tree, schedule), group in groups.items():
        same = [r["same_tokens_as_specjax_autoregressive"] for r in group]
        out.append(dict(category=category, engine=engine, method=method, k=k, tree=tree,
                        schedule=schedule,
                        prompts=len(group),
                        **{m: _median([r[m] for r in group]) for m in METRICS},
                        accepted_histogram=_pooled([r.get("accepted_histogram") for r in group]),
                        speedup_spread=_spread(_suite_runs(group, "per_run_speedup")),
                        speedup_vs_specjax_autoregressive_spread=_spread(_suite_runs(
                            group, "per_run_speedup_vs_specjax_autoregressive")),
                        same_tokens_as_specjax_autoregressive=(
                            None if None in same else all(same))))
    return out


def _pooled(histograms) -> list[int] | None:
    """Histograms of accepted drafts per step, added up (None when there are none)."""
    histograms = [h for h in histograms if h]
    return [sum(col) for col in zip(*histograms)] if histograms else None


def expected_tokens_per_call(a: float | None, k: int | None) -> float | None:
    """(1 - a^(K+1)) / (1 - a): tokens per target call when each of K drafts is accepted with
    probability a independently (Leviathan et al. 2023, Eq. 1)."""
    if a is None or k is None:
        return None
    return k + 1.0 if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


def _suite_runs(rows: list[dict], key: str) -> list[float | None]:
    """Suite run i's value: the median over the prompts of their timed run i's value."""
    return [_median(run) for run in zip(*(r[key] for r in rows))]


# -- Peers: Hugging Face transformers on the same weights --------------------------------------

class Peers:
    """transformers' `generate` on the same weights, run as its users run it (module docstring)."""

    def __init__(self, torch, transformers, target, draft, settings, threads):
        self.torch, self.settings, self.threads = torch, settings, threads
        self.target, self.draft = target, draft
        # What a GenerationConfig holds when nobody sets the schedule ("constant" is applied
        # when it holds None, in transformers 5.23).
        self.default_schedule = transformers.GenerationConfig().num_assistant_tokens_schedule
        self.calls = 0
        target.register_forward_pre_hook(self._count)

    def _count(self, module, args) -> None:
        self.calls += 1

    @classmethod
    def create(cls, target, draft, settings, dtype: str, notes: list[str]) -> "Peers | None":
        try:
            import torch
            import transformers
        except ImportError:
            notes.append("transformers peers skipped: transformers and torch are not installed "
                         "(pip install specjax[bench])")
            return None
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        threads = _threads()
        torch.set_num_threads(threads)
        torch_dtype = torch.float32 if dtype == "float32" else torch.bfloat16
        dtype_arg = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"

        def hf_load(model):
            return transformers.AutoModelForCausalLM.from_pretrained(
                model.path, **{dtype_arg: torch_dtype}).eval()
        notes.append(f"transformers {transformers.__version__} / torch {torch.__version__}: "
                     f"torch.set_num_threads({threads}), the {threads} cores JAX's CPU backend "
                     "uses; peer speedups are over transformers' own generate")
        if draft is not None and importlib.util.find_spec("sklearn") is None:
            notes.append("transformers speculative-dynamic: scikit-learn is not installed, so "
                         "assistant_confidence_threshold stays at 0.4 instead of being re-fitted")
        return cls(torch, transformers, hf_load(target),
                   hf_load(draft) if draft is not None else None, settings, threads)

    def job(self, prompt, method, k):
        """A suite job: --warmup (at least 1) untimed and --reps timed runs of one method."""
        s = self.settings
        ids = self.torch.tensor([prompt["ids"]])
        kwargs = self._generate_kwargs(ids, prompt["max_new_tokens"], s["temperature"])
        assistant = None
        if method == "speculative":           # K tokens every step, as specjax drafts them
            assistant = dict(num_assistant_tokens=k, num_assistant_tokens_schedule="constant",
                             assistant_confidence_threshold=0.0)
        elif method == "speculative-dynamic":   # transformers' defaults
            assistant = dict(num_assistant_tokens=20, assistant_confidence_threshold=0.4,
                             num_assistant_tokens_schedule=self.default_schedule)
        elif method == "ngram":
            kwargs.update(prompt_lookup_num_tokens=k, max_matching_ngram_size=s["max_ngram"])
        if assistant is not None:
            kwargs["assistant_model"] = self.draft

        def run_job() -> dict:
            records = []
            warmup = max(1, s["warmup"])   # the first call pays one-time costs, even in --quick
            for i in range(warmup + s["reps"]):
                if assistant is not None:
                    # Shared with the other assisted setting, and the draft's checkpoint may
                    # carry its own values: set all three before every run.
                    for name, value in assistant.items():
                        setattr(self.draft.generation_config, name, value)
                self.torch.manual_seed(s["seed"] + max(0, i - warmup))
                run_s, new = self._timed_generate(ids, kwargs)
                if i >= warmup:
                    records.append(dict(new_tokens=len(new), run_s=run_s, acceptance_rate=None,
                                        tokens_per_target_call=_ratio(len(new), self.calls),
                                        tokens=new))
            return dict(records=records, compile_s=None)
        return run_job

    def sweep_job(self, ids: list[int], settings):
        """A context-sweep job: greedy, EOS ignored (min_new_tokens), as specjax's."""
        ids = self.torch.tensor([ids])

        def seconds(new_tokens: int) -> float:
            kwargs = self._generate_kwargs(ids, new_tokens, temperature=0.0)
            return self._timed_generate(ids, dict(kwargs, min_new_tokens=new_tokens))[0]
        return lambda: _sweep_times(seconds, settings)

    def _generate_kwargs(self, ids, max_new_tokens: int, temperature: float) -> dict:
        eos = self.target.generation_config.eos_token_id
        kwargs = dict(attention_mask=self.torch.ones_like(ids), max_new_tokens=max_new_tokens,
                      pad_token_id=eos[0] if isinstance(eos, list) else eos)
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
        return kwargs

    def _timed_generate(self, ids, kwargs: dict) -> tuple[float, list[int]]:
        """Seconds and new tokens of one `generate` call; self.calls counts its target calls."""
        self.calls = 0
        start = time.perf_counter()
        with self.torch.inference_mode():
            out = self.target.generate(ids, **kwargs)
        return time.perf_counter() - start, out[0, ids.shape[1]:].tolist()


# -- Reports ------------------------------------------------------------------------------------

def _fmt(value, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _k_label(row: dict) -> str:
    """The K column: K for a chain, the widths for a token tree."""
    if row.get("tree") == HEADS_TREE:
        return "heads' tree"
    if row.get("schedule", CONSTANT) != CONSTANT:
        return f"≤{row['k']} {row['schedule']}"
    return f"tree {row['tree']}" if row.get("tree") else _fmt(row["k"], "d")


def markdown(results: dict, heading: bool = True) -> str:
    s, m = results["settings"], results["machine"]
    versions = ", ".join(f"{name} {m[name + '_version'] or '-'}"
                         for name in ("jax", "jaxlib", "numpy", "torch", "transformers"))
    lines = ["# specjax bench", ""] if heading else []
    lines += [f"Suite v{results['suite_version']}, {len(results['prompts'])} prompts; target "
              f"`{s['target']}`, draft `{s['draft']}`"
              + (f", heads `{s['heads']}`" if s.get("heads") else "") + f", {s['dtype']}; "
              f"max_new_tokens "
              f"{s['max_new_tokens']}, temperature {s['temperature']}; {s['reps']} timed run(s) "
              f"after {s['warmup']} warm-up run(s); medians over runs, then over prompts.",
              "",
              f"Machine: {m['cpu_model']}, {m['cpu_count']} cores ({m['threads']} usable), "
              f"{m['platform']}; Python {m['python']}, {versions}; jax on {m['device']}; "
              f"{results['created']}.", ""]
    lines += ["| engine | method | K | tokens/s | speedup | spread | vs specjax AR | spread | "
              "acceptance | tokens/call | step cost | c | theory | measured/theory | "
              "drafted/call |",
              "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in results["summary"]:
        lines.append(f"| {r['engine']} | {r['method']} | {_k_label(r)} | "
                     f"{_fmt(r['tokens_per_second'], ',.1f')} | {_fmt(r['speedup'], '.2f', 'x')} | "
                     f"{_fmt(r['speedup_spread'], '.1%')} | "
                     f"{_fmt(r['speedup_vs_specjax_autoregressive'], '.2f', 'x')} | "
                     f"{_fmt(r['speedup_vs_specjax_autoregressive_spread'], '.1%')} | "
                     f"{_fmt(r['acceptance_rate'], '.1%')} | {_fmt(r['tokens_per_target_call'])} | "
                     f"{_fmt(r.get('step_cost'))} | {_fmt(r['cost_ratio'], '.3f')} | "
                     f"{_fmt(r['theoretical_speedup'], '.2f', 'x')} | "
                     f"{_fmt(r['measured_over_theoretical'])} | "
                     f"{_fmt(r.get('mean_draft_length'))} |")
    lines += ["", f"spread: (max - min) / median of the ratio to its left over the {s['reps']} "
                  "timed run(s) of the suite (- with one run); vs specjax AR: tokens/s over "
                  "specjax's autoregressive tokens/s; step cost: tokens/call / speedup, the time "
                  "of one step (its target call and drafting) over an autoregressive step's; "
                  "tree w1,w2,..: the full token tree of those widths per depth; heads' tree: "
                  "the tree shipped with the Medusa heads; ≤K heuristic / confidence: at most K "
                  "drafted per step under that lookahead schedule (no chain theory); "
                  "drafted/call: tokens drafted per target call."]
    lines += ["", "By category (speedup / acceptance):", "",
              "| category | engine | method | K | tokens/s | speedup | acceptance | tokens/call | "
              "drafted/call |",
              "|---|---|---|--:|--:|--:|--:|--:|--:|"]
    for r in results["by_category"]:
        lines.append(f"| {r['category']} | {r['engine']} | {r['method']} | {_k_label(r)} | "
                     f"{_fmt(r['tokens_per_second'], ',.1f')} | {_fmt(r['speedup'], '.2f', 'x')} | "
                     f"{_fmt(r['acceptance_rate'], '.1%')} | {_fmt(r['tokens_per_target_call'])} | "
                     f"{_fmt(r.get('mean_draft_length'))} |")
    if results["context_sweep"]:
        n = s["context_decode_tokens"]
        lines += ["", f"Context sweep (greedy autoregressive, EOS ignored; prompt: the first N "
                      f"tokens of the {s['context_text']}; per token = (run of {1 + n} tokens - "
                      f"run of 1) / {n}; medians and spreads over {s['reps']} run(s)):", "",
                  "| context tokens | engine | prefill + first token | spread | per token | "
                  "spread | per token / shortest context's |",
                  "|--:|---|--:|--:|--:|--:|--:|"]
        for r in results["context_sweep"]:
            lines.append(f"| {r['context_tokens']:,} | {r['engine']} | "
                         f"{_fmt(r['prefill_s'], '.3f', ' s')} | "
                         f"{_fmt(r['prefill_spread'], '.1%')} | "
                         f"{_fmt(r['per_token_ms'], '.1f', ' ms')} | "
                         f"{_fmt(r['per_token_spread'], '.1%')} | "
                         f"{_fmt(r['per_token_over_shortest'], '.2f', 'x')} |")
    if results["notes"]:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in results["notes"]]
    return "\n".join(lines) + "\n"


def plots(results: dict, out: Path) -> list[str]:
    """The figures (module docstring); [] with a note when matplotlib is missing."""
    plt = pyplot(results)
    if plt is None:
        return []
    lines = {}
    for r in results["summary"]:
        if r["k"] is not None:
            lines.setdefault((r["engine"], r["method"], r.get("schedule", CONSTANT)),
                             []).append(r)
    written = []
    for name, metric, label in (("speedup_vs_k.png", "speedup", "speedup over autoregressive"),
                                ("acceptance_vs_k.png", "acceptance_rate", "acceptance rate")):
        fig, ax = plt.subplots(figsize=(6, 4))
        for (engine, method, schedule), group in sorted(lines.items()):
            series = f"{engine} {method}" + (f" {schedule}" if schedule != CONSTANT else "")
            group = [r for r in sorted(group, key=lambda r: r["k"]) if r[metric] is not None]
            if not group:
                continue
            style = "-o" if engine == "specjax" else ":s"
            line, = ax.plot([r["k"] for r in group], [r[metric] for r in group], style,
                            label=series)
            theory = [r for r in group if r["theoretical_speedup"] is not None]
            if metric == "speedup" and theory:
                ax.plot([r["k"] for r in theory], [r["theoretical_speedup"] for r in theory], "--",
                        color=line.get_color(), alpha=0.6, label=f"{series} (theory)")
        if metric == "speedup":
            ax.axhline(1.0, color="gray", lw=0.8)
            for r in results["summary"]:       # no K: transformers' own dynamic schedule
                if r["method"] == "speculative-dynamic" and r["speedup"] is not None:
                    ax.axhline(r["speedup"], color="tab:red", lw=1.0, ls="-.",
                               label=f"{r['engine']} speculative-dynamic (≤20, confidence)")
        ax.set_xticks(results["settings"]["ks"])
        ax.set_xlabel("K (tokens drafted per step)")
        ax.set_ylabel(label)
        ax.set_title(f"{results['settings']['target']}: {label}\n(median over prompts; "
                     f"{results['machine']['cpu_model']}, {results['created'][:10]})", fontsize=9)
        ax.legend(fontsize=8)
        _save(fig, out / name, results)
        written.append(name)
    written += _study_plots(results, lines, out, plt)
    return written


def _save(fig, path: Path, results: dict) -> None:
    """Writes a figure and records its legend's series under results["figures"]."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    results.setdefault("figures", {})[path.name] = [
        text.get_text() for ax in fig.axes if ax.get_legend() for text in ax.get_legend().texts]
    import matplotlib.pyplot as plt

    plt.close(fig)


def _study_plots(results, lines, out: Path, plt) -> list[str]:
    """tokens_per_call_vs_k.png (measured against (1 - a^(K+1)) / (1 - a) from the same run's
    a) and acceptance_by_position.png (the i.i.d. theory assumes one constant a)."""
    from specjax.generate import acceptance_by_position

    stamp = f"{results['machine']['cpu_model']}, {results['created'][:10]}"
    histograms = [r for r in results["summary"] if r.get("accepted_histogram")]
    if not histograms:          # recorded before the histogram existed: nothing to draw
        return []
    fig, ax = plt.subplots(figsize=(6, 4))
    for (engine, method, schedule), group in sorted(lines.items()):
        group = [r for r in sorted(group, key=lambda r: r["k"])
                 if r["tokens_per_target_call"] is not None]
        if engine != "specjax" or schedule != CONSTANT or not group:
            continue
        line, = ax.plot([r["k"] for r in group], [r["tokens_per_target_call"] for r in group],
                        "-o", label=f"{method}: measured")
        predicted = [(r["k"], expected_tokens_per_call(r["acceptance_rate"], r["k"]))
                     for r in group if r["acceptance_rate"] is not None]
        if predicted:
            ax.plot(*zip(*predicted), "--", color=line.get_color(), alpha=0.7,
                    label=f"{method}: (1 - a^(K+1)) / (1 - a), a = accepted / drafted")
        # Leviathan et al.'s alpha is the chance that a drafted token is accepted when it is
        # reached; accepted / drafted counts the drafts after a rejection as failures too, so
        # it falls with K. The first position's acceptance estimates alpha without that bias.
        first = [(r["k"], expected_tokens_per_call(acceptance_by_position(
                  r.get("accepted_histogram"))[0], r["k"]))
                 for r in group if r.get("accepted_histogram")]
        if first:
            ax.plot(*zip(*first), ":", color=line.get_color(), alpha=0.9,
                    label=f"{method}: the same, a = P(first draft accepted)")
    ax.set_xticks(results["settings"]["ks"])
    ax.set_xlabel("K (tokens drafted per step)")
    ax.set_ylabel("new tokens per target call")
    ax.set_title(f"{results['settings']['target']}: tokens per target call\n({stamp})",
                 fontsize=9)
    ax.legend(fontsize=7)
    _save(fig, out / "tokens_per_call_vs_k.png", results)

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in sorted(results["summary"], key=lambda r: (r["method"], r["k"] or 0)):
        if (r["engine"] != "specjax" or r.get("schedule", CONSTANT) != CONSTANT or r["k"] is None
                or r.get("tree") or not r.get("accepted_histogram")):
            continue
        by_position = acceptance_by_position(r["accepted_histogram"])
        ax.plot(range(1, len(by_position) + 1), by_position, "-o", ms=3,
                label=f"{r['method']} K={r['k']} (a = {r['acceptance_rate']:.2f})")
    ax.set_xticks(range(1, max(results["settings"]["ks"]) + 1))
    ax.set_xlabel("draft position i")
    ax.set_ylabel("P(i accepted | 1..i-1 accepted)")
    ax.set_title(f"{results['settings']['target']}: acceptance by draft position\n({stamp})",
                 fontsize=9)
    ax.legend(fontsize=7)
    _save(fig, out / "acceptance_by_position.png", results)
    return ["tokens_per_call_vs_k.png", "acceptance_by_position.png"]


# -- Machine and progress -----------------------------------------------------------------------

def _machine(peers) -> dict:
    import jax
    import jaxlib
    import numpy

    device = jax.devices()[0]
    return {"platform": platform.platform(), "python": platform.python_version(),
            "cpu_model": _cpu_model(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "threads": _threads(),
            "jax_version": jax.__version__, "jaxlib_version": jaxlib.__version__,
            "numpy_version": numpy.__version__, "torch_version": _version("torch"),
            "transformers_version": _version("transformers"),
            "backend": jax.default_backend(), "device": f"{device.platform} ({device.device_kind})",
            "torch_threads": peers.threads if peers else None}


def _cpu_model() -> str:
    """The CPU's name from /proc/cpuinfo on Linux; what `platform` knows elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str | None:
    """An installed package's version, without importing it; None when it is not installed."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class Progress:
    """A progress bar on stderr when it is a terminal; one line per job otherwise."""

    def __init__(self, total: int, stream=sys.stderr, width: int = 24):
        self.total, self.stream, self.width, self.done = total, stream, width, 0
        self.tty = stream.isatty()
        self.start = time.perf_counter()

    def update(self, label: str) -> None:
        self.done += 1
        if self.tty:
            filled = self.width * (self.done - 1) // max(self.total, 1)
            elapsed = time.perf_counter() - self.start
            self.stream.write(f"\r\x1b[Kbench [{'#' * filled}{'.' * (self.width - filled)}] "
                              f"{self.done}/{self.total} {elapsed:4.0f}s {label}")
        else:
            self.stream.write(f"bench {self.done}/{self.total}: {label}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
