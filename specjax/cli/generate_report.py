"""What `generate` reports after streaming: each method timed with the compiled loop (one
untimed run, then the median of the timed ones), the prompt's prefill timed the same way, the
summary line, the comparison table and why a method is slower, and the --json report."""

from __future__ import annotations

import dataclasses
import statistics

from specjax.api.generate import generate, prepare
from specjax.api.methods import TYPES
from specjax.io.sidecar import tree_to_json
from specjax.sampling.params import SamplingParams


def timed_generate(request, runs: int = 3):
    """`generate` once untimed (it compiles, and pays every one-time cost), then `runs` timed
    runs; the stats carry the median run time and the first call's compile time. Returns
    (result, number of timed runs)."""

    first = generate(request)
    results = [generate(request) for _ in range(runs)]
    stats = dataclasses.replace(results[-1].stats, compile_s=first.stats.compile_s,
                                run_s=statistics.median(r.stats.run_s for r in results))
    return dataclasses.replace(results[-1], stats=stats), runs


def prefill_seconds(target, ids: list[int], sampling: SamplingParams, run: dict,
                    runs: int = 3) -> float:
    """The median time of an autoregressive run that makes one token: the prompt's prefill (the
    first token comes from its logits), timed as `timed_generate` times a method."""
    request = prepare(target, [ids], "autoregressive",
                      SamplingParams(temperature=sampling.temperature),
                      **dict(run, max_new_tokens=1))
    return timed_generate(request, runs)[0].stats.run_s


def decode_rate(stats, prefill_s: float) -> float | None:
    """Tokens per second after the prefill: the tokens past the first over the run time past
    the prefill's (None when there is no such time)."""
    rest = stats.run_s - prefill_s
    return (stats.new_tokens - 1) / rest if stats.new_tokens > 1 and rest > 0 else None


def prefill_line(prompt_tokens: int, prefill_s: float, runs: int) -> str:
    return (f"prompt: {prompt_tokens} tokens, prefill {prefill_s * 1e3:.1f} ms "
            f"({prompt_tokens / prefill_s:,.0f} tokens/s), median of {runs} runs")


def summary_line(stats, runs: int, prefill_s: float | None = None) -> str:
    acceptance = (f"acceptance {stats.acceptance_rate:.1%} ({stats.accepted}/{stats.drafted})"
                  if stats.method != "autoregressive" else "acceptance n/a")
    decode = decode_rate(stats, prefill_s) if prefill_s is not None else None
    return (f"[{stats.method}] {stats.new_tokens} tokens, {stats.tokens_per_second:,.1f} tokens/s"
            + (f", decode {decode:,.1f} tokens/s" if decode
               else ", decode n/a" if prefill_s is not None else "")
            + f" (median of {runs} runs, {stats.run_s:.3f} s; compile {stats.compile_s:.1f} s), "
            f"{acceptance}, {stats.tokens_per_target_call:.2f} tokens/target call"
            + (f", {stats.mean_draft_length:.2f} drafted/call"
               if TYPES[stats.method].chain else "")
            + (f" ({stats.tree_size} candidates per call)" if stats.tree_size else "")
            + (", steps accepting 0..{}: {}".format(len(stats.accepted_histogram) - 1, " ".join(
                map(str, stats.accepted_histogram))) if stats.accepted_histogram else ""))


def why_slower(stats, base) -> str | None:
    """One line for a method slower than autoregressive decoding in this run, saying why: its
    speedup is its tokens per target call over the cost of a step (the time per target call in
    autoregressive steps: the drafting and a wider verify call), and which of the two fell
    short. None for a method that is not slower, or without the baseline."""
    if base is None or stats.method == base.method or not stats.target_calls:
        return None
    speedup = stats.tokens_per_second / base.tokens_per_second if base.tokens_per_second else 0
    if speedup >= 1:
        return None
    step = (stats.run_s / stats.target_calls) / (base.run_s / base.target_calls)
    drafting = (f"{stats.draft_calls / stats.target_calls:.1f} draft calls and " if
                stats.draft_calls else "")
    return (f"{stats.method} is slower here ({speedup:.2f}x): {stats.tokens_per_target_call:.2f} "
            f"tokens per target call (acceptance {stats.acceptance_rate:.0%}) against a step "
            f"that costs {step:.2f} autoregressive steps ({drafting}a verify of "
            f"{stats.tree_size + 1} tokens)")


def comparison_table(rows, prefill_s: float) -> str:
    base = {m: s.tokens_per_second for m, s, _ in rows}.get("autoregressive")
    lines = [f"{'method':<16}{'tokens/s':>11}{'decode/s':>11}{'speedup':>9}{'acceptance':>12}"
             f"{'tokens/call':>13}"]
    for method, stats, _ in rows:
        speedup = f"{stats.tokens_per_second / base:.2f}x" if base else "-"
        acceptance = f"{stats.acceptance_rate:.1%}" if method != "autoregressive" else "-"
        decode = decode_rate(stats, prefill_s)
        lines.append(f"{method:<16}{stats.tokens_per_second:>11,.1f}"
                     f"{f'{decode:,.1f}' if decode else '-':>11}{speedup:>9}{acceptance:>12}"
                     f"{stats.tokens_per_target_call:>13.2f}")
    return "\n".join(lines)


# The keywords under which the methods take what they load (the draft, heads, a drafter).
WEIGHTS = {m.loads for m in TYPES.values() if m.loads}


def _loaded(objects: dict, keyword: str) -> str | None:
    """The name of the first running method's weights under `keyword` (heads, drafter)."""
    return next((getattr(o, keyword).name for m, o in objects.items()
                 if TYPES[m].loads == keyword), None)


def json_report(target, draft, prompt: str, ids: list[int], requests, objects, settings,
                args) -> dict:
    """`requests`, `objects`: each method's prepared request and its object; `settings`: the
    flags' options, sampling and run options, as the report shows them."""
    results = []
    methods = list(requests)
    prefill_s = prefill_seconds(target, ids, SamplingParams(temperature=settings["temperature"]),
                                {k: settings[k] for k in ("seed", "mesh")})
    for method, request in requests.items():
        result, runs = timed_generate(request)
        stats = result.stats.as_dict()
        stats["timed_runs"] = runs
        stats["decode_tokens_per_second"] = decode_rate(result.stats, prefill_s)
        results.append({"method": method, "text": (result.texts or [None])[0],
                        "tokens": result.tokens[0], "finish_reason": result.finish_reasons[0],
                        "stats": stats,
                        "logprobs": (None if result.logprobs is None else
                                     [t.as_dict() for t in result.logprobs[0]]),
                        "row_stats": [row.as_dict() for row in result.row_stats]})
    base = {r["method"]: r["stats"]["tokens_per_second"] for r in results}.get("autoregressive")
    for r in results:
        r["speedup_vs_autoregressive"] = r["stats"]["tokens_per_second"] / base if base else None
    return {"target": target.name, "target_path": str(target.path),
            "draft": draft.name if draft is not None and "speculative" in methods else None,
            "draft_path": str(draft.path) if draft is not None and "speculative" in methods else None,
            "prompt": prompt, "prompt_tokens": len(ids), "prefill_s": prefill_s,
            "heads": _loaded(objects, "heads"), "drafter": _loaded(objects, "drafter"),
            "settings": dict({k: v for k, v in settings.items() if k not in WEIGHTS and k != "mesh"},
                             chat=args.chat, dtype=args.dtype, method=args.method, mesh=args.mesh,
                             candidates=args.candidates,
                             tree=tree_to_json(settings["tree"])),
            "results": results}
