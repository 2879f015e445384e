"""Model cards and the index: the last stage, which writes weights/*/README.md and
weights/README.md from each checkpoint's config.json and train_log.json.

The prose is in Markdown templates under scripts/cards/, with `$name` placeholders filled by
`string.Template` (braces are plain text there); this module computes the values and puts the
sections together. A template that fills part of a line or paragraph (a "fragment") is used
without its file's final newline. `train.py model`, `evaluate` and `evaluate-draft` rewrite the
cards of the checkpoints they touch; `train.py index` writes the index.

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
    if "target" in record:
        return write_distilled_card(directory, record)
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


# -- The card of a draft for a real target (cards/distilled.md) ---------------------------------

def write_distilled_card(directory: Path, record: dict) -> None:
    """The card of a draft trained for a real target (`--tokenizer-from`, `--extra-corpus`)."""
    import specjax

    config = specjax.ModelConfig.from_file(directory / "config.json")
    data, extra, machine, hp = record["data"], record["extra"], record["machine"], record["hyperparameters"]
    name, target = directory.name, record["target"]
    ev = record.get("evaluation")
    model_mb = (directory / "model.safetensors").stat().st_size / 2 ** 20
    dir_mb = sum(f.stat().st_size for f in directory.iterdir()) / 2 ** 20
    tokens = record["tokens_seen"]
    extra_share = record["extra_windows_per_batch"] / hp["batch"]
    extra_seen = round(tokens * extra_share)
    shaped = (" " + fragment("distilled-shaped-prompts.md", shaped_prompts=extra["shaped_prompts"],
                             code_new_tokens=extra["code_new_tokens"])
              if extra.get("shaped_prompts") else "")
    train_min, gen_min = record["train_seconds"] / 60, extra["seconds"] / 60
    if ev:
        rows = []
        for r in ev["table"]:
            rows.append(f"| {r['prompts']} | {r['temperature']:g} | {r['k']} | "
                        f"**{r['acceptance_rate']:.3f}** | {r['tokens_per_target_call']:.2f} | "
                        f"{r['flops_speedup']:.2f}x |")
        exact = ev["greedy_equals_autoregressive"]
        sp = ev["speed"]
        ks = [str(k) for k in sp["ks"]]
        speed_rows = "\n".join(
            f"| {e['prompt'] + 1} | {e['autoregressive_tok_s']:.1f} | "
            + " | ".join(f"{e['speculative'][k]['tok_s']:.1f} | **{e['speculative'][k]['speedup']:.2f}x** | "
                         f"{e['speculative'][k]['tokens_per_target_call']:.2f}" for k in ks)
            + f" | {e['measured_cost_ratio']:.3f} |" for e in sp["per_prompt"])
        speed_head = ("| code prompt | autoregressive tok/s | "
                      + " | ".join(f"K={k}: tok/s | speedup | tokens per target call" for k in ks)
                      + " | draft/target time per token |")
        speed_rule = "|---|---|" + "---|---|---|" * len(ks) + "---|"
        medians = ", ".join(f"**{sp['speedup_median'][k]:.2f}x** at K={k}" for k in ks)
        nl = "\n"
        evaluation = fragment(
            "distilled-evaluation.md", new_tokens=ev["new_tokens"], seed=ev["seed"],
            code_rows=ev["table"][0]["rows"], prompt_tokens_code=ev["prompt_tokens_code"],
            chat_questions=len(ev["chat_questions"]), rows=nl.join(rows),
            cost_ratio_flops=f"{ev['cost_ratio_flops']:.3f}",
            greedy_exact=("yes, for all " + str(len(exact)) + " (prompts, K) runs"
                          if all(exact.values()) else "NO: " + str(exact)),
            cpu_count=ev["machine"]["cpu_count"], load_before=sp["load_average"][0],
            load_after=sp["load_average"][1], speed_prompts=sp["prompts"], runs=sp["runs"],
            speed_head=speed_head, speed_rule=speed_rule, speed_rows=speed_rows,
            medians=medians, command=ev["command"])
    else:
        evaluation = (f"Not measured yet: `python scripts/train.py evaluate-draft --draft "
                      f"weights/{name} --target {target}`.")
    summary = "see the table"
    if ev:
        best = {(r["prompts"], r["temperature"], r["k"]): r["tokens_per_target_call"] for r in ev["table"]}
        summary = (f"{best.get(('code', 0.0, 4), float('nan')):.2f} tokens per target call on code and "
                   f"{best.get(('chat', 0.0, 4), float('nan')):.2f} on chat, greedy, K=4")
    if hp.get("teacher"):
        objective = (f"Cross-entropy against the target's full next-token distribution (weight "
                     f"{hp['distill_weight']:g}) mixed with next-token cross-entropy, the target's "
                     f"forward pass inside each training step")
        objective_note = ""
    else:
        objective = "Next-token cross-entropy"
        objective_note = " " + fragment("distilled-no-logit-distillation.md")
    commands = ["python -m specjax fetch smollm2", extra["command"], record["command"]]
    if ev:
        commands.append(ev["command"])
    nl = "\n"
    text = render(
        "distilled.md", name=name, target=target, n_layers=config.n_layers,
        d_model=config.d_model, total_minutes=f"{train_min + gen_min:.0f}", summary=summary,
        rope_theta=f"{config.rope_theta:g}", n_heads=config.n_heads, head_dim=config.head_dim,
        d_ff=config.d_ff, context=hp["context"], max_positions=config.max_positions,
        vocab_size=config.vocab_size, bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_ids[0], parameters=f"{record['parameters']:,}",
        embedding_parameters=f"{config.vocab_size * config.d_model:,}",
        target_parameters=f"{record['target_parameters']:,}",
        flops_per_token=f"{flops_per_token(config):,}",
        cost_ratio_flops=f"{record['cost_ratio_flops']:.3f}", model_mb=f"{model_mb:.1f}",
        dir_mb=f"{dir_mb:.1f}",
        lm_head_share=f"{config.vocab_size * config.d_model / (flops_per_token(config) / 2):.0%}",
        init_embeddings_kept=f"{record['init_embeddings_kept']:.0%}",
        init_embeddings_std=hp["init_embeddings_std"], seed=hp["seed"], python=data["python"],
        train_tokens=f"{data['train_tokens']:,}",
        validation_tokens=f"{data['validation_tokens']:,}",
        validation_files=len(data["validation_files"]), chat_prompts=extra["chat_prompts"],
        chat_new_tokens=extra["chat_new_tokens"], code_prompts=extra["code_prompts"],
        code_prompt_len=extra["code_prompt_len"], code_new_tokens=extra["code_new_tokens"],
        shaped=shaped, generated_tokens=f"{extra['generated_tokens']:,}",
        extra_train_tokens=f"{extra['train_tokens']:,}",
        extra_validation_tokens=f"{extra['validation_tokens']:,}",
        validation_every=extra["validation_every"], generation_minutes=f"{gen_min:.1f}",
        batch=hp["batch"], extra_windows_per_batch=record["extra_windows_per_batch"],
        objective=objective, weight_decay=hp["weight_decay"], lr=hp["lr"],
        warmup=hp["warmup"], clip=hp["clip"], objective_note=objective_note,
        steps_done=record["steps_done"], tokens_seen=f"{tokens:,}",
        stdlib_seen=f"{tokens - extra_seen:,}",
        stdlib_epochs=f"{(tokens - extra_seen) / data['train_tokens']:.2f}",
        extra_seen=f"{extra_seen:,}", extra_epochs=f"{extra_seen / extra['train_tokens']:.1f}",
        train_minutes=f"{train_min:.1f}", platform=machine["platform"],
        cpu_count=machine["cpu_count"], jax=machine["jax"], backend=machine["backend"],
        final_train_loss=f"{record['final_train_loss']:.3f}",
        val_loss=f"{record['val_loss']:.3f}", val_perplexity=f"{record['val_perplexity']:.1f}",
        val_tokens=f"{record['val_tokens']:,}", val_loss_extra=f"{record['val_loss_extra']:.3f}",
        val_loss_float32=f"{record['val_loss_float32']:.4f}", evaluation=evaluation,
        commands=nl.join(commands))
    (directory / "README.md").write_text(text)


# -- The index (cards/index.md, cards/index-real-drafts.md) -------------------------------------

DRAFTS_FOR_REAL_MODELS = ("smollm2-draft",)


def real_model_drafts_section() -> str:
    """The index's section on drafts trained for fetched targets (empty when there are none)."""
    rows, commands = [], []
    for name in DRAFTS_FOR_REAL_MODELS:
        d = WEIGHTS / name
        if not (d / "train_log.json").exists():
            continue
        r = json.loads((d / "train_log.json").read_text())
        hp, ev = r["hyperparameters"], r.get("evaluation", {})
        rate = {(e["prompts"], e["temperature"], e["k"]): e["acceptance_rate"]
                for e in ev.get("table", [])}
        size = (d / "model.safetensors").stat().st_size / 2 ** 20
        calls = {(e["prompts"], e["temperature"], e["k"]): e["tokens_per_target_call"]
                 for e in ev.get("table", [])}
        cells = " | ".join(f"{rate.get((p, t, 4), float('nan')):.3f} ({calls.get((p, t, 4), float('nan')):.2f})"
                           for p in ("code", "chat") for t in (0.0, 1.0))
        speedup = ev.get("speed", {}).get("speedup_median", {}).get("4", float("nan"))
        rows.append(f"| [`{name}`]({name}/) | {r['target']} | llama {hp['layers']}L d{hp['d_model']} tied | "
                    f"{r['parameters'] / 1e6:.2f} M | {r['cost_ratio_flops']:.3f} | {cells} | "
                    f"{speedup:.2f}x | {size:.1f} MB |")
        commands += [r["extra"]["command"], r["command"]] + ([ev["command"]] if ev else [])
    if not rows:
        return ""
    nl = "\n"
    return "\n" + render("index-real-drafts.md", rows=nl.join(rows), commands=nl.join(commands))


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
    real = real_model_drafts_section()
    python = (json.loads((WEIGHTS / "llama-draft" / "train_log.json").read_text())["data"]["python"]
              if (WEIGHTS / "llama-draft" / "train_log.json").exists() else "3.11")
    text = (render("index.md", rows=nl.join(rows), python=python, commands=nl.join(commands))
            + real + medusa_section())
    (WEIGHTS / "README.md").write_text(text)
    print((WEIGHTS / "README.md").read_text())


HEADS = ("llama-medusa", "smollm2-medusa")


def tokens_per_call(record: dict) -> str:
    """The shipped tree's tokens per target call: measured on held-out prompts when the tree
    was chosen by `medusa-tree`, else the card's model of it."""
    choice = record.get("tree_choice")
    if choice:
        row = next(r for r in choice["rows"] if r["tree"] == record["tree"])
        return f"{row['tokens_per_target_call']:.2f} (measured)"
    return f"{record['expected_tokens_per_call']:.2f} (expected)"


def medusa_section() -> str:
    """The index's section on the shipped Medusa heads (empty when there are none)."""
    rows, commands = [], []
    for name in HEADS:
        d = WEIGHTS / name
        if not (d / "train_log.json").exists():
            continue
        r = json.loads((d / "train_log.json").read_text())
        c = json.loads((d / "config.json").read_text())
        size = (d / "model.safetensors").stat().st_size / 2 ** 20
        rows.append(f"| [`{name}`]({name}/) | {r['target']} | {c['num_heads']} x {c['num_blocks']} | "
                    f"{c['projection']['tokens']:,} | {', '.join(f'{a:.2f}' for a in r['top1'])} | "
                    f"{len(r['tree'])} nodes, {max(len(p) for p in r['tree'])} deep | "
                    f"{tokens_per_call(r)} | {size:.1f} MB |")
        if r["target"] == "smollm2":
            commands.append("python -m specjax fetch smollm2")
        commands += [d["command"] for d in r["data"]] + [r["command"]]
        for extra in ("labels_comparison", "tree_choice"):
            if r.get(extra):
                commands.append(r[extra]["command"])
    if not rows:
        return ""
    nl = "\n"
    return "\n" + render("index-medusa.md", rows=nl.join(rows), commands=nl.join(commands))


# -- Medusa heads (cards/medusa.md) -------------------------------------------------------------

# Shipped drafters that `python -m specjax train` has remade from their own data, measured
# against them (scripts/compare_drafters.py; bench/train-tiny-llama-reproduction/): the cards'
# "With `python -m specjax train`" section ends with this.
_TINY_DATA = ("python -m specjax train data --preset tiny-llama --import data/eagle/llama.npz "
              "--out runs/tiny-data --max-length 256")
REPRODUCTIONS = {
    "llama-eagle": f"""

**Remade with them**, from this drafter's own data (`data/eagle/llama.npz`, imported with the
same held-out documents), its loss, subset and learning-rate schedule, 452 steps of 27
documents (about the same epochs):

```
{_TINY_DATA}
python -m specjax train eagle --preset tiny-llama --data runs/tiny-data --held-out 68 --style specjax --format specjax --subset 1024 --unroll 1 --learning-rate 5e-3 --warmup 46 --clip 1.0 --batch 27 --steps 452 --eval-every 0 --out runs/tiny-eagle
```

On the 68 held-out prompts (64 new tokens, this drafter's chain of 4), the remade drafter gives
3.056 tokens per target call at T = 0 and 2.133 at T = 1, against these weights' 3.045 and
2.183: 100% and 98% (`bench/train-tiny-llama-reproduction/`).""",
    "llama-medusa": f"""

**Remade with them**, from the continuations these heads trained on (`data/eagle/llama.npz`
keeps that set: the same 104,928 generated tokens, imported with the same held-out documents;
the command also trains on its 600 original-text documents, which these heads left out), 4
subset heads of the 1,024 most frequent tokens, this recipe's loss weights and learning-rate
schedule, 2,280 steps of 8 documents (about the same epochs):

```
{_TINY_DATA}
python -m specjax train medusa --preset tiny-llama --data runs/tiny-data --held-out 68 --format specjax --head subset --subset 1024 --heads 4 --blocks 1 --decay 0.8 --learning-rate 1e-3 --warmup 50 --clip 1.0 --batch 8 --steps 2280 --eval-every 0 --out runs/tiny-medusa
```

On the 68 held-out prompts (64 new tokens) with these heads' tree, the remade heads give 2.059
tokens per target call at T = 0 and 1.377 at T = 1, against these heads' 2.083 and 1.311: 99%
and 105% (2.130 and 1.379 with the chain of their 4 heads; `bench/train-tiny-llama-reproduction/`).
With `--leave-out text-original` on the import it trains on exactly these heads' documents
(1,536 steps for the same 12 epochs): 96% and 99% on this tree, 100% and 99% with the chain.
The command also searches a tree of its own; priced by this small target's verify calls timed
alone (`--verify-cost calls`, before whole steps were timed), it keeps a single node, fewer
tokens per call (1.580) for the cheapest call: pass `--verify-cost flat` for the most tokens
per call.""",
    "smollm2-eagle": """

**Its last round, remade with them**: `train eagle --style specjax --subset 8192 --format
specjax --init` from round three's weights (this card's history, git `a7aab63`), on all of
`data/eagle2` imported by `train data --import` (the same held-out prompts), with this round's
loss, noise, passes and schedule, 796 steps of 20 documents (the final states read from the
EAGLE-3 features pass of docs/training.md):

```
mkdir -p runs/smollm2-eagle-round3
for f in config.json model.safetensors; do git show a7aab63:weights/smollm2-eagle/$f > runs/smollm2-eagle-round3/$f; done
python -m specjax train data --preset smollm2 --import data/eagle2/smollm2 --out runs/eagle2
python -m specjax train features --preset smollm2 --data runs/eagle2 --out runs/eagle2-features --taps 2,15,27 --features-dtype float16
python -m specjax train eagle --preset smollm2 --data runs/eagle2 --features runs/eagle2-features --features-dtype float16 --style specjax --subset 8192 --format specjax --init runs/smollm2-eagle-round3 --unroll 2 --decay 0.8 --noise 0.1 --batch 20 --learning-rate 0.0015 --warmup 30 --clip 1.0 --steps 796 --seed 4 --held-out 8 --out runs/eagle1-round4
```

On the 10 held-out chat questions (EAGLE-2's dynamic tree of 4 levels of the top 4, 8 nodes,
at both temperatures; 64 new tokens), the remade round gives 2.222 tokens per target call at
T = 0 and 1.763 at T = 1, against these weights' 2.238 and 1.658: 99% and 106%, from round
three's 2.119 and 1.650
(`bench/smollm2-eagle-round4-remake/`). Rounds one to three, on other data mixes, are not
remade.

**Made from scratch with them**, in one run on all of `data/eagle2` (the same data and held-out
prompts as above, in batches of like lengths), 2,400 steps, about 2.9 hours on a 2-core Zen 4
host:

```
python -m specjax train eagle --preset smollm2 --data runs/eagle2 --features runs/eagle2-features --features-dtype float16 --style specjax --subset 8192 --format specjax --unroll 2 --decay 0.8 --noise 0.1 --slots 4096 --learning-rate 0.002 --warmup 50 --clip 1.0 --steps 2400 --seed 0 --held-out 8 --out runs/eagle1-scratch
```

On the same questions with these weights' dynamic tree (`--dynamic-tree 4,4,8`; the command
writes no tree), it gives 2.140 tokens per target call at T = 0 and 1.649 at T = 1: 96% and
99% of these weights; on 60 held-out prompts of `data/eagle2`, 102% and 96%
(`bench/train-eagle-slots/`).""",
    "smollm2-medusa": """

**Made again from the repository's data:** the three sequence sets these heads trained on are
not in the repository, but `data/eagle2` is (1,139,791 generated tokens, greedy and sampled).
`train medusa` with these heads' settings on it, 2,000 steps of 8 documents (41 minutes on
the 2-core Zen 4 host, from the final states of the EAGLE features pass):

```
python -m specjax train data --preset smollm2 --import data/eagle2/smollm2 --out runs/eagle2
python -m specjax train features --preset smollm2 --data runs/eagle2 --out runs/eagle2-features --taps 2,15,27 --features-dtype float16
python -m specjax train medusa --preset smollm2 --data runs/eagle2 --features runs/eagle2-features --features-dtype float16 --held-out 20 --format specjax --head subset --subset 4096 --heads 4 --blocks 2 --decay 0.8 --learning-rate 1e-3 --warmup 50 --clip 1.0 --batch 8 --steps 2000 --tree-nodes 8 --out runs/smollm2-medusa-eagle2
```

makes heads that give 103% of these heads' tokens per target call at T = 0 and 100% at T = 1
on this tree on the 10 held-out chat questions (1.445 and 1.365 against 1.407 and 1.368), and
109% and 108% on 60 of `data/eagle2`'s held-out prompts; with the 3-node tree the command
searches for them on this host, (0) (1) (0,0), 98% and 96% on the questions
(`bench/smollm2-medusa-eagle2/`). From the smaller SmolLM2 set (`data/eagle/smollm2.npz`) the
same command had reached 89% (`bench/train-smollm2-medusa/`). These weights are still the
recipe's below.""",
}


HEADS_USAGE = {
    "smollm2": 'python -m specjax generate --preset smollm2 --method medusa --chat --prompt "How do bees make honey?"',
    "weights/llama-target": 'python -m specjax generate --preset tiny-llama --method medusa --prompt "def fibonacci(n):"',
}


def write_heads_card(directory: Path) -> None:
    """The card of a Medusa heads directory, from its config.json and train_log.json."""
    import specjax
    from specjax.io.fetch import CHECKPOINTS, fetch

    record = json.loads((directory / "train_log.json").read_text())
    config = json.loads((directory / "config.json").read_text())
    sets = record["data"]                      # one `medusa-data` record per set
    data = {key: sum(d[key] for d in sets)
            for key in ("documents", "generated_tokens", "tokens", "generate_s", "hidden_s")}
    data["kinds"] = {}
    for d in sets:
        for kind, n in d["kinds"].items():
            data["kinds"][kind] = data["kinds"].get(kind, 0) + n
    target_dir = (fetch(record["target"]) if record["target"] in CHECKPOINTS
                  else _corpus.REPO / record["target"])
    target_config = specjax.ModelConfig.from_file(target_dir / "config.json")
    k, d, s = config["num_heads"], config["hidden_size"], config["projection"]["tokens"]
    v = target_config.vocab_size
    depth = max(len(p) for p in record["tree"])
    target_macs = flops_per_token(target_config) // 2
    block_macs = config["num_blocks"] * d * d
    step_macs = depth * (block_macs + s * d)
    head_share = v * d / target_macs
    reasoning = (
        f"The target's LM head is {v:,} x {d} = {v * d:,} multiply-adds of the {target_macs:,} a "
        f"token costs it ({head_share:.0%}). A full-vocabulary projection per head would add "
        f"that much for every head, {depth} x {head_share:.0%} = {depth * head_share:.0%} of a "
        f"target call for a tree {depth} deep; projecting onto the {s:,} most frequent label "
        f"tokens costs {s:,} x {d} per head, and a block {block_macs:,}, so a step of "
        f"{depth} heads costs {step_macs / target_macs:.1%} of a target token by this count "
        f"(the measured time ratio c is in the repository's README). The rows are the target's "
        f"own, read from it when the heads meet it, so only the blocks are learned, and with "
        f"identity blocks each head starts as the target's own next-token head.")
    rows = []
    for i in range(k):
        loss = record["final_train_loss"][i] if i < len(record["final_train_loss"]) else float("nan")
        rows.append(f"| {i + 1} | token t + {i + 2} | {record['top1'][i]:.3f} | "
                    f"{record['top5'][i]:.3f} | {loss:.3f} |")
    comparison = record.get("labels_comparison")
    if comparison:
        self_, data_ = comparison["self"], comparison["data"]
        labels_text = (
            f"**Self-distillation vs the data's labels** (`medusa-labels`, a smaller run: "
            f"{self_['steps']} steps on the stdlib text windows only, {self_['train_examples']:,} "
            f"examples, the same prompts labelled either by the target's greedy continuation or "
            f"by the original text; both evaluated on the held-out generated documents above): "
            f"top-1 per head {', '.join(f'{a:.3f}' for a in self_['top1'])} with self-distilled "
            f"labels against {', '.join(f'{a:.3f}' for a in data_['top1'])} with the data's. "
            f"Heads that will be asked to guess the target's tokens learn them better from the "
            f"target than from text the target would not have written.")
    else:
        labels_text = "(No comparison with the data's labels was run for these heads.)"
    kinds = ", ".join(f"{n} {kind}" for kind, n in data["kinds"].items() if kind != "forced")
    forced = ""
    if data["kinds"].get("forced"):
        length = next(d["forced_len"] for d in sets if d.get("forced_windows"))
        forced = (f" and {data['kinds']['forced']:,} windows of {length} standard-library tokens "
                  f"that the target only read (`--forced-windows`): there head k's label at t is "
                  f"the target's greedy token at t + k, kept where the text's tokens t + 1 .. t + k "
                  f"are its greedy tokens too, which is exactly what a greedy continuation from t "
                  f"would have produced, for the price of a forward pass instead of generation;")
    paths = "paths " + " ".join("(" + ",".join(map(str, p)) + ")" for p in record["tree"])
    commands = ["python -m specjax fetch smollm2"] if record["target"] == "smollm2" else []
    commands += [d["command"] for d in sets] + [record["command"]]
    if comparison:
        commands.append(comparison["command"])
    if record.get("tree_choice"):
        commands.append(record["tree_choice"]["command"])
    cost_text = ", ".join(f"{n}: {c:g}" for n, c in record["verify_cost"].items())
    choice = record.get("tree_choice")
    if choice:
        choice_rows = "\n".join(
            f"| {r['nodes']} | {' '.join('(' + ','.join(map(str, p)) + ')' for p in r['tree'])} | "
            f"{r['tokens_per_target_call']:.2f} | {r['verify_cost']:.2f} | "
            f"{r['tokens_per_cost']:.2f} |" for r in choice["rows"])
        tree_text = (
            f"The best trees of several sizes were run greedily on {choice['prompts']} held-out "
            f"prompts (the bench suite's, {choice['new_tokens']} new tokens each; "
            f"`medusa-tree`), and the shipped tree is the one with the most tokens per unit of "
            f"verify cost among those making at least {choice['min_tokens_per_call']:g} tokens "
            f"per target call (verify cost by call size, a call of n tokens over a one-token "
            f"step, `scripts/bench_forward.py --sizes` on this host: "
            f"{', '.join(f'{n}: {c:g}' for n, c in choice['verify_cost'].items())}):\n\n"
            f"| nodes | tree (paths) | tokens per target call | verify cost | tokens per cost |\n"
            f"|--:|---|--:|--:|--:|\n{choice_rows}\n\n"
            f"On this CPU a verify call costs more with every token it checks, so a smaller tree "
            f"is faster per token where its tokens per call suffice (`--tree 1`); on an "
            f"accelerator, where a call on 16 tokens costs about what a call on one does, the "
            f"larger trees are the better choice.")
    else:
        tree_text = (
            f"Of the trees of up to {record['max_nodes']} nodes the one with the best expected "
            f"tokens per unit of verify cost is kept, with the target's verify cost by call size "
            f"{cost_text} (a call of n tokens over a one-token step, `scripts/bench_forward.py` "
            f"on this host). Expected tokens per target call with that tree: "
            f"**{record['expected_tokens_per_call']:.2f}** (a model of the walk, not a "
            f"measurement; the bench measures it).")
    usage = HEADS_USAGE.get(record["target"],
                            f"python -m specjax generate --target {record['target']} "
                            f"--method medusa --heads weights/{directory.name} --prompt ...")
    name = {"smollm2": "SmolLM2-135M-Instruct"}.get(record["target"],
                                                    f"`{record['target']}`")
    nl = "\n"
    text = render(
        "medusa.md", name=directory.name, target_name=name,
        reproduction=REPRODUCTIONS.get(directory.name, ""), num_heads=k, last_offset=k + 1,
        total_minutes=f"{(data['generate_s'] + data['hidden_s'] + record['seconds']) / 60:.0f}",
        cpu_count=record["machine"]["cpu_count"], usage=usage, num_blocks=config["num_blocks"],
        hidden_size=d, subset_size=f"{s:,}", label_coverage=f"{record['label_coverage']:.1%}",
        parameters=f"{k * config['num_blocks'] * (d * d + d):,}", step_macs=f"{step_macs:,}",
        tree_depth=depth, flops_ratio=f"{step_macs / target_macs:.3f}",
        target_macs=f"{target_macs:,}", tree_nodes=len(record["tree"]), tree_paths=paths,
        model_kb=f"{(directory / 'model.safetensors').stat().st_size / 1024:,.0f}",
        projection_reasoning=reasoning,
        data_sets="one set" if len(sets) == 1 else f"{len(sets)} sets", data_minutes=f"{(data['generate_s'] + data['hidden_s']) / 60:.1f}",
        documents=f"{data['documents']:,}", kinds=kinds, forced=forced,
        overlap=("" if sum(1 for d in sets if d["kinds"].get("chat")) < 2 else
                 " The sets draw their chat questions from one pool of templates, so a held-out "
                 "document's question may be trained on in another set (with the other system "
                 "turn): these numbers flatter the heads; the tree measurements below use "
                 "prompts that no set contains."),
        generated_tokens=f"{data['generated_tokens']:,}", cached_tokens=f"{data['tokens']:,}",
        validation_every=record["validation_every"], validation_examples=f"{record['validation_examples']:,}",
        train_examples=f"{record['train_examples']:,}", labels_comparison=labels_text,
        decay=record["decay"],
        loss_weights=", ".join(f"{record['decay'] ** (i + 1):.3g}" for i in range(k)),
        weight_decay=record["weight_decay"], lr=record["lr"], warmup=record["warmup"],
        batch=record["batch"], steps=record["steps"], epochs=record["epochs"],
        train_minutes=f"{record['train_s'] / 60:.1f}", accuracy_rows=nl.join(rows),
        tree_text=tree_text, commands=nl.join(commands))
    (directory / "README.md").write_text(text)
