"""The oracle lookahead analysis: how many draft tokens each step could have used.

    python -m specjax bench --oracle --preset smollm2 --ks 5 --out bench/smollm2-oracle

Mamou et al. (2024, "Dynamic Speculation Lookahead") define the oracle speculation lookahead of
a step as the number of draft tokens the target accepts when the draft keeps drafting until its
first mismatch with the target, at temperature 0. For every prompt of the bench suite this
module records, step by step of a greedy run:

  oracle      that number, from one teacher-forced draft pass over the target's greedy output:
              while the draft agrees with the target it is fed exactly the target's tokens, so
              its greedy guess at each position under teacher forcing is the guess it would make
              while drafting. A step starting at position t accepts the m guesses that agree
              from t on and emits m + 1 tokens (the target's own token after them); it costs one
              target call and m + 1 draft calls (the mismatching guess is drafted too).
  constant    K drafted every step, for each --ks K (real runs, step by step);
  heuristic   the heuristic schedule, at most the largest K;
  confidence  the confidence schedule (--confidence-threshold), at most the largest K.

Every schedule's tokens are the target's greedy tokens (checked). Writes oracle.json, oracle.md
and, with matplotlib, oracle_steps.png (the draft lengths of every step of the first prompt, as
in the paper's MBPP figure) and oracle_hist.png (the distribution of oracle lengths over the
suite beside the dynamic schedule's, as in its Alpaca figure).

Teacher forcing runs the draft on the whole sequence in one call, where decoding feeds it a few
positions at a time; the two agree to float rounding, so a near tie could in principle flip one
guess (the greedy tokens are checked against the schedules' runs, not against this pass).
"""

from __future__ import annotations

import datetime
from pathlib import Path

import numpy as np

from specjax.api.checks import check_compatible
from specjax.api.generate import generate, prepare
from specjax.api.methods import Speculative
from specjax.bench.common import Progress, encode_suite, machine, pyplot, write_report
from specjax.bench.prompts import SUITE
from specjax.decoding import loop
from specjax.io.checkpoint import load
from specjax.model.transformer import forward
from specjax.presets import CLIError, model_paths
from specjax.sampling.params import SamplingParams

SCHEMA = "specjax.bench.oracle/1"


def oracle_steps(matches: list[bool]) -> list[int]:
    """The oracle's accepted draft tokens per step: `matches[j]` says whether the draft's greedy
    guess for token j (given the target's tokens before it) equals the target's token j."""
    steps, t, n = [], 0, len(matches)
    while t < n:
        m = 0
        while t + m < n and matches[t + m]:
            m += 1
        steps.append(m)
        t += m + 1
    return steps


def draft_matches(draft, ids: list[int], continuation: list[int]) -> list[bool]:
    """Whether the draft's greedy guess at each position of `continuation` (after `ids`),
    teacher-forced on the target's tokens, equals the target's token."""
    seq = np.asarray([ids + continuation], np.int32)
    logits, _ = forward(draft.params, draft.config, seq, np.arange(seq.shape[1])[None])
    guesses = np.asarray(np.argmax(logits[0, len(ids) - 1:-1], axis=-1))
    return [bool(g == t) for g, t in zip(guesses, continuation)]


def schedule_steps(target, draft, ids: list[int], max_new_tokens: int, **options) -> dict:
    """One greedy run, step by step: tokens drafted and accepted at every step, and the tokens."""
    request = prepare(target, [ids], Speculative(draft, **options),
                      SamplingParams(temperature=0.0), max_new_tokens=max_new_tokens)
    spec, weights = request.spec, request.weights
    state = loop.init(spec, weights, *request.inputs)
    drafted, accepted = [], []
    while not bool(np.asarray(state.done)[0]):
        before = state
        state = loop.step(spec, weights, state)
        drafted.append(int(state.drafted[0] - before.drafted[0]))
        accepted.append(int(state.accepted[0] - before.accepted[0]))
    tokens = np.asarray(state.tokens)[0, len(ids):int(state.length[0])].tolist()
    return dict(drafted=drafted, accepted=accepted, draft_calls=int(state.draft_calls[0]),
                tokens=tokens)


def analyse(target, draft, prompts: list[dict], ks: list[int], threshold: float,
            progress=None) -> list[dict]:
    """Per prompt: the oracle and every schedule's per-step draft lengths and call counts."""
    out = []
    for p in prompts:
        greedy = generate(target, [p["ids"]], "autoregressive", SamplingParams(temperature=0.0),
                          max_new_tokens=p["max_new_tokens"]).tokens[0]
        oracle = oracle_steps(draft_matches(draft, p["ids"], greedy))
        end = len(greedy)
        positions = np.cumsum([0] + [m + 1 for m in oracle])[:-1]
        runs = {"oracle": dict(drafted=[m + 1 if t + m < end else m
                                        for t, m in zip(positions, oracle)],
                               accepted=oracle)}
        runs["oracle"]["draft_calls"] = sum(runs["oracle"]["drafted"])
        big = max(ks)
        settings = [(f"constant K={k}", dict(k=k)) for k in ks] + [
            (f"heuristic K<={big}", dict(k=big, k_schedule="heuristic")),
            (f"confidence K<={big}", dict(k=big, k_schedule="confidence",
                                          confidence_threshold=threshold))]
        for name, options in settings:
            if progress is not None:
                progress.update(f"{p['id']} {name}")
            run = schedule_steps(target, draft, p["ids"], p["max_new_tokens"], **options)
            if run.pop("tokens") != greedy:
                raise AssertionError(f"{p['id']} {name}: not the greedy output")
            runs[name] = run
        for run in runs.values():
            run["target_calls"] = len(run["accepted"])
        out.append(dict(prompt_id=p["id"], category=p["category"], new_tokens=len(greedy),
                        runs=runs))
    return out


def summary(per_prompt: list[dict]) -> list[dict]:
    """Totals over the suite per run kind: target and draft calls, mean drafted and accepted per
    step."""
    rows = []
    for name in per_prompt[0]["runs"]:
        runs = [p["runs"][name] for p in per_prompt]
        drafted = [d for r in runs for d in r["drafted"]]
        accepted = [a for r in runs for a in r["accepted"]]
        rows.append(dict(run=name, target_calls=sum(r["target_calls"] for r in runs),
                         draft_calls=sum(r["draft_calls"] for r in runs),
                         mean_drafted=float(np.mean(drafted)), mean_accepted=float(np.mean(accepted)),
                         steps=len(accepted)))
    return rows


def markdown(results: dict) -> str:
    s, m = results["settings"], results["machine"]
    lines = ["# specjax oracle lookahead", "",
             f"Target `{s['target']}`, draft `{s['draft']}`, greedy, suite v{s['suite_version']} "
             f"({len(results['prompts'])} prompts, up to {s['max_new_tokens']} new tokens each); "
             f"confidence threshold {s['confidence_threshold']}. Machine: {m['cpu_model']}, "
             f"{m['cpu_count']} cores; {results['created']}.", "",
             "| run | target calls | draft calls | drafted / step | accepted / step |",
             "|---|--:|--:|--:|--:|"]
    for r in results["summary"]:
        lines.append(f"| {r['run']} | {r['target_calls']:,} | {r['draft_calls']:,} | "
                     f"{r['mean_drafted']:.2f} | {r['mean_accepted']:.2f} |")
    lines += ["", "oracle: the draft drafts until its first mismatch with the target, so every "
                  "step accepts all it can (Mamou et al. 2024); its draft calls count the "
                  "mismatching guess. The other rows are real greedy runs of each schedule; all "
                  "give the same tokens."]
    return "\n".join(lines) + "\n"


def plots(results: dict, out: Path) -> list[str]:
    plt = pyplot(results)
    if plt is None:
        return []
    stamp = f"{results['machine']['cpu_model']}, {results['created'][:10]}"
    first = results["per_prompt"][0]
    runs = first["runs"]
    dynamic = [n for n in runs if n.startswith("confidence")][0]
    constant = [n for n in runs if n.startswith("constant")][-1]

    fig, ax = plt.subplots(figsize=(8, 3.8))
    steps = np.arange(len(runs["oracle"]["accepted"]))
    ax.bar(steps, runs["oracle"]["accepted"], color="tab:orange", label="oracle (accepted)")
    for name, style, colour in ((constant, "-", "tab:blue"), (dynamic, "--", "tab:green")):
        drafted = runs[name]["drafted"]
        ax.step(np.arange(len(drafted)), drafted, style, where="mid", color=colour,
                label=f"{name}: drafted ({runs[name]['target_calls']} target calls)")
    ax.set_xlabel("step (one target call each)")
    ax.set_ylabel("draft tokens")
    ax.set_title(f"{first['prompt_id']}: oracle {runs['oracle']['target_calls']} target calls",
                 fontsize=10)
    ax.legend(fontsize=7)
    fig.text(0.99, 0.01, stamp, ha="right", va="bottom", fontsize=6, color="gray")
    fig.tight_layout()
    fig.savefig(out / "oracle_steps.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 3.8))
    oracle = [a for p in results["per_prompt"] for a in p["runs"]["oracle"]["accepted"]]
    drafted = [d for p in results["per_prompt"] for d in p["runs"][dynamic]["drafted"]]
    top = max(oracle + drafted)
    bins = np.arange(top + 2) - 0.5
    ax.hist(oracle, bins=bins, alpha=0.6, color="tab:orange",
            label=f"oracle (mean {np.mean(oracle):.2f})")
    ax.hist(drafted, bins=bins, histtype="step", lw=1.5, color="tab:green",
            label=f"{dynamic}: drafted (mean {np.mean(drafted):.2f})")
    ax.set_xlabel("draft tokens in a step")
    ax.set_ylabel("steps")
    ax.set_title(f"{results['settings']['target']}: lookahead over the suite", fontsize=10)
    ax.legend(fontsize=7)
    fig.text(0.99, 0.01, stamp, ha="right", va="bottom", fontsize=6, color="gray")
    fig.tight_layout()
    fig.savefig(out / "oracle_hist.png", dpi=120)
    plt.close(fig)
    return ["oracle_steps.png", "oracle_hist.png"]


def run(args, settings: dict) -> int:
    """`bench --oracle`: the analysis on the bench suite, written to --out."""
    if settings["temperature"] != 0:
        raise CLIError("--oracle is a greedy analysis; drop --temperature")
    target_path, draft_path, no_draft = model_paths(args, True)
    if draft_path is None:
        raise CLIError(f"--oracle needs a draft model: {no_draft}")
    target = load(target_path, dtype=args.dtype)
    draft = load(draft_path, dtype=args.dtype)
    check_compatible(target, draft)
    notes: list[str] = []
    prompts = encode_suite(target, draft, SUITE["prompts"], settings, notes)
    progress = Progress(len(prompts) * (len(settings["ks"]) + 2))
    per_prompt = analyse(target, draft, prompts, settings["ks"], settings["confidence_threshold"],
                         progress)
    progress.close()
    results = {
        "schema": SCHEMA,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(None),
        "settings": dict(target=target.name, draft=draft.name, dtype=args.dtype,
                         suite_version=SUITE["version"], ks=settings["ks"],
                         max_new_tokens=settings["max_new_tokens"],
                         confidence_threshold=settings["confidence_threshold"]),
        "prompts": [{k: p[k] for k in ("id", "category", "prompt_tokens", "max_new_tokens")}
                    for p in prompts],
        "summary": summary(per_prompt),
        "per_prompt": per_prompt,
        "notes": notes,
    }
    write_report(args.out, "oracle", results, plots, markdown)
    return 0
