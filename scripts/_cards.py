"""Model cards and the index: the last stage, which writes the cards of the checkpoints this
script trains (weights/*/README.md) and the first part of weights/README.md from each one's
config.json and train_log.json (the drafters' part of it is written by hand: `HAND_KEPT`).

The prose is in Markdown templates under scripts/cards/, with `$name` placeholders filled by
`string.Template` (braces are plain text there); this module computes the values and puts the
sections together. A template that fills part of a line or paragraph (a "fragment") is used
without its file's final newline. `train.py model` and `evaluate` rewrite the cards of the
checkpoints they touch; `train.py index` writes the index.

This module also holds `flops_per_token`, which the cards state and which training and
evaluation record as draft/target cost ratios: it sits here, below both, so that neither
needs the other for it.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import _corpus

WEIGHTS = _corpus.REPO / "weights"
TEMPLATES = Path(__file__).resolve().parent / "cards"


def render(template: str, **values) -> str:
    """scripts/cards/`template` with its placeholders filled in."""
    text = (TEMPLATES / template).read_text(encoding="utf-8")
    return string.Template(text).substitute(values)


def fragment(template: str, **values) -> str:
    """A template that is part of a line or paragraph, without its file's final newline."""
    return render(template, **values).removesuffix("\n")


def flops_per_token(config) -> int:
    """Matrix-multiply FLOPs per token (2 per multiply-add), attention scores excluded."""
    d, f, n, kv, h = config.d_model, config.d_ff, config.n_heads, config.n_kv_heads, config.head_dim
    attn = d * (n + 2 * kv) * h + n * h * d
    mlp = (2 if config.arch == "gpt2" else 3) * d * f
    return 2 * (config.n_layers * (attn + mlp) + d * config.vocab_size)


# -- The cards of the shipped pairs (cards/model.md) --------------------------------------------

PAIRS = {"llama-draft": "llama-target", "gpt2-draft": "gpt2-target"}


def write_card(directory: Path) -> None:
    import specjax

    record = json.loads((directory / "train_log.json").read_text())
    config = specjax.ModelConfig.from_file(directory / "config.json")
    data, machine, hp = record["data"], record["machine"], record["hyperparameters"]
    name = directory.name
    role = "draft" if name.endswith("draft") else "target"
    partner = PAIRS.get(name) or {v: k for k, v in PAIRS.items()}.get(name)
    attention = ("multi-head" if config.n_kv_heads == config.n_heads else
                 f"grouped-query, {config.n_kv_heads} key/value heads")
    if config.arch == "gpt2":
        arch = ("GPT-2 (`GPT2LMHeadModel`): learned positions, LayerNorm, gelu_new MLP, biases, "
                "tied embeddings")
    else:
        arch = ("Llama (`LlamaForCausalLM`): RoPE (theta 10000), RMSNorm, SwiGLU MLP, no biases, "
                "untied LM head")
    spec = record.get("speculative")
    if spec:
        reference = ""
        ref = spec.get("reference_no_cache")
        if ref and spec["measured_with"].startswith("specjax.generate"):
            same = ref["drafted"] == spec["drafted"] and ref["accepted"] == spec["accepted"]
            reference = (" The cache-free reference in `scripts/train.py` (`greedy_speculative`) "
                         + ("gives the same counts." if same else
                            f"gives {ref['accepted']} of {ref['drafted']}."))
        speculative = fragment(
            "model-speculative.md", draft=spec["draft"], target=spec["target"], k=spec["k"],
            acceptance_rate=f"{spec['acceptance_rate']:.3f}", accepted=spec["accepted"],
            drafted=spec["drafted"],
            tokens_per_target_call=f"{spec['expected_tokens_per_target_call']:.2f}",
            cost_ratio_flops=f"{spec['cost_ratio_flops']:.3f}", prompts=spec["prompts"],
            prompt_tokens=spec["prompt_tokens"], new_tokens=spec["new_tokens"],
            measured_with=spec["measured_with"], reference=reference, command=spec["command"])
    else:
        speculative = "Not measured yet: run `python scripts/train.py evaluate` on the pair."
    if hp.get("teacher"):
        weight = hp["distill_weight"]
        teacher = Path(hp["teacher"]).name
        mix = ("" if weight == 1 else f" (weight {weight:g}; next-token cross-entropy "
                                      f"{1 - weight:g})")
        objective = (f"Distilled from [`{teacher}`](../{teacher}/): cross-entropy against the "
                     f"teacher's full next-token distribution{mix}, that is forward "
                     f"KL(teacher || draft) up to a constant, with the teacher's forward pass "
                     f"inside each training step,")
        pairing = "\n\n" + fragment("model-distillation.md")
    else:
        objective = "Next-token cross-entropy"
        pairing = ""
    how = ("trained from scratch, by distillation from its target, on the Python standard "
           "library's source\ncode" if hp.get("teacher") else
           "trained from scratch on the Python standard library's source\ncode")
    after = (f", and after training its teacher `weights/{Path(hp['teacher']).name}`"
             if hp.get("teacher") else "")
    held_out = ", ".join(f"`{f}`" for f in data["validation_files"])
    stop = (f" of a {record['resolved_steps']}-step schedule (`--stop-after "
            f"{record['steps_done']}`: the pair's first run was cut there by its wall-clock cap)"
            if record["stopped_by_minutes"] else "")
    text = render(
        "model.md", name=name, arch_name=arch.split(" (")[0], how=how, role=role,
        pair=name.split("-")[0], partner=partner, arch=arch,
        n_layers=config.n_layers, d_model=config.d_model, n_heads=config.n_heads,
        attention=attention, head_dim=config.head_dim, d_ff=config.d_ff,
        max_positions=config.max_positions, vocab_size=config.vocab_size,
        parameters=f"{record['parameters']:,}", flops_per_token=f"{flops_per_token(config):,}",
        python=data["python"],
        excluded_dirs=", ".join(f"`{d}`" for d in data["excluded_dirs"]
                                if d not in ("__pycache__", "site-packages")),
        skipped=len(data["skipped_not_utf8"]), holdout_rule=data["holdout_rule"],
        train_files=data["train_files"], train_tokens=f"{data['train_tokens']:,}",
        validation_files=len(data["validation_files"]),
        validation_tokens=f"{data['validation_tokens']:,}", held_out=held_out,
        objective=objective, context=hp["context"], batch=hp["batch"],
        weight_decay=hp["weight_decay"], lr=hp["lr"], warmup=hp["warmup"], clip=hp["clip"],
        seed=hp["seed"], pairing=pairing, steps_done=record["steps_done"], stop=stop,
        tokens_seen=f"{record['tokens_seen']:,}",
        epochs=f"{record['tokens_seen'] / data['train_tokens']:.2f}",
        train_minutes=f"{record['train_seconds'] / 60:.1f}", platform=machine["platform"],
        cpu_count=machine["cpu_count"], jax=machine["jax"], backend=machine["backend"],
        final_train_loss=f"{record['final_train_loss']:.3f}",
        val_loss=f"{record['val_loss']:.3f}", val_perplexity=f"{record['val_perplexity']:.1f}",
        val_tokens=f"{record['val_tokens']:,}",
        val_loss_float32=f"{record['val_loss_float32']:.4f}", speculative=speculative,
        after=after, command=record["command"])
    (directory / "README.md").write_text(text)


# -- The index (cards/index.md) ----------------------------------------------------------------

def write_index(args) -> None:
    rows = []
    for name in ("llama-draft", "llama-target", "gpt2-draft", "gpt2-target"):
        d = WEIGHTS / name
        if not (d / "train_log.json").exists():
            continue
        r = json.loads((d / "train_log.json").read_text())
        spec = r.get("speculative", {})
        size = sum(f.stat().st_size for f in d.iterdir()) / 2 ** 20
        hp = r["hyperparameters"]
        shape = f"{hp['arch']} {hp['layers']}L d{hp['d_model']} {hp['heads']}h"
        if hp["arch"] == "llama":
            shape += f"/{hp['kv_heads'] or hp['heads']}kv"
        rows.append(f"| [`{name}`]({name}/) | {shape} | {r['parameters'] / 1e6:.2f} M | "
                    f"{r['tokens_seen'] / 1e6:.1f} M | {r['val_loss']:.3f} | "
                    f"{r['val_perplexity']:.1f} | {spec.get('acceptance_rate', float('nan')):.3f} | "
                    f"{size:.1f} MB |")
    commands = ["python scripts/train.py tokenizer --out runs/tokenizer.json"]
    # A draft distilled from its target (--teacher) is trained after it.
    for name in ("llama-target", "llama-draft", "gpt2-target", "gpt2-draft"):
        if (WEIGHTS / name / "train_log.json").exists():
            commands.append(json.loads((WEIGHTS / name / "train_log.json").read_text())["command"])
    commands += ["python scripts/train.py evaluate --draft weights/llama-draft --target weights/llama-target",
                 "python scripts/train.py evaluate --draft weights/gpt2-draft --target weights/gpt2-target",
                 "python scripts/train.py index"]
    nl = "\n"
    python = (json.loads((WEIGHTS / "llama-draft" / "train_log.json").read_text())["data"]["python"]
              if (WEIGHTS / "llama-draft" / "train_log.json").exists() else "3.11")
    text = (render("index.md", rows=nl.join(rows), python=python, commands=nl.join(commands))
            + hand_kept())
    (WEIGHTS / "README.md").write_text(text)
    print((WEIGHTS / "README.md").read_text())


# The sections of weights/README.md on the drafters for a target (the SmolLM2 draft, Medusa
# heads, EAGLE drafters): those are made by `python -m specjax train` now, and their sections
# are written by hand below this line.
HAND_KEPT = ("<!-- Written by hand from here on: `python scripts/train.py index` rewrites only the "
             "part above. -->")


def hand_kept() -> str:
    """weights/README.md from HAND_KEPT on, as it is (nothing when the line is missing)."""
    index = WEIGHTS / "README.md"
    text = index.read_text() if index.exists() else ""
    at = text.find(HAND_KEPT)
    return "\n" + text[at:] if at >= 0 else ""

