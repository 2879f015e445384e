"""The bench suite's rows, from its jobs' results (`specjax.bench.suite_jobs`): one per prompt
and engine, method, K or tree (medians over the timed runs, speedups against the engine's own
autoregressive row and specjax's, the cost ratio and the chain theory), their summary over the
prompts (`summarize`: a speedup is the ratio of median tokens/s), and the context sweep's."""

from __future__ import annotations

from specjax.bench.common import CONSTANT, median, ratio, spread, theoretical_speedup

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
