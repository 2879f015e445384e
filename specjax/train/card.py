"""The model card `python -m specjax train` writes beside a trained drafter (README.md): what it
is and for which target, the command that made it, the format and who reads it, the data and
settings, and the held-out evaluation, all read from the run's log (train_log.json), so that the
card and the log never disagree."""

from __future__ import annotations

import shlex
from pathlib import Path

from specjax.api.methods import TYPES

# What each --format is, and what reads it (docs/training.md, "Serving the result").
FORMATS = {
    "eagle": "the EAGLE repository's layout (`config.json`, `model.safetensors`), which the EAGLE "
             "repository's code, SpecForge and SGLang read",
    "speculators": "vllm-project/speculators' layout, which vLLM reads",
    "medusa": "FasterDecoding's Medusa layout (`config.json`, `medusa_lm_head.safetensors`)",
    "hf": "a Hugging Face `LlamaForCausalLM` with the target's tokenizer, which any engine's "
          "draft-model speculation reads",
    "specjax": "specjax's own layout, which `specjax.load` reads",
    "dflash": "the DFlash authors' layout (`config.json` with `dflash_config`, "
              "`model.safetensors`), which their code and the engines that serve DFlash read",
}


def render(out: Path, log: dict, command: list[str]) -> str:
    """The card of the drafter in `out`, from its run's `log` and the `command` line (the
    arguments after `python -m specjax`) that made it."""
    what, method, option = _kind(log)
    target = log["target"]
    lines = [f"# {out.name}", "",
             f"{what} for the target `{target}`, trained by `python -m specjax train` "
             f"(specjax {log.get('specjax', '?')}) in {_duration(log.get('seconds'))}"
             f"{_host(log)}. Decoding with it in specjax is exact: at temperature 0 the output "
             f"is the target's greedy output, and when sampling it keeps the target's "
             f"distribution.",
             "", "```",
             f"python -m specjax generate --target {shlex.quote(target)} --method {method} "
             f"{option} {shlex.quote(str(out))} --prompt \"...\"",
             "```", "",
             "## Made by", "", "```", "python -m specjax " + shlex.join(command), "```", "",
             "Run again, the same command resumes an interrupted run from its checkpoints (in "
             "`--work`, OUT.work by default); from scratch, on the same machine with the same "
             "data, seed and versions, it gives the same weights.", "",
             "## Format", "",
             f"`--format {log['format']}`: {FORMATS.get(log['format'], log['format'])}. "
             + _needs(method), ""]
    lines += ["## Data and training", "",
              f"{log['train_sequences']:,} sequences of the target's own continuations to train "
              f"on; {log['held_out_prompts']} prompts held out for the evaluation below.", "",
              "| setting | value |", "|---|---|"]
    # The vocabulary written (all of the target's for a published EAGLE-1/2 drafter) in place
    # of the setting, which that kind does not read.
    lines += [f"| {name} | {_cell(value)} |" for name, value in log["config"].items()
              if not (name == "draft_vocab" and "draft_vocab" in log)]
    for name in ("taps", "draft_vocab", "init"):
        if log.get(name) is not None:
            lines.append(f"| {name} | {_cell(log[name])} |")
    if "draft" in log:
        lines += [f"| draft {name} | {_cell(value)} |" for name, value in log["draft"].items()]
    lines += [""] + _evaluation(log, method)
    return "\n".join(lines).rstrip() + "\n"


def _kind(log: dict) -> tuple[str, str, str]:
    """(what the drafter is, the `--method` that runs it, the option that passes it)."""
    if "draft" in log:
        return "A draft model (a small Llama)", "speculative", "--draft"
    if log.get("kind") == "eagle3":
        return "An EAGLE-3 drafter (Li et al. 2025)", "eagle", "--drafter"
    if log.get("kind") == "dflash":
        return "A DFlash block drafter (arXiv 2602.06036)", "dflash", "--drafter"
    if log.get("kind") == "eagle1":
        style = log["config"].get("style", "published")
        return ("An EAGLE-1/2 drafter (Li et al. 2024)" if style == "published" else
                "An EAGLE-1-style drafter in specjax's variant"), "eagle", "--drafter"
    return (f"{log['config'].get('heads', '?')} Medusa-1 heads (Cai et al. 2024)", "medusa",
            "--heads")


def _needs(method: str) -> str:
    if method == "speculative":
        return ("It drafts for any model with the target's tokenizer; it was trained on this "
                "target's outputs.")
    reads = ("hidden states and embeddings" if TYPES[method].loads == "drafter"
             else "final hidden states")
    return f"It runs only with the target it was trained for: it reads that model's {reads}."


def _evaluation(log: dict, method: str) -> list[str]:
    if "tokens_per_target_call_t0" not in log:
        return ["## Held-out evaluation", "", "None: the run held out no prompts."]
    lines = ["## Held-out evaluation", "",
             f"On the {log['held_out_prompts']} held-out prompts, {_trees(log, method)}:", "",
             "| temperature | tokens per target call | acceptance by depth |", "|--:|--:|---|"]
    for t in ("0", "1"):
        depths = ", ".join("-" if a is None else f"{a:.3f}"
                           for a in log.get(f"acceptance_by_position_t{t}", []))
        lines.append(f"| {t} | {log[f'tokens_per_target_call_t{t}']:.3f} | {depths} |")
    lines += ["", "Acceptance at depth i: of the steps that reached it, the share that accepted "
              "the i-th drafted token as well. Tokens per target call are the new tokens over "
              "the target's decoding calls (1 is autoregressive decoding's); their worth in "
              "time depends on what a call costs on the machine that runs it."]
    if log.get("tree_search"):
        lines += ["", "The dynamic trees tried, timed on the machine that trained it:", "",
                  "| tree (depth, top-k, total) | tokens per call | step, in autoregressive "
                  "steps | speed-up |", "|---|--:|--:|--:|"]
        lines += [f"| {', '.join(map(str, row['tree']))} | {row['tokens_per_call']} | "
                  f"{row['step_cost']} | {row['speedup']} |" for row in log["tree_search"]]
    return lines


def _trees(log: dict, method: str) -> str:
    """How the evaluation decoded: the tree or chain for greedy and for sampled rows."""
    if method == "speculative":
        return "decoded with a chain of the draft's tokens (`--k` 4, the default)"
    if method == "dflash":
        return (f"each step verifying its whole block of {log['config']['block_size'] - 1} "
                f"drafts as a chain")
    if method == "medusa":
        tree = log.get("tree")
        if not tree:
            return "decoded with a chain of one candidate per head"
        return (f"decoded with the {len(tree['paths'])}-node tree searched from the heads' "
                f"held-out rank accuracies ({tree['expected_tokens_per_call']} tokens per call "
                f"expected), written into the config")
    greedy, sampled = log.get("tree"), log.get("sampled_tree")
    if sampled is None:             # the greedy rows' tree (or chain) at every temperature
        return f"decoded with {_tree(greedy)} at every temperature, written into the config"
    return (f"decoded with {_tree(greedy)} for greedy rows and {_tree(sampled)} for sampled "
            f"rows, both written into the config")


def _tree(tree) -> str:
    if tree is None:                # generate's default k
        return "a chain of 4"
    if isinstance(tree, dict) and "dynamic" in tree:
        depth, top_k, total = tree["dynamic"]
        return f"EAGLE-2's dynamic tree (depth {depth}, top-k {top_k}, {total} tokens)"
    if all(set(path) == {0} for path in tree):
        return f"a chain of {len(tree)}"
    return f"a static tree of {len(tree)} nodes"


def _cell(value) -> str:
    return "none" if value is None else ", ".join(map(str, value)) if isinstance(
        value, (list, tuple)) else str(value)


def _duration(seconds) -> str:
    if seconds is None:
        return "an unrecorded time"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _host(log: dict) -> str:
    host = log.get("host") or {}
    if not host:
        return ""
    cores = f", {host['cores']} cores" if host.get("cores") else ""
    where = f"{host.get('cpu', '?')}{cores}"
    device = host.get("device") or "cpu"
    if not device.startswith("cpu"):
        where = f"{device} (host: {where})"
    return f" on {where}, jax {host.get('jax', '?')}"
