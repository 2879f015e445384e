"""The suite's report: results.md's tables and the figures, drawn from results.json alone (the
columns and the figures are described in specjax.bench.suite's docstring).
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
    pyplot,
    save_figure,
)


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

