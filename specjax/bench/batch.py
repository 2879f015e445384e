"""`python -m specjax bench --batch 1,8,32`: throughput of many rows decoded at once.

For each batch size B, the batch is B prompts of the suite's short categories (code completion,
code editing, prose and chat, in suite order, cycled to fill B rows: ragged lengths, as a user's
many prompts are), each decoding up to --max-new-tokens and stopping at its EOS, in ONE
`specjax.generate` call: --warmup untimed runs, then --reps timed ones; medians reported.

  tokens/s      new tokens of all rows / run time (prefill included, compile time not)
  speedup       tokens/s over specjax autoregressive's at the same B, same run
  tokens/call   new tokens per target call, per row (`Stats.tokens_per_target_call`)
  idle          the share of rows x loop iterations spent on rows that had already finished
                (`Stats.idle_fraction`): the loop runs while any row is active
  v             the verify cost: one target call on B rows of K + 1 tokens over one on B rows
                of 1 token, timed on the engine's own forward with a cache (median of --reps
                after one untimed call; rows at position 64 of a 128-slot cache)
  c             the draft's cost ratio: a draft call on B rows of one token over a target
                call on B rows of one token, timed the same way
  = AR          greedy only: every row's tokens equal specjax autoregressive's at the same B
  cost model    tokens/call / (c K + v): the speedup if a step cost exactly its target and
                draft calls. Leviathan et al. 2023 (Eq. 1, Theorem 3.8) take v = 1, true while
                a call is bound by reading the weights; a batch makes each call do B times the
                arithmetic per weight read, v grows toward K + 1 once arithmetic dominates,
                and what speculation saves shrinks (the serving regime of Liu et al. 2024,
                "Optimizing Speculative Decoding for Serving Large Language Models Using
                Goodput", and of Chen et al. 2024, "MagicDec"). Measuring v at each B puts
                that in the model instead of assuming it away.

transformers (when installed, not with --quick or --no-peers): `generate` with left padding on
the same B prompts, greedy or sampled as specjax, autoregressive only: its assisted generation
and prompt lookup raise "assisted generate is only supported for batch_size = 1".

Writes batch.json (with the machine and settings, as results.json), batch.md and, with
matplotlib, tokens_per_second_vs_batch.png and speedup_vs_batch.png into --out.
"""

from __future__ import annotations

import datetime
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from specjax.api.checks import check_compatible
from specjax.api.generate import generate, prepare
from specjax.api.methods import build_shared
from specjax.bench.common import (
    Progress,
    encode_suite,
    fmt,
    load_pair,
    machine,
    median,
    pyplot,
    ratio,
    save_figure,
    spread,
    timed_runs,
    write_report,
)
from specjax.bench.peers import Peers
from specjax.bench.methods import PEERS
from specjax.bench.prompts import SUITE
from specjax.model.cache import KVCache
from specjax.api.forward import kernels_of
from specjax.model.transformer import forward
from specjax.presets import CLIError, make_mesh, model_paths
from specjax.sampling.params import SamplingParams

CALL_POSITION, CALL_SLOTS = 64, 128      # where the timed target/draft calls write


def run(args, settings) -> int:
    """`bench --batch`: the batch sweep, written to --out."""
    notes: list[str] = []
    target_path, draft_path, no_draft = model_paths(args, "speculative" in settings["methods"])
    methods = [m for m in settings["methods"] if "transformers" in PEERS.get(m, ())]
    if "speculative" in methods and draft_path is None:
        methods.remove("speculative")
        notes.append(f"speculative skipped: {no_draft}")
    dropped = [m for m in settings["methods"] if m not in methods and m != "speculative"]
    if dropped:
        notes.append(f"not in the batch sweep: {', '.join(dropped)} (batch sizes are for "
                     "autoregressive, speculative and ngram)")
    target, draft = load_pair(target_path, draft_path if "speculative" in methods else None,
                              args.dtype, settings, notes)
    if draft is not None:
        check_compatible(target, draft)
    short = [e for e in SUITE["prompts"] if e["category"] != "long-code-editing"]
    prompts = encode_suite(target, draft, short, dict(settings, quick=False), notes)
    if not prompts:
        raise CLIError("no prompt of the suite fits the target's context window")
    peer_notes: list[str] = []
    peers = (Peers.create(target, draft, settings, args.dtype, peer_notes)
             if settings["peers"] else None)
    notes += [n for n in peer_notes if "speculative-dynamic" not in n]   # not run here

    jobs = _jobs(settings["batch"], prompts, methods, settings, target, draft, peers)
    progress = Progress(len(jobs))
    for job in jobs:
        progress.update(f"B={job['batch']} {job['engine']} {job['method']}"
                        + (f" K={job['k']}" if job["k"] else ""))
        job["result"] = job.pop("run")()
    progress.close()

    results = {
        "schema": 1, "suite_version": SUITE["version"],
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(peers),
        "settings": {**{k: settings[k] for k in ("batch", "ks", "reps", "warmup",
                                                 "max_new_tokens", "temperature", "top_p", "seed",
                                                 "max_ngram")},
                     "methods": methods, "target": target.name, "target_path": str(target.path),
                     "draft": draft.name if draft is not None else None,
                     "dtype": args.dtype, "peers": peers is not None,
                     "prompts": [p["id"] for p in prompts],
                     "prompt_tokens": [p["prompt_tokens"] for p in prompts]},
        "rows": batch_rows(jobs, sampled=settings["temperature"] > 0),
        "notes": notes,
    }
    write_report(args.out, "batch", results, plots, markdown,
                 printed=lambda r: markdown(r, heading=False))
    return 0

def _jobs(batches, prompts, methods, settings, target, draft, peers) -> list[dict]:
    """One job per (batch size, engine, method, K), and one timing the calls at each batch size;
    a batch of B rows holds the prompts in turn."""
    jobs = []
    for b in batches:
        rows = [prompts[i % len(prompts)] for i in range(b)]
        for method in methods:
            for k in settings["ks"] if method != "autoregressive" else [None]:
                jobs.append(dict(batch=b, engine="specjax", method=method, k=k,
                                 run=_specjax_job(rows, settings, target, draft, method, k)))
        if peers is not None:
            jobs.append(dict(batch=b, engine="transformers", method="autoregressive", k=None,
                             run=_peer_job(peers, rows, settings)))
        jobs.append(dict(batch=b, engine="specjax", method="call-times", k=None,
                         run=_call_times_job(target, draft, b, settings)))
    return jobs


# -- Measurements -------------------------------------------------------------------------------

def _specjax_job(rows, settings, target, draft, method, k):
    def run_job() -> dict:
        options = dict(k=k or 1, max_ngram=settings["max_ngram"], draft=draft,
                       drafter_dtype=settings["drafter_dtype"])
        request = prepare(target, [p["ids"] for p in rows],
                          build_shared(method, **options),
                          SamplingParams(temperature=settings["temperature"],
                                         top_p=settings["top_p"]),
                          max_new_tokens=min(p["max_new_tokens"] for p in rows),
                          mesh=make_mesh(settings["mesh"]))
        results, compile_s = timed_runs(settings, lambda seed: generate(request.reseeded(seed)))
        records = [dict(new_tokens=r.stats.new_tokens, run_s=r.stats.run_s,
                        target_calls=r.stats.target_calls, drafted=r.stats.drafted,
                        accepted=r.stats.accepted, idle_fraction=r.stats.idle_fraction,
                        tokens=r.tokens) for r in results]
        return dict(records=records, compile_s=compile_s)
    return run_job


def _peer_job(peers, rows, settings):
    """transformers' generate on the same rows, left-padded, counting each row's new tokens up
    to and including its first EOS (what specjax counts)."""
    torch = peers.torch

    def run_job() -> dict:
        longest = max(p["prompt_tokens"] for p in rows)
        pad = 0
        ids = torch.tensor([[pad] * (longest - len(p["ids"])) + p["ids"] for p in rows],
                           device=peers.device)
        mask = torch.tensor([[0] * (longest - len(p["ids"])) + [1] * len(p["ids"]) for p in rows],
                            device=peers.device)
        kwargs = peers.generate_kwargs(ids, min(p["max_new_tokens"] for p in rows),
                                        settings["temperature"], settings["top_p"])
        kwargs["attention_mask"] = mask
        eos = peers.target.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos])
        records = []
        warmup = max(1, settings["warmup"])
        for i in range(warmup + settings["reps"]):
            torch.manual_seed(settings["seed"] + max(0, i - warmup))
            start = time.perf_counter()
            with torch.inference_mode():
                out = peers.target.generate(ids, **kwargs).tolist()
            run_s = time.perf_counter() - start
            tokens = [_until_eos(row[longest:], eos) for row in out]
            if i >= warmup:
                records.append(dict(new_tokens=sum(map(len, tokens)), run_s=run_s,
                                    target_calls=None, tokens=tokens))
        return dict(records=records, compile_s=None)
    return run_job


def _until_eos(tokens: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[:i + 1]
    return tokens


def _call_times_job(target, draft, batch, settings):
    """Seconds of one target call on [B, T] tokens for T = 1 and each K + 1, and of one draft
    call on [B, 1]: the v and c of the module docstring."""
    def run_job() -> dict:
        sizes = sorted({1, *(k + 1 for k in settings["ks"])})
        times = {f"target_{t}": call_seconds(target, batch, t, settings["reps"]) for t in sizes}
        if draft is not None:
            times["draft_1"] = call_seconds(draft, batch, 1, settings["reps"])
        return times
    return run_job


def call_seconds(model, batch: int, tokens: int, reps: int) -> float:
    """Median seconds of one jitted forward call on `batch` rows of `tokens` tokens that write
    a cache at CALL_POSITION, after one untimed call."""
    config = model.config.replace(kernels=kernels_of())          # the kernels as generate's
    call = jax.jit(lambda params, t, p, c: forward(params, config, t, p, c)[0])
    ids = jnp.zeros((batch, tokens), jnp.int32)
    positions = jnp.broadcast_to(CALL_POSITION + jnp.arange(tokens, dtype=jnp.int32),
                                 (batch, tokens))
    cache = KVCache.init(config, batch, CALL_SLOTS)
    jax.block_until_ready(call(model.params, ids, positions, cache))
    seconds = []
    for _ in range(max(3, reps)):
        start = time.perf_counter()
        jax.block_until_ready(call(model.params, ids, positions, cache))
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def batch_rows(jobs, sampled: bool = False) -> list[dict]:
    """Per (batch, engine, method, K): medians, speedup over specjax AR, cost model; whether a
    method's tokens equal specjax autoregressive's (greedy only: sampled methods need not)."""
    times = {j["batch"]: j["result"] for j in jobs if j["method"] == "call-times"}
    rows, base = [], {}
    for job in (j for j in jobs if j["method"] != "call-times"):
        recs = job["result"]["records"]
        per_run = [ratio(r["new_tokens"], r["run_s"]) for r in recs]
        row = dict(batch=job["batch"], engine=job["engine"], method=job["method"], k=job["k"],
                   tokens_per_second=median(per_run), spread=spread(per_run),
                   compile_s=job["result"]["compile_s"],
                   new_tokens=median([r["new_tokens"] for r in recs]),
                   tokens_per_target_call=median(
                       [ratio(r["new_tokens"], r["target_calls"]) for r in recs]),
                   acceptance_rate=median(
                       [ratio(r.get("accepted"), r.get("drafted")) for r in recs]),
                   idle_fraction=median([r.get("idle_fraction") for r in recs]),
                   tokens=recs[0]["tokens"])
        if job["engine"] == "specjax" and job["method"] == "autoregressive":
            base[job["batch"]] = row
        rows.append(row)
    for row in rows:
        ar = base.get(row["batch"])
        row["speedup"] = ratio(row["tokens_per_second"], ar and ar["tokens_per_second"])
        row["same_tokens_as_specjax_autoregressive"] = (
            None if sampled or ar is None or row is ar or row["engine"] != "specjax"
            else row["tokens"] == ar["tokens"])
        t = times.get(row["batch"], {})
        k = row["k"]
        row["v"] = row["c"] = row["cost_model"] = None
        if row["engine"] == "specjax" and k and t.get("target_1"):
            row["v"] = t[f"target_{k + 1}"] / t["target_1"]
            row["c"] = (t["draft_1"] / t["target_1"]
                        if row["method"] == "speculative" and "draft_1" in t else 0.0)
            row["cost_model"] = ratio(row["tokens_per_target_call"], row["c"] * k + row["v"])
    for row in rows:
        row.pop("tokens")
    return rows


# -- Reports ------------------------------------------------------------------------------------

def markdown(results: dict, heading: bool = True) -> str:
    s, m = results["settings"], results["machine"]
    lines = []
    if heading:
        lines += [f"# specjax batch sweep: {s['target']}"
                  + (f" + {s['draft']}" if s["draft"] else ""), "",
                  f"{results['created']} · {m['cpu_model']} ({m['threads']} threads) · "
                  f"jax {m['jax_version']} · temperature {s['temperature']}"
                  + (f", top-p {s['top_p']}" if s.get("top_p", 1.0) < 1 else "") + " · "
                  f"{s['max_new_tokens']} new tokens per row (fewer at EOS) · "
                  f"{s['reps']} timed runs", ""]
    lines += ["| B | engine | method | K | tokens/s | speedup (ratio of medians) | tokens/call | "
              "idle | v | c | cost model | spread | = AR |",
              "|--:|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|:-:|"]
    same = {True: "yes", False: "NO", None: ""}
    for r in results["rows"]:
        lines.append(f"| {r['batch']} | {r['engine']} | {r['method']} | {r['k'] or ''} | "
                     f"{fmt(r['tokens_per_second'], '.1f')} | {fmt(r['speedup'], '.2f', 'x')} | "
                     f"{fmt(r['tokens_per_target_call'])} | {fmt(r['idle_fraction'], '.0%')} | "
                     f"{fmt(r['v'])} | {fmt(r['c'])} | {fmt(r['cost_model'], '.2f', 'x')} | "
                     f"{fmt(r['spread'], '.0%')} | "
                     f"{same[r['same_tokens_as_specjax_autoregressive']]} |")
    if results["notes"]:
        lines += [""] + [f"- {n}" for n in results["notes"]]
    return "\n".join(lines) + "\n"


def plots(results: dict, out: Path) -> list[str]:
    plt = pyplot(results)
    if plt is None:
        return []
    rows, written = results["rows"], []
    batches = results["settings"]["batch"]
    stamp = f"{results['machine']['cpu_model']}, {results['created'][:10]}"
    key = lambda r: f"{r['engine']} {r['method']}" + (f" K={r['k']}" if r["k"] else "")  # noqa: E731
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name in dict.fromkeys(key(r) for r in rows):
        pts = [(r["batch"], r["tokens_per_second"]) for r in rows if key(r) == name]
        ax.plot(*zip(*pts), marker="o", label=name)
    ax.set(xscale="log", xlabel="batch size B", ylabel="total new tokens / s")
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_title(f"{results['settings']['target']}: throughput by batch size\n({stamp})",
                 fontsize=9)
    ax.legend(fontsize=8)
    save_figure(fig, out / "tokens_per_second_vs_batch.png", results)
    written.append("tokens_per_second_vs_batch.png")
    drafting = [r for r in rows if r["engine"] == "specjax" and r["k"]]
    if drafting:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for name in dict.fromkeys(key(r) for r in drafting):
            pts = [r for r in drafting if key(r) == name]
            line, = ax.plot([r["batch"] for r in pts], [r["speedup"] for r in pts], marker="o",
                            label=f"{name} measured")
            ax.plot([r["batch"] for r in pts], [r["cost_model"] for r in pts], ls="--",
                    color=line.get_color(), label=f"{name} cost model")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set(xscale="log", xlabel="batch size B", ylabel="speedup over autoregressive at B")
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set_title(f"{results['settings']['target']}: speedup by batch size, measured and "
                     f"tokens/call / (cK + v)\n({stamp})", fontsize=9)
        ax.legend(fontsize=7)
        save_figure(fig, out / "speedup_vs_batch.png", results)
        written.append("speedup_vs_batch.png")
    return written
