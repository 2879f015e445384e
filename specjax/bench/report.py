"""The suite's report: its rows, from the jobs' results (`specjax.bench.suite`): one per prompt
and engine, method, K or tree (medians over the timed runs, speedups against the engine's own
autoregressive row and specjax's, the cost ratio and the chain theory), their summary over the
prompts (`summarize`: a speedup is the ratio of median tokens/s) and the context sweep's; then
results.md's tables and the figures, drawn from results.json alone. The columns and the figures
are described in specjax.bench.suite's docstring.
"""

from __future__ import annotations

from pathlib import Path

from specjax.api.results import acceptance_by_position
from specjax.bench.common import (
    CONSTANT,
    DYNAMIC_PREFIX,
    HEADS_TREE,
    expected_tokens_per_call,
    fmt,
    median,
    pyplot,
    ratio,
    save_figure,
    spread,
    theoretical_speedup,
)


# -- The rows -------------------------------------------------------------------------------------

METRICS = ("tokens_per_second", "speedup", "speedup_vs_specjax_autoregressive", "acceptance_rate",
           "tokens_per_target_call", "step_cost", "cost_ratio", "theoretical_speedup",
           "measured_over_theoretical", "mean_draft_length", "prompt_tokens_per_second",
           "decode_tokens_per_second")
# llama.cpp's engines: "llama.cpp" at the bench's precision, "llama.cpp F16" and so on beside it.
LLAMACPP = "llama.cpp"
# Jobs that time something a row needs, not rows themselves.
HELPER_METHODS = ("draft-autoregressive", "prefill")


def sweep_rows(jobs) -> list[dict]:
    """One row per (context length, engine): medians and spreads over the timed pairs, and the
    per-token time over the same engine's at the shortest context measured."""
    rows = []
    for job in jobs:
        prefill, per_token = job["result"]["prefill_s"], job["result"]["per_token_s"]
        rows.append(dict(engine=job["engine"], context_tokens=job["context_tokens"],
                         prefill_s=median(prefill), prefill_spread=spread(prefill),
                         per_token_ms=1000 * median(per_token),
                         per_token_spread=spread(per_token), runs=len(prefill)))
    for row in rows:
        shortest = min((r for r in rows if r["engine"] == row["engine"]),
                       key=lambda r: r["context_tokens"])
        row["per_token_over_shortest"] = ratio(row["per_token_ms"], shortest["per_token_ms"])
    return rows


def rows(jobs, settings) -> list[dict]:
    """Per-prompt rows: medians over the timed runs, speedups, cost ratio and theory."""
    prompt_tokens = {job["prompt"]["id"]: len(job["prompt"]["ids"]) for job in jobs}
    measured = {}
    for job in jobs:
        measured[(job["prompt"]["id"], job["engine"], job["method"], job["k"],
                  job.get("tree"), job.get("schedule", CONSTANT))] = _measured(job)
    tokens = {key: row.pop("tokens") for key, row in measured.items()}
    found = []
    for (pid, engine, method, k, tree, schedule), row in measured.items():
        if method in HELPER_METHODS:
            continue
        _prompt_and_decode(row, measured.get((pid, engine, "prefill", None, None, CONSTANT)),
                           prompt_tokens[pid])
        own_ar = measured[(pid, engine, "autoregressive", None, None, CONSTANT)]
        specjax_ar = measured[(pid, "specjax", "autoregressive", None, None, CONSTANT)]
        _speedups(row, own_ar, specjax_ar)
        # Greedy decoding with any method is the target's greedy output: a live check.
        # (llama.cpp's runs report text, not tokens: no check for them.)
        own_tokens = tokens[(pid, engine, method, k, tree, schedule)]
        row["same_tokens_as_specjax_autoregressive"] = (
            own_tokens == tokens[(pid, "specjax", "autoregressive", None, None, CONSTANT)]
            if settings["temperature"] == 0 and own_tokens is not None else None)
        draft_ar = (measured[(pid, "specjax", "draft-autoregressive", None, None, CONSTANT)]
                    if engine == "specjax" and method == "speculative" else None)
        _cost_and_theory(row, specjax_ar, draft_ar)
        found.append(row)
    return found


def _measured(job) -> dict:
    """One job's row before the baselines: medians over its timed runs (and its tokens)."""
    recs = job["result"]["records"]
    per_run = [ratio(r["new_tokens"], r["run_s"]) for r in recs]
    return dict(
        prompt_id=job["prompt"]["id"], category=job["prompt"]["category"],
        engine=job["engine"], method=job["method"], k=job["k"], tree=job.get("tree"),
        schedule=job.get("schedule", CONSTANT),
        new_tokens=int(median([r["new_tokens"] for r in recs])),
        tokens_per_second=median(per_run), per_run_tokens_per_second=per_run,
        run_s=median([r["run_s"] for r in recs]), compile_s=job["result"]["compile_s"],
        acceptance_rate=median([r["acceptance_rate"] for r in recs]),
        tokens_per_target_call=median([r["tokens_per_target_call"] for r in recs]),
        mean_draft_length=median([r.get("mean_draft_length") for r in recs]),
        accepted_histogram=_pooled([r.get("accepted_histogram") for r in recs]),
        prompt_s=median([r.get("prompt_s") for r in recs]),
        decode_s=median([r.get("decode_s") for r in recs]),
        tokens=recs[0]["tokens"])


def _speedups(row: dict, own_ar: dict, specjax_ar: dict) -> None:
    """The row's speedups over the engine's own autoregressive row and specjax's, overall and
    per timed run."""
    row["speedup"] = ratio(row["tokens_per_second"], own_ar["tokens_per_second"])
    row["speedup_vs_specjax_autoregressive"] = ratio(row["tokens_per_second"],
                                                     specjax_ar["tokens_per_second"])
    # Timed run i against the baseline's run i, for the spread of the suite's ratios.
    for key, base in (("per_run_speedup", own_ar),
                      ("per_run_speedup_vs_specjax_autoregressive", specjax_ar)):
        row[key] = [ratio(a, b) for a, b in zip(row["per_run_tokens_per_second"],
                                                base["per_run_tokens_per_second"])]


def _cost_and_theory(row: dict, specjax_ar: dict, draft_ar: dict | None) -> None:
    """The row's cost ratio c (specjax's speculative: its draft's speed against the target's;
    n-gram: 0), the chain theory's speedup and the step cost."""
    engine, method, k, schedule = row["engine"], row["method"], row["k"], row["schedule"]
    cost = None
    if engine == "specjax" and method == "speculative":
        cost = ratio(specjax_ar["tokens_per_second"], draft_ar["tokens_per_second"])
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
    row["measured_over_theoretical"] = ratio(row["speedup"], row["theoretical_speedup"])
    # The time of one step (a target call and its drafting) over an autoregressive step's.
    row["step_cost"] = ratio(row["tokens_per_target_call"], row["speedup"])


def _prompt_and_decode(row: dict, prefill: dict | None, prompt_tokens: int) -> None:
    """The row's prompt speed (prompt tokens / prefill time) and decode speed: from the
    engine's own timings where it reports them (llama.cpp: its prompt and predicted times),
    else from its "prefill" job (the tokens after the first over the time after the
    prefill)."""
    prompt_s, decode_s = row.pop("prompt_s"), row.pop("decode_s")
    if prompt_s is None and prefill is not None:
        prompt_s = prefill["run_s"]
        rest = row["run_s"] - prompt_s
        decode = ratio(row["new_tokens"] - 1, rest) if rest > 0 else None
    else:
        decode = ratio(row["new_tokens"], decode_s)
    row["prompt_tokens_per_second"] = ratio(prompt_tokens, prompt_s)
    row["decode_tokens_per_second"] = decode


def summarize(rows: list[dict], category: str) -> list[dict]:
    """One row per (engine, method, K): medians over the prompts. A speedup is a ratio of the
    same statistic: the row's median tokens/s over its baseline's median tokens/s (the
    engine's own autoregressive row, or specjax's), so it equals the table's tokens/s column
    over the baseline's. The spread of each speedup is taken over the suite runs (module
    docstring); step cost and measured/theory follow from the speedup."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["engine"], row["method"], row["k"], row.get("tree"),
                           row.get("schedule", CONSTANT)), []).append(row)

    def baseline(engine: str) -> list[dict]:
        return groups.get((engine, "autoregressive", None, None, CONSTANT), [])

    # llama.cpp's fastest plain decoding, in whichever precision it ran fastest: end to end
    # and in decode tokens/s, each the fastest of its own column.
    plain = [rows for (engine, method, _, _, _), rows in groups.items()
             if engine.startswith(LLAMACPP) and method == "autoregressive"]
    fastest = {m: max((median([r[m] for r in g]) for g in plain), default=None,
                      key=lambda v: -1.0 if v is None else v)
               for m in ("tokens_per_second", "decode_tokens_per_second")}

    out = []
    for (engine, method, k, tree, schedule), group in groups.items():
        same = [r["same_tokens_as_specjax_autoregressive"] for r in group]
        medians = {m: median([r[m] for r in group]) for m in METRICS}
        spreads = {}
        for key, base in (("speedup", baseline(engine)),
                          ("speedup_vs_specjax_autoregressive", baseline("specjax"))):
            medians[key] = ratio(medians["tokens_per_second"],
                                 median([r["tokens_per_second"] for r in base]))
            spreads[key + "_spread"] = spread([
                ratio(a, b) for a, b in zip(_suite_runs(group, "per_run_tokens_per_second"),
                                            _suite_runs(base, "per_run_tokens_per_second"))])
        medians["step_cost"] = ratio(medians["tokens_per_target_call"], medians["speedup"])
        medians["vs_fastest_llamacpp"] = ratio(medians["tokens_per_second"],
                                               fastest["tokens_per_second"])
        medians["decode_vs_fastest_llamacpp"] = ratio(medians["decode_tokens_per_second"],
                                                      fastest["decode_tokens_per_second"])
        medians["measured_over_theoretical"] = ratio(medians["speedup"],
                                                     medians["theoretical_speedup"])
        out.append(dict(category=category, engine=engine, method=method, k=k, tree=tree,
                        schedule=schedule,
                        prompts=len(group),
                        **medians,
                        accepted_histogram=_pooled([r.get("accepted_histogram") for r in group]),
                        **spreads,
                        same_tokens_as_specjax_autoregressive=(
                            None if None in same else all(same))))
    return out


def _pooled(histograms) -> list[int] | None:
    """Histograms of accepted drafts per step, added up (None when there are none)."""
    histograms = [h for h in histograms if h]
    return [sum(col) for col in zip(*histograms)] if histograms else None


def _suite_runs(rows: list[dict], key: str) -> list[float | None]:
    """Suite run i's value: the median over the prompts of their timed run i's value."""
    return [median(run) for run in zip(*(r[key] for r in rows))]


# -- results.md and the figures --------------------------------------------------------------------

def k_label(row: dict) -> str:
    """The K column: K for a chain, the widths for a token tree."""
    if row.get("tree") == HEADS_TREE:
        return "drafter's tree" if row["method"] == "eagle" else "heads' tree"
    if row.get("schedule", CONSTANT) != CONSTANT:
        return f"≤{row['k']} {row['schedule']}"
    if (row.get("tree") or "").startswith(DYNAMIC_PREFIX):
        return row["tree"]
    return f"tree {row['tree']}" if row.get("tree") else fmt(row["k"], "d")


def markdown(results: dict, heading: bool = True) -> str:
    """results.md: the summary, the rows by category, the context sweep and the notes."""
    lines = (_header(results, heading) + _summary(results) + _prompt_apart(results)
             + _by_category(results) + _context_sweep(results))
    if results["notes"]:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in results["notes"]]
    return "\n".join(lines) + "\n"


def _header(results: dict, heading: bool) -> list[str]:
    """The title (with `heading`), the suite, the settings and the machine."""
    s, m = results["settings"], results["machine"]
    versions = ", ".join(f"{name} {m.get(name + '_version') or '-'}"
                         for name in ("jax", "jaxlib", "numpy", "torch", "transformers",
                                      "xllamacpp"))
    lines = ["# specjax bench", ""] if heading else []
    lines += [f"Suite v{results['suite_version']}, {len(results['prompts'])} prompts; target "
              f"`{s['target']}`, draft `{s['draft']}`"
              + (f", heads `{s['heads']}`" if s.get("heads") else "")
              + (f", drafter `{s['drafter']}`" if s.get("drafter") else "") + f", {s['dtype']}; "
              f"max_new_tokens "
              f"{s['max_new_tokens']}, temperature {s['temperature']}"
              + (f", top-p {s['top_p']}" if s.get("top_p", 1.0) < 1 else "")
              + f"; {s['reps']} timed run(s) "
              f"after {s['warmup']} warm-up run(s); medians over runs, then over prompts.",
              "",
              f"Machine: {m['cpu_model']}, {m['cpu_count']} cores ({m['threads']} usable), "
              f"{m['platform']}; Python {m['python']}, {versions}; jax on {m['device']}"
              + (f"; kernels: {', '.join(f'{k} {v}' for k, v in m['kernel_paths'].items())}"
                 if m.get("kernel_paths") else "")
              + (f", torch on {m['torch_device']}" if m.get("torch_device") else "")
              + f"; {results['created']}.", ""]
    return lines


def _summary(results: dict) -> list[str]:
    """The summary table over every prompt, and what its columns mean."""
    s = results["settings"]
    lines = ["| engine | method | K | tokens/s | speedup (ratio of medians) | spread | "
              "vs specjax AR | spread | "
              "acceptance | tokens/call | step cost | c | theory | measured/theory | "
              "drafted/call |",
              "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in results["summary"]:
        lines.append(f"| {r['engine']} | {r['method']} | {k_label(r)} | "
                     f"{fmt(r['tokens_per_second'], ',.1f')} | {fmt(r['speedup'], '.2f', 'x')} | "
                     f"{fmt(r['speedup_spread'], '.1%')} | "
                     f"{fmt(r['speedup_vs_specjax_autoregressive'], '.2f', 'x')} | "
                     f"{fmt(r['speedup_vs_specjax_autoregressive_spread'], '.1%')} | "
                     f"{fmt(r['acceptance_rate'], '.1%')} | {fmt(r['tokens_per_target_call'])} | "
                     f"{fmt(r.get('step_cost'))} | {fmt(r['cost_ratio'], '.3f')} | "
                     f"{fmt(r['theoretical_speedup'], '.2f', 'x')} | "
                     f"{fmt(r['measured_over_theoretical'])} | "
                     f"{fmt(r.get('mean_draft_length'))} |")
    lines += ["", "speedup: this row's tokens/s over the same engine's autoregressive tokens/s, "
                  "both medians over the prompts (so it is the ratio of the two numbers in the "
                  "tokens/s column); "
                  f"spread: (max - min) / median of the ratio to its left over the {s['reps']} "
                  "timed run(s) of the suite (- with one run); vs specjax AR: tokens/s over "
                  "specjax's autoregressive tokens/s, the same ratio of medians; step cost: "
                  "tokens/call / speedup, the time of one step (its target call and drafting) "
                  "over an autoregressive step's; "
                  "tree w1,w2,..: the full token tree of those widths per depth; heads' tree: "
                  "the tree shipped with the Medusa heads; drafter's tree: the one shipped with the EAGLE "
                  "drafter (its sampled default, if it has one, when sampling); ≤K heuristic / confidence: at most K "
                  "drafted per step under that lookahead schedule (no chain theory); "
                  "drafted/call: tokens drafted per target call."]
    return lines


def _prompt_apart(results: dict) -> list[str]:
    """Prompt and decode speeds apart, where the rows have them."""
    apart = any(r.get("prompt_tokens_per_second") is not None for r in results["summary"])
    # Results written before llama.cpp ran in several precisions have no such ratios.
    peer = any(r.get("vs_fastest_llamacpp") is not None for r in results["summary"])
    lines = [] if not apart else [
              "", "Prompt and decode apart (medians over prompts; prompt: prompt tokens / "
                  "prefill time; decode: the tokens after the first / the time after the "
                  "prefill, for llama.cpp its own prompt and predicted timings"
                  + ("; vs llama.cpp's fastest: the row's tokens/s over the fastest llama.cpp "
                     "plain decoding in the run, whatever its precision, in decode tokens/s "
                     "and end to end, each against the fastest of its own column" if peer
                     else "") + "):", "",
              "| engine | method | K | prompt tokens/s | decode tokens/s | end to end tokens/s |"
              + (" decode vs llama.cpp's fastest | end to end vs llama.cpp's fastest |"
                 if peer else ""),
              "|---|---|--:|--:|--:|--:|" + ("--:|--:|" if peer else "")]
    for r in results["summary"] if apart else ():
        lines.append(f"| {r['engine']} | {r['method']} | {k_label(r)} | "
                     f"{fmt(r.get('prompt_tokens_per_second'), ',.0f')} | "
                     f"{fmt(r.get('decode_tokens_per_second'), ',.1f')} | "
                     f"{fmt(r['tokens_per_second'], ',.1f')} |"
                     + (f" {fmt(r.get('decode_vs_fastest_llamacpp'), '.2f', 'x')} | "
                        f"{fmt(r.get('vs_fastest_llamacpp'), '.2f', 'x')} |" if peer else ""))
    return lines


def _by_category(results: dict) -> list[str]:
    """The rows by category."""
    lines = ["", "By category (speedup / acceptance; medians over the category's prompts):", "",
              "| category | engine | method | K | tokens/s | speedup (ratio of medians) | "
              "acceptance | tokens/call | drafted/call |",
              "|---|---|---|--:|--:|--:|--:|--:|--:|"]
    for r in results["by_category"]:
        lines.append(f"| {r['category']} | {r['engine']} | {r['method']} | {k_label(r)} | "
                     f"{fmt(r['tokens_per_second'], ',.1f')} | {fmt(r['speedup'], '.2f', 'x')} | "
                     f"{fmt(r['acceptance_rate'], '.1%')} | {fmt(r['tokens_per_target_call'])} | "
                     f"{fmt(r.get('mean_draft_length'))} |")
    return lines


def _context_sweep(results: dict) -> list[str]:
    """The context sweep's table, when it ran."""
    s, lines = results["settings"], []
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
                         f"{fmt(r['prefill_s'], '.3f', ' s')} | "
                         f"{fmt(r['prefill_spread'], '.1%')} | "
                         f"{fmt(r['per_token_ms'], '.1f', ' ms')} | "
                         f"{fmt(r['per_token_spread'], '.1%')} | "
                         f"{fmt(r['per_token_over_shortest'], '.2f', 'x')} |")
    return lines


def plots(results: dict, out: Path) -> list[str]:
    """The figures (specjax.bench.suite's docstring); [] with a note when matplotlib is missing."""
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
        save_figure(fig, out / name, results)
        written.append(name)
    written += _study_plots(results, lines, out, plt)
    return written


def _study_plots(results, lines, out: Path, plt) -> list[str]:
    """tokens_per_call_vs_k.png (measured against (1 - a^(K+1)) / (1 - a) from the same run's
    a) and acceptance_by_position.png (the i.i.d. theory assumes one constant a)."""
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
    save_figure(fig, out / "tokens_per_call_vs_k.png", results)

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
    save_figure(fig, out / "acceptance_by_position.png", results)
    return ["tokens_per_call_vs_k.png", "acceptance_by_position.png"]

