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
from specjax.api.generate import generate, prepare
from specjax.api.methods import DEFAULT_K, TYPES, build_shared
from specjax.bench.common import (
    CONSTANT,
    DYNAMIC_PREFIX,
    HEADS_TREE,
    SWEEP_DECODE_TOKENS,
    Progress,
    encode_suite,
    load_pair,
    machine,
    sweep_times,
    timed_runs,
    write_report,
)
from specjax.bench.llamacpp import FASTEST_KINDS, GGUF_TYPES, LlamaCpp
from specjax.bench.peers import Peers
from specjax.bench.prompts import SUITE
from specjax.bench.report import k_label, markdown, plots, rows, summarize, sweep_rows
from specjax.bench.methods import PEERS
from specjax.io.checkpoint import load
from specjax.io.sidecar import tree_to_json
from specjax.presets import CLIError, heads_path, load_drafters, make_mesh, model_paths
from specjax.sampling.params import SamplingParams
from specjax.sampling.tree import DynamicTree, Tree, parse_widths

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

    prompt_jobs = jobs(prompts, settings, target, draft, peers,
                       dict(heads=heads, drafter=drafter, block_drafter=block_drafter),
                       llamacpp, [peer for peer in fastest if peer is not None])
    context_jobs = sweep_jobs(contexts, settings, target, peers)
    progress = Progress(len(prompt_jobs) + len(context_jobs))
    for job in prompt_jobs + context_jobs:
        progress.update(job["label"])
        job["result"] = job.pop("run")()
    progress.close()

    prompt_rows = rows(prompt_jobs, settings)
    categories = list(dict.fromkeys(p["category"] for p in prompts))
    results = {
        "schema": SCHEMA, "suite_version": SUITE["version"],
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(peers),
        "settings": _settings(settings, args, target, draft, heads, drafter, peers),
        "prompts": [{k: p[k] for k in ("id", "category", "chat", "prompt_tokens",
                                       "max_new_tokens")} for p in prompts],
        "rows": prompt_rows,
        "summary": summarize(prompt_rows, "all"),
        "by_category": [r for c in categories
                        for r in summarize([x for x in prompt_rows if x["category"] == c], c)],
        "context_sweep": sweep_rows(context_jobs),
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


# -- The jobs: one per (prompt, engine, method, K or tree), each a closure that runs the timed
# runs and returns their records, and one per (context length, engine) for the context sweep;
# `run` runs them and the report (`specjax.bench.report`) turns their results into rows.

def jobs(prompts, settings, target, draft, peers, beside=None, llamacpp=None,
         llamacpp_others=()) -> list[dict]:
    """One job per (prompt, engine, method, K or tree); `run` returns the timed runs' records.
    `beside`: the Medusa heads and the EAGLE drafter, {"heads": ..., "drafter": ...}. Per prompt
    and engine also a "prefill" job (specjax, transformers): autoregressive runs that make one
    token, whose time is the prompt's prefill (llama.cpp reports its own). `llamacpp_others`:
    llama.cpp in other precisions, plain decoding only (its fastest, `summarize`)."""
    beside = beside or {}
    found = []
    for p in prompts:
        ks = {m: settings["ks"] if TYPES[m].chain else [None]
              for m in settings["methods"]}
        for method in settings["methods"]:
            found += _method_jobs(p, method, ks[method], settings, target, draft, beside)
        if "speculative" in settings["methods"]:
            # The draft decoding on its own, for the cost ratio c.
            found.append(_job(p, "specjax", "draft-autoregressive", None,
                              _specjax_job(p, settings, draft, "autoregressive", None, None)))
        one_token = dict(p, max_new_tokens=1)
        found.append(_job(p, "specjax", "prefill", None,
                          _specjax_job(one_token, settings, target, "autoregressive", None,
                                       None)))
        found += _peer_jobs(p, one_token, ks, settings, peers, llamacpp, llamacpp_others)
    return found


def _job(prompt, engine, method, k, run_job, tree=None, schedule=CONSTANT) -> dict:
    """One job, labelled for the progress bar."""
    label = (f"{prompt['id']} {engine} {method}" + (f" K={k}" if k else "")
             + (f" tree {tree}" if tree else "")
             + (f" {schedule}" if schedule != CONSTANT else ""))
    return dict(prompt=prompt, engine=engine, method=method, k=k, tree=tree,
                schedule=schedule, label=label, run=run_job)


def _method_jobs(p, method: str, ks, settings, target, draft, beside) -> list[dict]:
    """specjax's jobs for one prompt and method: its own tree, its chains of each K (and
    schedule), then the --trees and --dynamic-trees it takes."""
    found = []
    if TYPES[method].own_tree:           # their own tree first
        found.append(_job(p, "specjax", method, None,
                          _specjax_job(p, settings, target, method, None, None, HEADS_TREE,
                                       beside), HEADS_TREE))
    if method == "eagle":                   # then chains of each K
        for k in settings["ks"]:
            found.append(_job(p, "specjax", method, k,
                              _specjax_job(p, settings, target, method, k, None, None, beside)))
    elif method == "dflash":                # its whole block, verified as a chain
        k = beside["block_drafter"].config.drafts
        found.append(_job(p, "specjax", method, k,
                          _specjax_job(p, settings, target, method, k, None, None, beside)))
        return found
    elif method != "medusa":
        for k in ks:
            for schedule in _method_schedules(method, settings):
                found.append(_job(p, "specjax", method, k,
                                  _specjax_job(p, settings, target, method, k, draft,
                                               schedule=schedule), schedule=schedule))
    for tree in settings["trees"] if method != "autoregressive" else []:
        found.append(_job(p, "specjax", method, None,
                          _specjax_job(p, settings, target, method, None, draft, tree, beside),
                          tree))
    for tree in settings["dynamic_trees"] if method == "eagle" else []:
        found.append(_job(p, "specjax", method, None,
                          _specjax_job(p, settings, target, method, None, draft, tree, beside),
                          tree))
    return found


def _peer_jobs(p, one_token, ks, settings, peers, llamacpp, llamacpp_others) -> list[dict]:
    """The other engines' jobs for one prompt: transformers (with its prefill), llama.cpp at
    the bench's precision, and llama.cpp's plain decoding in the others."""
    found = []
    if peers is not None:
        for method in (m for m in settings["methods"] if "transformers" in PEERS.get(m, ())):
            for k in ks[method]:
                found.append(_job(p, "transformers", method, k, peers.job(p, method, k)))
        if "speculative" in settings["methods"]:
            found.append(_job(p, "transformers", "speculative-dynamic", None,
                              peers.job(p, "speculative-dynamic", None)))
        found.append(_job(p, "transformers", "prefill", None,
                          peers.job(one_token, "autoregressive", None)))
    if llamacpp is not None:
        for method in (m for m in settings["methods"] if "llama.cpp" in PEERS.get(m, ())):
            for k in ks[method]:
                found.append(_job(p, llamacpp.engine, method, k, llamacpp.job(p, method, k)))
    for other in llamacpp_others:
        found.append(_job(p, other.engine, "autoregressive", None,
                          other.job(p, "autoregressive", None)))
    return found


def _drafters_tree(drafter, temperature):
    """The tree an EAGLE drafter ships (its sampled one when sampling), or a chain of
    `DEFAULT_K` if it ships none: the "drafter's tree" row runs it in every dtype, where
    `Eagle` left to itself runs the dtype's measured tree (`api.methods.EAGLE_TREES`)."""
    own = drafter.sampled_tree if temperature > 0 else None
    return own or drafter.tree or Tree.chain(DEFAULT_K)


def _method_schedules(method: str, settings) -> list[str]:
    """The lookahead schedules that apply to `method` among --k-schedules."""
    if method == "speculative":
        return settings["k_schedules"]
    if method == "ngram":
        return [s for s in settings["k_schedules"] if s != "confidence"]
    return [CONSTANT]


def _specjax_job(prompt, settings, model, method, k, draft, tree=None, beside=None,
                 schedule=CONSTANT):
    def run_job() -> dict:
        if method == "medusa":
            extra = dict(heads=beside["heads"])
        elif method == "eagle":          # K: a chain of K; otherwise the row's tree
            extra = dict(drafter=beside["drafter"],
                         tree=Tree.chain(k) if k else _tree(tree) or _drafters_tree(
                             beside["drafter"], settings["temperature"]))
        elif method == "dflash":         # the first K of the block's drafts
            extra = dict(drafter=beside["block_drafter"], k=k)
        else:
            extra = dict(draft=draft, k=k or 1)
        if schedule != CONSTANT:
            extra["k_schedule"] = schedule
        if "drafter_dtype" in TYPES[method].options() and settings.get("drafter_dtype"):
            extra["drafter_dtype"] = settings["drafter_dtype"]
        if schedule == "confidence":
            extra["confidence_threshold"] = settings["confidence_threshold"]
        if TYPES[method].loads != "drafter":
            extra["tree"] = _tree(tree)
        request = prepare(model, [prompt["ids"]],
                          build_shared(method, max_ngram=settings["max_ngram"], **extra),
                          SamplingParams(temperature=settings["temperature"],
                                         top_p=settings["top_p"]),
                          max_new_tokens=prompt["max_new_tokens"], mesh=make_mesh(settings["mesh"]))
        results, compile_s = timed_runs(settings, lambda seed: generate(request.reseeded(seed)))
        records = [dict(new_tokens=s.new_tokens, run_s=s.run_s,
                        acceptance_rate=s.acceptance_rate if s.drafted else None,
                        tokens_per_target_call=s.tokens_per_target_call,
                        mean_draft_length=(s.mean_draft_length
                                           if method != "autoregressive" else None),
                        accepted_histogram=list(s.accepted_histogram), tokens=r.tokens[0])
                   for r, s in ((r, r.stats) for r in results)]
        return dict(records=records, compile_s=compile_s)
    return run_job


def _tree(label: str | None):
    """A row's tree from its label: None (a chain, or the heads' or drafter's own tree), the
    full tree of "3,2,1", or the dynamic tree of "dynamic 4,4,8"."""
    if not label or label == HEADS_TREE:
        return None
    if label.startswith(DYNAMIC_PREFIX):
        return DynamicTree.parse(label[len(DYNAMIC_PREFIX):])
    return parse_widths(label)


def sweep_jobs(contexts, settings, target, peers) -> list[dict]:
    """One job per (context length, engine); `run` returns the timed runs' seconds."""
    found = []
    for c in contexts:
        n = c["context_tokens"]
        found.append(dict(engine="specjax", context_tokens=n, label=f"context {n} specjax",
                          run=_specjax_sweep_job(c["ids"], settings, target)))
        if peers is not None:
            found.append(dict(engine="transformers", context_tokens=n,
                              label=f"context {n} transformers",
                              run=peers.sweep_job(c["ids"], settings)))
    return found


def _specjax_sweep_job(ids, settings, target):
    def seconds(new_tokens: int) -> float:
        return generate(target, [ids], "autoregressive", SamplingParams(temperature=0.0),
                        max_new_tokens=new_tokens, eos_ids=(),
                        mesh=make_mesh(settings["mesh"])).stats.run_s
    return lambda: sweep_times(seconds, settings)
