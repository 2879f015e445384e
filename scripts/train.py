"""Trains the small checkpoints shipped in weights/ (and their tokenizer), then measures them.

    python scripts/train.py tokenizer --out runs/tokenizer.json
    python scripts/train.py model --arch llama --layers 2 --d-model 128 ... --out weights/llama-draft
    python scripts/train.py evaluate --draft weights/llama-draft --target weights/llama-target
    python scripts/train.py index

and the draft of a real model, SmolLM2-135M-Instruct (`smollm2`: a name for specjax.fetch, or a
directory), on its own tokenizer, with its embeddings and its answers to chat prompts:

    python scripts/train.py distill-data --target smollm2 --out runs/distill/smollm2.npz
    python scripts/train.py model --arch llama ... --tokenizer-from smollm2 --tie-embeddings \
        --init-embeddings-from smollm2 --extra-corpus runs/distill/smollm2.npz --out weights/smollm2-draft
    python scripts/train.py evaluate-draft --draft weights/smollm2-draft --target smollm2

The data is the standard library of the running Python (see scripts/_corpus.py). Everything is
seeded: the same command on the same Python and library versions gives the same weights.
`--minutes` picks the number of steps from a short timing run when `--steps` is not given; the
number it picks is written to train_log.json and to the model card's regenerate command, which
always names `--steps` so that a rerun does not depend on the machine's speed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import shutil
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # specjax, without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _corpus  # noqa: E402

WEIGHTS = _corpus.REPO / "weights"
DEFAULT_TOKENIZER = _corpus.REPO / "runs" / "tokenizer.json"
VAL_WINDOWS = 128


# -- Model training -----------------------------------------------------------------------------

def resolve_checkpoint(name_or_dir: str) -> Path:
    """A checkpoint directory, or a name that specjax.fetch knows (e.g. "smollm2")."""
    from specjax.fetch import CHECKPOINTS, fetch

    path = Path(name_or_dir).expanduser()
    if path.is_dir():
        return path
    if name_or_dir in CHECKPOINTS:
        return fetch(name_or_dir)
    raise SystemExit(f"{name_or_dir!r} is neither a checkpoint directory nor one of "
                     f"{sorted(CHECKPOINTS)}")


def build_config(args, vocab_size: int, source=None):
    """The config of the model to train; `source` (the config of --tokenizer-from) supplies the
    vocabulary size and the BOS/EOS ids, so the draft uses the target's token ids."""
    from specjax import ModelConfig

    head_dim = args.d_model // args.heads
    special = dict(bos_token_id=_corpus.EOT_ID, eos_token_ids=(_corpus.EOT_ID,))
    if source is not None:
        vocab_size = source.vocab_size
        special = dict(bos_token_id=source.bos_token_id, eos_token_ids=source.eos_token_ids)
    common = dict(vocab_size=vocab_size, d_model=args.d_model, n_layers=args.layers,
                  n_heads=args.heads, head_dim=head_dim, d_ff=args.d_ff,
                  max_positions=args.max_positions or args.context, **special)
    if args.arch == "gpt2":
        return ModelConfig(arch="gpt2", n_kv_heads=args.heads, norm_eps=1e-5,
                           activation="gelu_tanh", tie_embeddings=True, qkv_bias=True,
                           out_bias=True, mlp_bias=True, model_type="gpt2", **common)
    return ModelConfig(arch="llama", n_kv_heads=args.kv_heads or args.heads, norm_eps=1e-5,
                       activation="silu", tie_embeddings=args.tie_embeddings,
                       rope_theta=10000.0, model_type="llama", **common)


def specjax_load_config(directory: Path):
    from specjax import ModelConfig

    return ModelConfig.from_file(directory / "config.json")


def target_parameters(directory: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(directory / "model.safetensors"), "np") as f:
        return int(sum(np.prod(f.get_slice(k).get_shape()) for k in f.keys()))


def pca_embeddings(directory: Path, d_model: int, std: float) -> tuple[np.ndarray, float]:
    """The token embeddings E [V, D_big] of the checkpoint in `directory`, projected onto their
    top `d_model` principal axes and rescaled to entries of standard deviation `std`; and the
    share of E's variance that the projection keeps.

    The projection (E - mean) V_d [V, D] keeps the differences between tokens, which are what a
    tied LM head turns into logits (a row shared by all tokens shifts every logit equally). The
    rescaling matters: E's own scale (entries of about 0.14, rows of norm about 3 in SmolLM2),
    with the draft's unit-RMS hidden states, gives logits in the tens and an initial loss near
    30 nats; at `std` 0.02, the usual initialisation scale, training starts below ln V.
    """
    import specjax

    embed = np.asarray(specjax.load(directory).params["embed"], np.float64)   # [V, D_big]
    if d_model > embed.shape[1]:
        raise SystemExit(f"--d-model {d_model} exceeds the width {embed.shape[1]} of {directory}")
    centered = embed - embed.mean(axis=0)
    eigenvalues, eigenvectors = np.linalg.eigh(centered.T @ centered)       # ascending
    axes = eigenvectors[:, ::-1][:, :d_model]                              # [D_big, D]
    kept = eigenvalues[::-1][:d_model].sum() / eigenvalues.sum()
    projected = centered @ axes                                            # [V, D]
    print(f"embeddings from {directory}: top {d_model} of {embed.shape[1]} principal axes keep "
          f"{kept:.1%} of the variance", flush=True)
    return (projected * (std / projected.std())).astype(np.float32), float(kept)


def init(config, seed: int):
    """GPT-2 initialisation: N(0, 0.02), residual output projections scaled by 1/sqrt(2L)."""
    import jax

    from specjax import init_params

    params = init_params(config, jax.random.key(seed), std=0.02)
    scale = 1.0 / math.sqrt(2 * config.n_layers)
    for layer in params["layers"]:
        for name in ("wo", "w_out", "w_down"):
            if name in layer:
                layer[name] = layer[name] * scale
    return params


def loss_fn(params, config, windows):
    """Mean next-token cross-entropy of windows [B, T+1]."""
    import jax.numpy as jnp
    import optax

    from specjax import forward

    inputs, targets = windows[:, :-1], windows[:, 1:]                   # [B, T] each
    positions = jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape)
    logits, _ = forward(params, config, inputs, positions, cache=None)  # [B, T, V]
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def distill_loss_fn(params, config, windows, teacher, weight: float):
    """(1 - weight) x next-token cross-entropy + weight x cross-entropy against the teacher's
    next-token distribution (forward KL(teacher || student) plus the teacher's entropy, which
    has no gradient), on windows [B, T+1]. `teacher` is a (params, config) pair with the same
    vocabulary; its forward pass is part of the step but not of the gradient.

    Matching the target's whole distribution, not only the sampled next token, is what raises
    the acceptance rate: greedy acceptance asks that the draft's argmax be the target's, and
    sampled acceptance is sum_x min(p, q) = 1 - TV(p, q) (Leviathan et al., 2023), and this
    loss minimises KL(q || p), which bounds TV(p, q) (Pinsker). DistillSpec (Zhou et al., 2023)
    measures the gain.
    """
    import jax
    import jax.numpy as jnp
    import optax

    from specjax import forward

    inputs, targets = windows[:, :-1], windows[:, 1:]
    positions = jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape)
    logits, _ = forward(params, config, inputs, positions, cache=None)       # [B, T, V]
    teacher_params, teacher_config = teacher
    teacher_logits, _ = forward(teacher_params, teacher_config, inputs, positions, cache=None)
    soft = jax.lax.stop_gradient(jax.nn.softmax(teacher_logits, axis=-1))
    hard = optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()
    return (1 - weight) * hard + weight * optax.softmax_cross_entropy(logits, soft).mean()


def load_teacher(name_or_dir: str, config):
    """The (params, config) of --teacher, checked to share the student's vocabulary."""
    import specjax

    teacher = specjax.load(resolve_checkpoint(name_or_dir))
    if teacher.config.vocab_size != config.vocab_size:
        raise SystemExit(f"--teacher {name_or_dir} has vocab_size {teacher.config.vocab_size}, "
                         f"the model being trained {config.vocab_size}")
    return teacher.params, teacher.config


def make_optimizer(args, steps: int):
    import jax
    import optax

    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=args.lr, warmup_steps=min(args.warmup, steps // 10 + 1),
        decay_steps=steps, end_value=args.lr * 0.1)
    # Decay the weight matrices, token embeddings and LM head; not norms, biases, positions.
    def decay_mask(params):
        return jax.tree_util.tree_map_with_path(
            lambda path, a: a.ndim >= 3 and "['b" not in jax.tree_util.keystr(path)
            or jax.tree_util.keystr(path) in ("['embed']", "['lm_head']"), params)

    return optax.chain(optax.clip_by_global_norm(args.clip),
                       optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=args.weight_decay,
                                   mask=decay_mask)), schedule


def windows_at(tokens: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    return tokens[starts[:, None] + np.arange(length)]                  # [B, length]


def validation_windows(tokens: np.ndarray, context: int) -> np.ndarray:
    """A fixed set of non-overlapping windows spread evenly over the held-out stream."""
    n = (tokens.size - 1) // (context + 1)
    picks = np.linspace(0, n - 1, min(n, VAL_WINDOWS)).round().astype(int)
    return windows_at(tokens, picks * (context + 1), context + 1)


def evaluate_loss(params, config, windows: np.ndarray, batch: int = 16) -> float:
    import jax

    step = jax.jit(lambda p, w: loss_fn(p, config, w))
    losses = [float(step(params, windows[i:i + batch])) * len(windows[i:i + batch])
              for i in range(0, len(windows), batch)]
    return sum(losses) / len(windows)


def train_model(args) -> None:
    import jax
    import jax.numpy as jnp
    import optax
    from tokenizers import Tokenizer

    from specjax import Model, save
    from specjax.model import count_params

    started = time.time()
    source = source_config = None
    if args.tokenizer_from:
        source = resolve_checkpoint(args.tokenizer_from)
        args.tokenizer = source / "tokenizer.json"
        source_config = specjax_load_config(source)
    tokenizer = Tokenizer.from_file(str(args.tokenizer))
    data = _corpus.corpus(args.tokenizer)
    train_tokens, context = data["train"], args.context
    config = build_config(args, tokenizer.get_vocab_size(with_added_tokens=True), source_config)
    params = init(config, args.seed)
    kept = None
    if args.init_embeddings_from:
        embed, kept = pca_embeddings(resolve_checkpoint(args.init_embeddings_from), config.d_model,
                                     args.init_embeddings_std)
        params["embed"] = jnp.asarray(embed)
    n_params = count_params(params)
    extra = load_extra_corpus(args.extra_corpus, args.tokenizer) if args.extra_corpus else None
    n_extra = round(args.batch * args.extra_fraction) if extra else 0
    print(f"{args.out}: {config.arch}, {n_params:,} parameters, "
          f"{train_tokens.size:,} training tokens"
          + (f", {extra['train'].size:,} extra tokens ({n_extra} of {args.batch} windows per "
             f"batch)" if extra else ""), flush=True)

    rng = np.random.default_rng(args.seed)

    def next_batch():
        starts = rng.integers(0, train_tokens.size - context - 1, size=args.batch - n_extra)
        windows = windows_at(train_tokens, starts, context + 1)
        if n_extra:
            starts = rng.integers(0, extra["train"].size - context - 1, size=n_extra)
            windows = np.concatenate([windows, windows_at(extra["train"], starts, context + 1)])
        return jnp.asarray(windows)

    teacher_params = teacher_config = None
    if args.teacher:
        teacher_params, teacher_config = load_teacher(args.teacher, config)
        print(f"distilling from {args.teacher} (weight {args.distill_weight})", flush=True)

    def objective(params, windows, teacher_params):
        if teacher_params is None:
            return loss_fn(params, config, windows)
        return distill_loss_fn(params, config, windows, (teacher_params, teacher_config),
                               args.distill_weight)

    def make_step(optimizer):
        @jax.jit
        def step(params, opt_state, windows, teacher_params):
            loss, grads = jax.value_and_grad(objective)(params, windows, teacher_params)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss, optax.global_norm(grads)
        # The teacher's weights are an argument, not constants baked into the compiled step.
        return lambda params, opt_state, windows: step(params, opt_state, windows, teacher_params)

    steps = args.steps
    if not steps:
        steps = calibrate(make_step, args, params, next_batch)
        rng = np.random.default_rng(args.seed)   # the timing run must not shift the data order
    optimizer, schedule = make_optimizer(args, steps)
    step = make_step(optimizer)
    opt_state = optimizer.init(params)

    deadline = started + 60 * args.minutes if args.minutes else math.inf
    stop_after = min(args.stop_after or steps, steps)
    log, smoothed, t0, done = [], None, time.time(), 0
    for i in range(stop_after):
        params, opt_state, loss, grad_norm = step(params, opt_state, next_batch())
        done = i + 1
        if i % args.log_every == 0 or done == stop_after:
            loss = float(loss)
            smoothed = loss if smoothed is None else 0.9 * smoothed + 0.1 * loss
            elapsed = time.time() - t0
            log.append({"step": done, "loss": round(loss, 4), "lr": float(schedule(i)),
                        "grad_norm": round(float(grad_norm), 3), "seconds": round(elapsed, 1)})
            print(f"step {done:5d}/{steps}  loss {loss:.4f}  lr {float(schedule(i)):.2e}  "
                  f"{done * args.batch * context / elapsed:,.0f} tok/s", flush=True)
        if time.time() > deadline:
            print(f"stopping at step {done}: --minutes {args.minutes} reached", flush=True)
            break
    train_seconds = time.time() - t0

    # Validation loss of the weights as shipped (float16) and of the float32 weights.
    val = validation_windows(data["validation"], context)
    params16 = jax.tree.map(lambda a: a.astype(jnp.float16).astype(jnp.float32), params)
    val_loss = evaluate_loss(params16, config, val)
    val_loss32 = evaluate_loss(params, config, val)
    final_train = float(np.mean([e["loss"] for e in log[-5:]]))
    print(f"validation loss {val_loss:.4f} (float32 {val_loss32:.4f}), "
          f"perplexity {math.exp(val_loss):.2f}", flush=True)
    val_extra = None
    if extra is not None:
        val_extra = evaluate_loss(params16, config, validation_windows(extra["validation"], context))
        print(f"validation loss on held-out extra documents {val_extra:.4f}", flush=True)

    out = Path(args.out)
    save(Model(config, params, tokenizer), out, dtype="float16")
    if source is not None:
        # The target's own tokenizer files: the chat template, special tokens and EOS travel too.
        for name in ("tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
            if (source / name).exists():
                shutil.copyfile(source / name, out / name)
    else:
        (out / "tokenizer_config.json").write_text(json.dumps(_corpus.tokenizer_config(), indent=2) + "\n")
    meta = data["meta"]
    record = {
        "name": out.name,
        "command": regenerate_command(args, steps, done),
        "hyperparameters": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                            if k not in ("func", "out", "tokenizer", "minutes", "log_every")},
        "resolved_steps": steps, "steps_done": done, "stopped_by_minutes": done < steps,
        "parameters": n_params,
        "tokens_seen": done * args.batch * context,
        "train_seconds": round(train_seconds, 1), "total_seconds": round(time.time() - started, 1),
        "final_train_loss": round(final_train, 4),
        "val_loss": round(val_loss, 4), "val_loss_float32": round(val_loss32, 4),
        "val_perplexity": round(math.exp(val_loss), 3),
        "val_tokens": int(val.shape[0] * context),
        "data": {k: v for k, v in meta.items() if k != "stdlib"},
        **({"target": args.tokenizer_from, "init_embeddings_from": args.init_embeddings_from,
            "init_embeddings_kept": kept,
            "extra": extra["meta"], "extra_windows_per_batch": n_extra,
            "val_loss_extra": round(val_extra, 4), "target_parameters": target_parameters(source),
            "cost_ratio_flops": round(flops_per_token(config) / flops_per_token(source_config), 4)}
           if source is not None and extra else {}),
        "machine": {"platform": platform.platform(), "processor": platform.processor() or
                    platform.machine(), "cpu_count": os.cpu_count(),
                    "jax": jax.__version__, "backend": jax.default_backend(),
                    "python": platform.python_version()},
        "log": log,
    }
    (out / "train_log.json").write_text(json.dumps(record, indent=1) + "\n")
    write_card(out)
    print(f"saved {out} in {time.time() - started:.0f} s", flush=True)


# -- Distillation data --------------------------------------------------------------------------

def tokenizer_digest(tokenizer_file: Path) -> str:
    import hashlib

    return hashlib.sha256(Path(tokenizer_file).read_bytes()).hexdigest()[:12]


def distill_data(args) -> None:
    """Sequence-level distillation data: the target's own continuations of chat prompts, of
    stdlib code windows and of prompts shaped from the stdlib's functions and modules
    (`_corpus.code_prompts`), greedy and sampled at temperature 1, as token streams for
    `model --extra-corpus`.

    Each document is prompt + continuation (the chat prompts rendered in ChatML, half of them
    with the template's default system turn); documents are joined with `<|endoftext|>`, as in
    the stdlib corpus. Every `--validation-every`-th document is held out.
    """
    import random

    import specjax

    started = time.time()
    directory = resolve_checkpoint(args.target)
    target = specjax.load(directory)
    eot = _corpus.eot_id(target.tokenizer)
    questions = random.Random(args.seed).sample(_corpus.chat_questions(), args.chat_prompts)
    chat = [_corpus.chatml(q, _corpus.SMOLLM2_SYSTEM if i % 2 else None)
            for i, q in enumerate(questions)]
    code_stream = _corpus.corpus(directory / "tokenizer.json")["train"]
    starts = np.random.default_rng(args.seed).integers(
        0, code_stream.size - args.code_prompt_len, size=args.code_prompts)
    code = windows_at(code_stream, starts, args.code_prompt_len).tolist()
    shaped = _corpus.code_prompts(args.shaped_prompts, args.seed) if args.shaped_prompts else []

    # (group, kind, prompt ids, max_new_tokens, eos_ids); a group is generated in batches.
    jobs = [("chat", "chat", target.tokenizer.encode(p).ids, args.chat_new_tokens, None)
            for p in chat]
    jobs += [("code", "code", p, args.code_new_tokens, ()) for p in code]
    # Sorted by length, so that a batch's prompts are alike and little of it is padding.
    jobs += sorted((("shaped", kind, target.tokenizer.encode(p).ids, args.code_new_tokens, None)
                    for kind, p in shaped), key=lambda j: len(j[2]))
    documents, samples, generated, batches = [], [], 0, 0
    for group in ("chat", "code", "shaped"):
        rows = [j for j in jobs if j[0] == group]
        for b, first in enumerate(range(0, len(rows), args.batch)):
            batch = rows[first:first + args.batch]
            temperature = 0.0 if b % 2 == 0 else 1.0     # alternate greedy and sampled batches
            t0 = time.time()
            out = specjax.generate(target, [r[2] for r in batch], max_new_tokens=batch[0][3],
                                   temperature=temperature, seed=args.seed + batches,
                                   eos_ids=batch[0][4])
            batches += 1
            generated += out.stats.new_tokens
            for (_, kind, prompt, _, _), new in zip(batch, out.tokens):
                documents.append(list(prompt) + list(new))
                samples.append({"kind": kind, "temperature": temperature,
                                "prompt": target.tokenizer.decode(prompt, skip_special_tokens=False),
                                "completion": target.tokenizer.decode(new, skip_special_tokens=False)})
            print(f"{group} batch {b}: {len(batch)} prompts, T={temperature:g}, "
                  f"{out.stats.new_tokens} new tokens in {time.time() - t0:.0f} s", flush=True)

    splits = {"train": [eot], "validation": [eot]}
    for i, doc in enumerate(documents):
        split = "validation" if i % args.validation_every == args.validation_every - 1 else "train"
        splits[split] += doc + [eot]
    out_file = Path(args.out)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out_file, **{k: np.asarray(v, np.uint16) for k, v in splits.items()})
    with open(out_file.with_suffix(".jsonl"), "w") as f:
        for sample in samples:
            f.write(json.dumps(sample) + "\n")
    meta = {"target": args.target, "tokenizer_sha256": tokenizer_digest(directory / "tokenizer.json"),
            "chat_prompts": len(chat), "code_prompts": len(code), "shaped_prompts": len(shaped),
            "chat_new_tokens": args.chat_new_tokens, "code_new_tokens": args.code_new_tokens,
            "code_prompt_len": args.code_prompt_len, "batch": args.batch, "seed": args.seed,
            "documents": len(documents), "generated_tokens": generated,
            "train_tokens": len(splits["train"]), "validation_tokens": len(splits["validation"]),
            "validation_every": args.validation_every, "seconds": round(time.time() - started, 1),
            "command": shlex.join(["python", "scripts/train.py", "distill-data", "--target",
                                   args.target, "--chat-prompts", str(args.chat_prompts),
                                   "--code-prompts", str(args.code_prompts),
                                   "--shaped-prompts", str(args.shaped_prompts),
                                   "--chat-new-tokens", str(args.chat_new_tokens),
                                   "--code-new-tokens", str(args.code_new_tokens),
                                   "--batch", str(args.batch), "--seed", str(args.seed),
                                   "--out", str(args.out)])}
    out_file.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta, indent=1))


def load_extra_corpus(file: Path, tokenizer_file: Path) -> dict:
    """The streams written by `distill_data`, checked against the tokenizer being trained."""
    file = Path(file)
    if not file.exists():
        raise SystemExit(f"--extra-corpus {file} does not exist: run `distill-data` first")
    meta = json.loads(file.with_suffix(".json").read_text())
    if meta["tokenizer_sha256"] != tokenizer_digest(tokenizer_file):
        raise SystemExit(f"--extra-corpus {file} was tokenized with another tokenizer than "
                         f"{tokenizer_file}")
    streams = np.load(file)
    return {"train": streams["train"].astype(np.int32),
            "validation": streams["validation"].astype(np.int32), "meta": meta}


def calibrate(make_step, args, params, next_batch) -> int:
    """Steps that fit in --minutes, from the time of a few steps after compilation."""
    import optax

    if not args.minutes:
        raise SystemExit("give --steps or --minutes")
    optimizer = optax.adam(0.0)
    step, state = make_step(optimizer), optimizer.init(params)
    p, state, loss, _ = step(params, state, next_batch())
    loss.block_until_ready()
    t0, n = time.time(), 10
    for _ in range(n):
        p, state, loss, _ = step(p, state, next_batch())
    loss.block_until_ready()
    per_step = (time.time() - t0) / n
    # Leave room for compilation, evaluation and saving (20 s) and for the shared CPU being
    # slower later than during the timing (15%).
    steps = int((60 * args.minutes * 0.85 - 20) / per_step)
    print(f"timing: {per_step:.2f} s/step -> {steps} steps in {args.minutes} minutes", flush=True)
    return max(steps, 10)


def regenerate_command(args, steps: int, done: int) -> str:
    parts = ["python", "scripts/train.py", "model", "--arch", args.arch,
             "--layers", args.layers, "--d-model", args.d_model, "--heads", args.heads]
    if args.arch == "llama":
        parts += ["--kv-heads", args.kv_heads or args.heads]
    parts += ["--d-ff", args.d_ff, "--context", args.context, "--batch", args.batch,
              "--lr", args.lr, "--warmup", args.warmup, "--seed", args.seed, "--steps", steps]
    if args.max_positions:
        parts += ["--max-positions", args.max_positions]
    if args.tokenizer_from:
        parts += ["--tokenizer-from", args.tokenizer_from]
    if args.tie_embeddings:
        parts += ["--tie-embeddings"]
    if args.init_embeddings_from:
        parts += ["--init-embeddings-from", args.init_embeddings_from,
                  "--init-embeddings-std", args.init_embeddings_std]
    if args.extra_corpus:
        parts += ["--extra-corpus", args.extra_corpus, "--extra-fraction", args.extra_fraction]
    if args.teacher:
        teacher = Path(args.teacher)
        parts += ["--teacher", f"weights/{teacher.name}" if teacher.is_dir() else args.teacher,
                  "--distill-weight", args.distill_weight]
    if done < steps:   # cut short by --minutes: the schedule is still that of `steps`
        parts += ["--stop-after", done]
    parts += ["--out", f"weights/{Path(args.out).name}"]
    return shlex.join(str(p) for p in parts)


# -- Speculative acceptance ---------------------------------------------------------------------

def evaluate_pair(args) -> None:
    """Greedy acceptance rate of the draft against its target at K, on held-out prompts."""
    import specjax

    draft, target = specjax.load(args.draft), specjax.load(args.target)
    data = _corpus.corpus(args.tokenizer)
    prompts = eval_prompts(data["validation"], args.prompts, args.prompt_len)
    t0 = time.time()
    drafted, accepted, _ = greedy_speculative(draft, target, prompts, args.k, args.new_tokens)
    reference = {"drafted": drafted, "accepted": accepted,
                 "acceptance_rate": round(accepted / drafted, 4),
                 "seconds": round(time.time() - t0, 1)}
    how = "greedy_speculative in scripts/train.py (forward without a cache)"
    seconds = reference["seconds"]
    generate = library_generate()
    if generate is not None:
        # The library's jitted loop, cached; the no-cache reference above is the cross-check.
        t0 = time.time()
        out = generate(target, prompts.tolist(), method="speculative", draft=draft, k=args.k,
                       max_new_tokens=args.new_tokens, temperature=0.0, eos_ids=())
        drafted, accepted = int(out.stats.drafted), int(out.stats.accepted)
        how = "specjax.generate(method='speculative', temperature=0.0)"
        seconds = round(time.time() - t0, 1)
    rate = accepted / drafted
    # Every step drafts K tokens and emits the accepted ones plus one of the target's, so the
    # rate (accepted / drafted, not the per-token alpha of Leviathan et al.) gives 1 + K x rate.
    expected = 1 + args.k * rate
    result = {"draft": Path(args.draft).name, "target": Path(args.target).name, "k": args.k,
              "prompts": len(prompts), "prompt_tokens": args.prompt_len,
              "new_tokens": args.new_tokens, "drafted": drafted, "accepted": accepted,
              "acceptance_rate": round(rate, 4),
              "expected_tokens_per_target_call": round(expected, 3),
              "cost_ratio_flops": round(flops_per_token(draft.config) /
                                        flops_per_token(target.config), 4),
              "measured_with": how, "seconds": seconds,
              "reference_no_cache": reference,
              "command": shlex.join(["python", "scripts/train.py", "evaluate", "--draft",
                                     f"weights/{Path(args.draft).name}", "--target",
                                     f"weights/{Path(args.target).name}", "--k", str(args.k)])}
    print(json.dumps(result, indent=1))
    for directory in (args.draft, args.target):
        log_file = Path(directory) / "train_log.json"
        record = json.loads(log_file.read_text())
        record["speculative"] = result
        log_file.write_text(json.dumps(record, indent=1) + "\n")
        write_card(Path(directory))


def evaluate_draft(args) -> None:
    """Acceptance of a draft for a fetched target, on held-out code and chat prompts, for each K
    and temperature; and the wall-clock speed of speculative against autoregressive decoding."""
    import statistics

    import specjax

    draft = specjax.load(args.draft)
    directory = resolve_checkpoint(args.target)
    target = specjax.load(directory)
    data = _corpus.corpus(directory / "tokenizer.json")
    code = eval_prompts(data["validation"], args.prompts, args.prompt_len).tolist()
    chat = [target.tokenizer.encode(_corpus.chatml(q)).ids for q in _corpus.EVAL_QUESTIONS]
    # Code runs to max_new_tokens (eos_ids=()); a chat answer ends at the target's <|im_end|>.
    sets = {"code": (code, ()), "chat": (chat[:args.prompts], None)}
    ratio = flops_per_token(draft.config) / flops_per_token(target.config)
    n = args.new_tokens
    table, exact = [], {}
    load = [os.getloadavg()[0]]
    for name, (prompts, eos) in sets.items():
        greedy = specjax.generate(target, prompts, max_new_tokens=n, temperature=0.0, eos_ids=eos)
        for temperature in args.temperatures:
            for k in args.ks:
                t0 = time.time()
                out = specjax.generate(target, prompts, method="speculative", draft=draft, k=k,
                                       max_new_tokens=n, temperature=temperature, seed=args.seed,
                                       eos_ids=eos)
                st = out.stats
                if temperature == 0:
                    exact[f"{name} K={k}"] = out.tokens == greedy.tokens
                table.append({"prompts": name, "rows": len(prompts), "temperature": temperature,
                              "k": k, "drafted": st.drafted, "accepted": st.accepted,
                              "acceptance_rate": round(st.acceptance_rate, 4),
                              "new_tokens": st.new_tokens, "target_calls": st.target_calls,
                              "tokens_per_target_call": round(st.tokens_per_target_call, 3),
                              # target calls saved, less the drafts' cost by FLOPs
                              "flops_speedup": round(st.tokens_per_target_call / (1 + k * ratio), 3)})
                print(f"{name:4s} T={temperature:g} K={k}: acceptance {st.acceptance_rate:.3f}, "
                      f"{st.tokens_per_target_call:.2f} tokens/target call "
                      f"({time.time() - t0:.0f} s)", flush=True)
    if not all(exact.values()):
        print(f"WARNING: greedy speculative differs from greedy autoregressive: {exact}", flush=True)

    # Wall clock, batch of one prompt, compile excluded (stats.run_s), median of --runs.
    def median_run_s(model, prompt, **kwargs):
        specjax.generate(model, [prompt], max_new_tokens=n, temperature=0.0, eos_ids=(), **kwargs)
        runs = [specjax.generate(model, [prompt], max_new_tokens=n, temperature=0.0, eos_ids=(),
                                 **kwargs) for _ in range(args.runs)]
        return statistics.median(r.stats.run_s for r in runs), runs[0].stats

    speed = []
    picks = np.linspace(0, len(code) - 1, args.speed_prompts).round().astype(int)
    for i in picks:          # spread over the code prompts, as the prompts over the files
        ar_s, _ = median_run_s(target, code[i])
        # The draft alone, autoregressive: its measured cost per token against the target's.
        draft_s, _ = median_run_s(draft, code[i])
        entry = {"prompt": int(i), "autoregressive_tok_s": round(n / ar_s, 2),
                 "draft_alone_tok_s": round(n / draft_s, 1),
                 "measured_cost_ratio": round(draft_s / ar_s, 4), "speculative": {}}
        for k in args.speed_ks:
            spec_s, st = median_run_s(target, code[i], method="speculative", draft=draft, k=k)
            entry["speculative"][str(k)] = {
                "tok_s": round(n / spec_s, 2), "speedup": round(ar_s / spec_s, 3),
                "acceptance_rate": round(st.acceptance_rate, 4),
                "tokens_per_target_call": round(st.tokens_per_target_call, 3)}
        speed.append(entry)
        print(f"speed: {entry}", flush=True)
    load.append(os.getloadavg()[0])
    result = {
        "target": args.target, "draft": Path(args.draft).name, "new_tokens": n,
        "prompt_tokens_code": args.prompt_len, "seed": args.seed,
        "chat_questions": _corpus.EVAL_QUESTIONS[:args.prompts],
        "cost_ratio_flops": round(ratio, 4), "table": table,
        "greedy_equals_autoregressive": exact,
        "speed": {"ks": args.speed_ks, "prompts": len(speed), "runs": args.runs, "per_prompt": speed,
                  "speedup_median": {str(k): round(statistics.median(
                      e["speculative"][str(k)]["speedup"] for e in speed), 3) for k in args.speed_ks},
                  "load_average": [round(x, 2) for x in load]},
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count()},
        "command": shlex.join(["python", "scripts/train.py", "evaluate-draft", "--draft",
                               f"weights/{Path(args.draft).name}", "--target", args.target]),
    }
    print(json.dumps(result, indent=1))
    log_file = Path(args.draft) / "train_log.json"
    record = json.loads(log_file.read_text())
    record["evaluation"] = result
    log_file.write_text(json.dumps(record, indent=1) + "\n")
    write_card(Path(args.draft))


def library_generate():
    """specjax.generate if the library has it (the package attribute or the module's function)."""
    import specjax

    generate = getattr(specjax, "generate", None)
    if callable(generate):
        return generate
    try:
        from specjax.generate import generate
    except ImportError:
        return None
    return generate


def eval_prompts(tokens: np.ndarray, n: int, length: int) -> np.ndarray:
    """n prompts of `length` tokens, evenly spaced over the held-out stream."""
    starts = np.linspace(0, tokens.size - 2 * length - 1, n).round().astype(int)
    return windows_at(tokens, starts, length)


def greedy_speculative(draft, target, prompts: np.ndarray, k: int, new_tokens: int):
    """Speculative decoding with argmax draft and argmax target (Chen et al. Algorithm 2 at
    temperature 0), batched over prompts with right padding and no cache.

    Every row drafts k tokens greedily, the target scores them in one call, the longest prefix
    that equals the target's own argmax is kept, and the target's token at the first mismatch
    (or the bonus token after k matches) is appended. A row stops once it has `new_tokens` new
    tokens; its last round is still counted in full. Returns (drafted, accepted) over all rows
    and the token buffer [B, prompt + new_tokens + k + 1] (row r is valid up to its length).
    """
    import jax
    import jax.numpy as jnp

    from specjax import forward

    b, prompt_len = prompts.shape
    width = prompt_len + new_tokens + k + 1
    buffer = np.zeros((b, width), np.int32)
    buffer[:, :prompt_len] = prompts
    lengths = np.full(b, prompt_len)
    positions = jnp.broadcast_to(jnp.arange(width), (b, width))

    def argmax_fn(model):
        # Right padding is harmless: position t only attends to positions <= t.
        return jax.jit(lambda tokens: jnp.argmax(
            forward(model.params, model.config, tokens, positions)[0], axis=-1))

    draft_argmax, target_argmax = argmax_fn(draft), argmax_fn(target)
    rows = np.arange(b)
    drafted = accepted = 0
    while (active := lengths - prompt_len < new_tokens).any():
        proposal = buffer.copy()
        at = np.where(active, lengths, prompt_len)             # finished rows idle in bounds
        for i in range(k):                                     # Step 1: draft k tokens
            guess = np.asarray(draft_argmax(proposal))         # [B, width]
            proposal[rows, at + i] = guess[rows, at + i - 1]
        truth = np.asarray(target_argmax(proposal))            # Step 2: one target call
        for r in rows[active]:
            n = lengths[r]
            drafts = proposal[r, n:n + k]
            wanted = truth[r, n - 1:n + k]                     # the target's k + 1 argmaxes
            a = int(np.argmin(np.append(drafts == wanted[:k], False)))   # Step 3: accept
            buffer[r, n:n + a] = drafts[:a]
            buffer[r, n + a] = wanted[a]                       # correction or bonus token
            lengths[r] = n + a + 1
            drafted, accepted = drafted + k, accepted + a
    return drafted, accepted, buffer


def flops_per_token(config) -> int:
    """Matrix-multiply FLOPs per token (2 per multiply-add), attention scores excluded."""
    d, f, n, kv, h = config.d_model, config.d_ff, config.n_heads, config.n_kv_heads, config.head_dim
    attn = d * (n + 2 * kv) * h + n * h * d
    mlp = (2 if config.arch == "gpt2" else 3) * d * f
    return 2 * (config.n_layers * (attn + mlp) + d * config.vocab_size)


# -- Model cards --------------------------------------------------------------------------------

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
        rate = (f"**{spec['acceptance_rate']:.3f}** ({spec['accepted']} of {spec['drafted']} "
                f"drafted tokens accepted, that is {spec['expected_tokens_per_target_call']:.2f} "
                f"tokens per target call; draft/target cost ratio by FLOPs "
                f"{spec['cost_ratio_flops']:.3f})")
        speculative = (f"Greedy acceptance rate of `{spec['draft']}` drafting for "
                       f"`{spec['target']}` at K={spec['k']}: {rate}. Measured on "
                       f"{spec['prompts']} held-out prompts of {spec['prompt_tokens']} tokens "
                       f"with {spec['new_tokens']} new tokens each, using "
                       f"{spec['measured_with']}.")
        ref = spec.get("reference_no_cache")
        if ref and spec["measured_with"].startswith("specjax.generate"):
            same = ref["drafted"] == spec["drafted"] and ref["accepted"] == spec["accepted"]
            speculative += (" The cache-free reference in `scripts/train.py` (`greedy_speculative`) "
                            + ("gives the same counts." if same else
                               f"gives {ref['accepted']} of {ref['drafted']}."))
        speculative += f"\n\nRegenerate: `{spec['command']}`"
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
        pairing = (" A draft is trained to imitate its target rather than the data: the "
                   "acceptance rate of speculative decoding depends only on how close the draft's "
                   "distribution p is to the target's q. Sampled, a drafted token is accepted "
                   "with probability sum over x of min(p(x), q(x)) = 1 - TV(p, q) (Leviathan "
                   "et al. 2023), and Pinsker's inequality bounds TV(p, q) by "
                   "sqrt(KL(q || p) / 2); greedy, the two argmaxes agree once p is close enough "
                   "to q. The final train loss below is this objective (it includes the "
                   "teacher's entropy); the validation loss is next-token cross-entropy on the "
                   "held-out data, as for every checkpoint.")
    else:
        objective = "Next-token cross-entropy"
        pairing = ""
    pairing = "\n".join(textwrap.wrap(pairing.strip(), 96)) if pairing else ""
    how = (f"trained from scratch, by distillation from its target, on the Python standard "
           f"library's source\ncode" if hp.get("teacher") else
           "trained from scratch on the Python standard library's source\ncode")
    after = (f", and after training its teacher `weights/{Path(hp['teacher']).name}`"
             if hp.get("teacher") else "")
    held_out = ", ".join(f"`{f}`" for f in data["validation_files"])
    stop = (f" of a {record['resolved_steps']}-step schedule (`--stop-after "
            f"{record['steps_done']}`: the pair's first run was cut there by its wall-clock cap)"
            if record["stopped_by_minutes"] else "")
    text = f"""# {name}

A small {arch.split(' (')[0]} model {how}, shipped with specjax as the **{role}** of the `{name.split('-')[0]}` speculative-decoding
pair (its partner is [`{partner}`](../{partner}/)). It is a test and demo model: it continues
Python code plausibly for a few lines and knows nothing else.

## Architecture

| | |
|---|---|
| architecture | {arch} |
| layers | {config.n_layers} |
| width (d_model) | {config.d_model} |
| attention heads | {config.n_heads} ({attention}), head size {config.head_dim} |
| MLP width | {config.d_ff} |
| context | {config.max_positions} tokens |
| vocabulary | {config.vocab_size} (byte-level BPE, `<|endoftext|>` = 0 is BOS/EOS) |
| parameters | {record['parameters']:,} |
| matmul FLOPs per token | {flops_per_token(config):,} |
| storage | float16 safetensors (specjax and transformers load it as float32) |

## Data

Every `.py` file of the standard library of CPython {data['python']} (`sysconfig.get_paths()["stdlib"]`,
recursively, sorted), excluding `site-packages` and the test directories ({', '.join(f'`{d}`' for d in data['excluded_dirs'] if d not in ('__pycache__', 'site-packages'))}),
and skipping files that are not UTF-8 ({len(data['skipped_not_utf8'])} skipped). Documents are
joined with `<|endoftext|>`. A file is held out for validation when
`{data['holdout_rule']}`: {data['train_files']} training files
({data['train_tokens']:,} tokens), {len(data['validation_files'])} validation files
({data['validation_tokens']:,} tokens): {held_out}.

The tokenizer (`tokenizer.json`, shared by all four checkpoints) is a byte-level BPE with 4096
entries trained with Hugging Face `tokenizers` on the training files only.

## Training

{objective} on random {hp['context']}-token windows of the training stream, batch
{hp['batch']}, AdamW (b1 0.9, b2 0.95, weight decay {hp['weight_decay']} on weight matrices and embeddings),
peak learning rate {hp['lr']} with {hp['warmup']} warmup steps and cosine decay to 10%,
gradient clipping at {hp['clip']}, seed {hp['seed']}, float32.{chr(10) + chr(10) + pairing if pairing else ''}

| | |
|---|---|
| steps | {record['steps_done']}{stop} |
| tokens seen | {record['tokens_seen']:,} ({record['tokens_seen'] / data['train_tokens']:.2f} epochs) |
| training time | {record['train_seconds'] / 60:.1f} minutes |
| machine | {machine['platform']}, {machine['cpu_count']} CPU cores, JAX {machine['jax']} ({machine['backend']}) |
| final train loss | {record['final_train_loss']:.3f} |
| validation loss | **{record['val_loss']:.3f}** nats/token (perplexity {record['val_perplexity']:.1f}), on {record['val_tokens']:,} held-out tokens |

The validation loss is that of the float16 weights as shipped (float32: {record['val_loss_float32']:.4f}).
Per-step losses are in `train_log.json`. The CPU was shared with other jobs while these models
trained, so the training time is not a measure of speed.

## Speculative decoding

{speculative}

## Regenerate

From the repository root, after `python scripts/train.py tokenizer` (see [../README.md](../README.md)){after}:

```
{record['command']}
```

The command names the step count (and, for a run that the wall-clock cap `--minutes` cut
short, the step it stopped at), so a rerun does not depend on the machine's speed. Results are
reproducible on the same Python (the corpus is its standard library), tokenizers and JAX
versions.
"""
    (directory / "README.md").write_text(text)


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
    shaped = (f" and of {extra['shaped_prompts']} prompts made from the training files\n"
              "  (`code_prompts()` in `scripts/_corpus.py`, a third each: a function's signature\n"
              "  and docstring, a module's head up to its first definition, and an instruction to\n"
              "  edit a short function followed by the edited function's first line;\n"
              f"  {extra['code_new_tokens']} tokens, stopping at `<|im_end|>`)"
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
        evaluation = f"""Measured with `specjax.generate(target, prompts, method="speculative", draft=draft, k=K,
max_new_tokens={ev['new_tokens']}, temperature=T, seed={ev['seed']})` against the target, float32:

- **code**: {ev['table'][0]['rows']} windows of {ev['prompt_tokens_code']} tokens, evenly spaced over the held-out stdlib files (never
  trained on), each continued for {ev['new_tokens']} tokens (no stop token);
- **chat**: {len(ev['chat_questions'])} ChatML questions that are not among the training prompts
  (`EVAL_QUESTIONS` in `scripts/_corpus.py`), rendered as
  `<|im_start|>user\\n{{q}}<|im_end|>\\n<|im_start|>assistant\\n`; an answer stops at `<|im_end|>`.

| prompts | T | K | acceptance rate | tokens per target call | speedup by FLOPs |
|---|---|---|---|---|---|
{nl.join(rows)}

The acceptance rate is accepted / drafted tokens over all rows (drafts after a rejection count as
drafted, so tokens per target call = 1 + K x rate; it is not the per-token acceptance
probability alpha of Leviathan et al.); tokens per target call counts the new tokens per target
forward pass (accepted drafts plus the target's own token). "Speedup by
FLOPs" is tokens per target call / (1 + K x {ev['cost_ratio_flops']:.3f}), the cost of K draft
calls counted by matmul FLOPs. At T=0, speculative decoding returned exactly the autoregressive
greedy tokens on every row: {'yes, for all ' + str(len(exact)) + ' (prompts, K) runs' if all(exact.values()) else 'NO: ' + str(exact)}.

**Wall clock** (CPU, {ev['machine']['cpu_count']} cores, shared; load average {sp['load_average'][0]}-{sp['load_average'][1]}): {sp['prompts']} of the code
prompts (spread over the {ev['table'][0]['rows']}), each alone (batch 1), {ev['new_tokens']} new tokens, temperature 0, float32;
tokens/s from the median `stats.run_s` of {sp['runs']} runs after a warm-up (compilation excluded):

{speed_head}
{speed_rule}
{speed_rows}

Median speedup over specjax autoregressive: {medians}. The last column is the draft's
own autoregressive time per token over the target's: the cost ratio as measured, which on this
CPU is well above the FLOPs ratio, because a draft call is too small to keep the cores busy.

Regenerate: `{ev['command']}`"""
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
        objective_note = (" No logit distillation: a target forward pass costs about six times a "
                          "draft training step per token (matmul FLOPs): a trial of `--teacher "
                          "smollm2` trained on about 100 tokens/s on this CPU (shared with two "
                          "other jobs), so distilling from the target's logits over millions of "
                          "tokens would have taken hours; the budget went to the target's sampled "
                          "text instead (`--teacher` does logit distillation where the budget "
                          "allows).")
    commands = ["python -m specjax fetch smollm2", extra["command"], record["command"]]
    if ev:
        commands.append(ev["command"])
    nl = "\n"
    text = f"""# {name}

A draft model for **SmolLM2-135M-Instruct** (the target that `python -m specjax fetch {target}`
converts from a GGUF on PyPI), for speculative decoding: a {config.n_layers}-layer Llama of width
{config.d_model} that uses the target's own tokenizer, so that its token ids are the target's.
It was trained for {train_min + gen_min:.0f} minutes on a 2-core CPU: on the Python standard library's
source and on the target's own answers to chat prompts and continuations of code
(sequence-level distillation). On its own it is a poor language model. As a draft it saves
target calls ({summary}),
but on a 2-core CPU that does not yet turn into wall-clock speed (see below).

```
python -m specjax generate --preset smollm2 --chat --prompt "How do bees make honey?"   # this draft, K=4
```

## Architecture

| | |
|---|---|
| architecture | Llama (`LlamaForCausalLM`): RoPE (theta {config.rope_theta:g}), RMSNorm, SwiGLU MLP, no biases, **tied embeddings** |
| layers | {config.n_layers} |
| width (d_model) | {config.d_model} |
| attention heads | {config.n_heads} (multi-head), head size {config.head_dim} |
| MLP width | {config.d_ff} |
| context | trained on {hp['context']}-token windows; `max_position_embeddings` {config.max_positions} (RoPE: longer contexts run, with less accurate drafts) |
| vocabulary | {config.vocab_size}, the target's tokenizer (BOS `<|im_start|>` = {config.bos_token_id}, EOS `<|im_end|>` = {config.eos_token_ids[0]}) |
| parameters | {record['parameters']:,} ({config.vocab_size * config.d_model:,} of them the token embedding); the target has {record['target_parameters']:,} |
| matmul FLOPs per token | {flops_per_token(config):,}, LM head included: **{record['cost_ratio_flops']:.3f}** of the target's |
| storage | float16 safetensors, {model_mb:.1f} MB ({dir_mb:.1f} MB with the tokenizer files) |

The LM head (d_model x 49152) is {config.vocab_size * config.d_model / (flops_per_token(config) / 2):.0%} of the draft's FLOPs:
the vocabulary, not the depth, sets the cost of a draft for this target, hence the narrow width
and the tied head.

`tokenizer.json`, `tokenizer_config.json` (with the ChatML chat template),
`special_tokens_map.json` and `generation_config.json` are the target's files, copied unchanged
(`--tokenizer-from {target}`).

## Initialisation

The tied embedding starts as the target's embedding matrix E (49152 x 576) projected by PCA onto
its top {config.d_model} principal axes, (E - mean(E)) V with V the leading eigenvectors of the covariance
(`numpy.linalg.eigh`; they keep {record['init_embeddings_kept']:.0%} of the variance), rescaled to entries of standard deviation
{hp['init_embeddings_std']} (`--init-embeddings-std`; at E's own scale the initial loss is near 30 nats, far above
ln 49152 = 10.8). The draft thus starts with the target's token geometry (which tokens are
alike) rather than learning it from a few million tokens; in a short comparison (2 layers,
80 steps of 8 x 256 tokens) it lowered the stdlib validation loss from 6.27 (random embedding)
to 6.10. Everything else is GPT-2 style random initialisation (N(0, 0.02), residual projections
scaled by 1/sqrt(2L)), seed {hp['seed']}.

## Data

- **Standard library source**: the corpus of the tiny checkpoints (`scripts/_corpus.py`: every
  `.py` file of CPython {data['python']}'s standard library except tests and site-packages), tokenized
  with the SmolLM2 tokenizer: {data['train_tokens']:,} training tokens, {data['validation_tokens']:,} validation tokens in
  {len(data['validation_files'])} held-out files.
- **The target's own outputs** (`distill-data`): its answers to {extra['chat_prompts']} chat questions made from
  templates (`chat_questions()` in `scripts/_corpus.py`, ChatML, half of them with the
  template's default system turn; at most {extra['chat_new_tokens']} tokens, stopping at `<|im_end|>`) and its
  continuations of {extra['code_prompts']} {extra['code_prompt_len']}-token windows of the training files ({extra['code_new_tokens']} tokens){shaped}; batches alternate
  greedy and temperature-1 sampling. {extra['generated_tokens']:,} generated tokens, {extra['train_tokens']:,} tokens with
  the prompts ({extra['validation_tokens']:,} more held out: every {extra['validation_every']}th document), generated in
  {gen_min:.1f} minutes by `specjax.generate` on the same CPU.

Each batch of {hp['batch']} windows of {hp['context']} tokens takes {record['extra_windows_per_batch']} from the target's outputs and the rest from
the standard library.

## Training

{objective}, AdamW (b1 0.9, b2 0.95, weight decay {hp['weight_decay']} on weight matrices and
the embedding), peak learning rate {hp['lr']} with {hp['warmup']} warmup steps and cosine decay to 10%,
gradient clipping at {hp['clip']}, seed {hp['seed']}, float32.{objective_note}

| | |
|---|---|
| steps | {record['steps_done']} |
| tokens seen | {tokens:,}: {tokens - extra_seen:,} stdlib ({(tokens - extra_seen) / data['train_tokens']:.2f} epochs), {extra_seen:,} target outputs ({extra_seen / extra['train_tokens']:.1f} epochs) |
| training time | {train_min:.1f} minutes, plus {gen_min:.1f} minutes generating the target's outputs |
| machine | {machine['platform']}, {machine['cpu_count']} CPU cores (shared), JAX {machine['jax']} ({machine['backend']}) |
| final train loss | {record['final_train_loss']:.3f} |
| validation loss, stdlib | **{record['val_loss']:.3f}** nats/token (perplexity {record['val_perplexity']:.1f}) on {record['val_tokens']:,} held-out tokens |
| validation loss, target outputs | **{record['val_loss_extra']:.3f}** nats/token on the held-out documents |

Validation losses are those of the float16 weights as shipped (stdlib, float32: {record['val_loss_float32']:.4f}).
Per-step losses are in `train_log.json`.

## Speculative decoding against SmolLM2-135M-Instruct

{evaluation}

## Regenerate

From the repository root, with the `train` and `gguf` extras installed:

```
{nl.join(commands)}
```

`distill-data` writes `runs/distill/smollm2.npz` (token streams), `.json` (its record) and
`.jsonl` (every prompt and completion, to read). The model command names its step count, so a
rerun does not depend on the machine's speed. The target's generations are seeded; they and the
weights are reproducible on the same Python (the corpus is its standard library), tokenizers
and JAX versions and the same kind of CPU.
"""
    (directory / "README.md").write_text(text)


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
    return f"""
## Drafts for real models

Trained with the same script on the target's own tokenizer, with the target's embeddings
(projected by PCA) as initialisation and the target's own outputs mixed into the stdlib corpus;
the card gives the full acceptance table (K 2, 4, 6; code and chat prompts; temperature 0 and 1)
and the wall-clock measurements.

| checkpoint | target | shape | parameters | FLOPs vs target | acceptance (tokens per target call), K=4: code T=0 | code T=1 | chat T=0 | chat T=1 | wall-clock speedup, code, K=4 | weights |
|---|---|---|---|---|---|---|---|---|---|---|
{nl.join(rows)}

```
python -m specjax fetch smollm2
{nl.join(commands)}
```
"""


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
    text = f"""# Shipped checkpoints

Four small models trained from scratch on the Python standard library's source (CPython's own
`.py` files), so that the CLI, the examples and the tests have real models on a fresh machine,
with no download: two targets trained on the data, and two drafts distilled from their
targets (trained to match the target's whole next-token distribution, which is what raises
the acceptance rate; see the draft cards). Each directory is a Hugging Face checkpoint (`config.json`,
`model.safetensors` in float16, `tokenizer.json`) that both `specjax.load` and
`transformers.AutoModelForCausalLM.from_pretrained` read, with a model card (`README.md`) and
the training record (`train_log.json`). All four share one byte-level BPE tokenizer (4096
tokens, `<|endoftext|>` = 0).

| checkpoint | shape | parameters | tokens seen | val loss | val ppl | greedy acceptance, K=4 | size |
|---|---|---|---|---|---|---|---|
{nl.join(rows)}

The acceptance rate is that of the pair's draft proposing for its target (the same number on
both rows of a pair), greedy, K=4, on held-out standard-library code.

```
python -m specjax generate --target weights/llama-target --draft weights/llama-draft --prompt "def fibonacci(n):"
python -m specjax generate --preset tiny-gpt2 --prompt "import os"   # the CLI's presets name these pairs
```

## Regenerate everything

From the repository root with the `train` extra installed (`pip install -e .[train]`), on
CPython {json.loads((WEIGHTS / 'llama-draft' / 'train_log.json').read_text())['data']['python'] if (WEIGHTS / 'llama-draft' / 'train_log.json').exists() else '3.11'} (the corpus is the running interpreter's standard library; another
version gives different but similar models). The tokenized corpus is cached under `runs/`.

```
{nl.join(commands)}
```

`model` copies the tokenizer into each checkpoint; `evaluate` writes the acceptance rates into
both cards of a pair; `index` writes this page. `pytest tests/test_weights.py` then checks the
result: transformers loads each checkpoint and its logits match specjax's, the tokenizer
round-trips Python source, and each target's validation loss is below its draft's;
`tests/test_trained.py` checks that every method gives the target's greedy output with them and
that the distilled drafts save target calls.

The model commands name their step counts (`--stop-after` where the original run was cut short
by its `--minutes` wall-clock cap), so they reproduce the shipped weights on any machine; give
`--minutes M` without `--steps` to let the script fit the steps to another time budget. Each card gives its own
command, data split, machine and results; `scripts/_corpus.py` documents the corpus.
{real}"""
    (WEIGHTS / "README.md").write_text(text)
    print((WEIGHTS / "README.md").read_text())


# -- Command line -------------------------------------------------------------------------------

def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(required=True)

    p = sub.add_parser("tokenizer", help="train the byte-level BPE tokenizer on the corpus")
    p.add_argument("--out", type=Path, default=DEFAULT_TOKENIZER)
    p.set_defaults(func=lambda a: print(_corpus.train_tokenizer(a.out)))

    p = sub.add_parser("model", help="train one checkpoint")
    p.add_argument("--arch", choices=("gpt2", "llama"), required=True)
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--d-model", type=int, required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--kv-heads", type=int, default=0, help="llama only; default: --heads")
    p.add_argument("--d-ff", type=int, required=True)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--steps", type=int, default=0, help="default: as many as fit in --minutes")
    p.add_argument("--minutes", type=float, default=0.0, help="wall-clock cap")
    p.add_argument("--stop-after", type=int, default=0,
                   help="stop after this many steps of the --steps schedule (reproduces a run "
                        "that --minutes cut short)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    p.add_argument("--max-positions", type=int, default=0,
                   help="context window written to config.json; default: --context")
    p.add_argument("--tokenizer-from", default="",
                   help="train on the tokenizer of this checkpoint (a directory or a specjax "
                        "fetch name such as smollm2), with its vocab size, BOS/EOS ids and "
                        "tokenizer files (chat template included); overrides --tokenizer")
    p.add_argument("--tie-embeddings", action="store_true", help="llama: tie the LM head")
    p.add_argument("--init-embeddings-from", default="",
                   help="initialise the token embeddings with this checkpoint's, projected "
                        "onto their top --d-model principal axes")
    p.add_argument("--init-embeddings-std", type=float, default=0.02,
                   help="standard deviation of the projected embeddings' entries")
    p.add_argument("--extra-corpus", type=Path,
                   help="a .npz from `distill-data` whose windows are mixed into each batch")
    p.add_argument("--extra-fraction", type=float, default=0.25,
                   help="share of each batch's windows drawn from --extra-corpus")
    p.add_argument("--teacher", default="",
                   help="distil from this checkpoint (same vocabulary): the loss mixes "
                        "cross-entropy against its next-token distribution into the data's")
    p.add_argument("--distill-weight", type=float, default=1.0,
                   help="weight of the teacher term, 0..1 (with --teacher)")
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=train_model)

    p = sub.add_parser("distill-data", help="the target's continuations of chat and code "
                                            "prompts, for `model --extra-corpus`")
    p.add_argument("--target", required=True, help="a checkpoint directory or fetch name")
    p.add_argument("--chat-prompts", type=int, default=384)
    p.add_argument("--code-prompts", type=int, default=128)
    p.add_argument("--chat-new-tokens", type=int, default=160)
    p.add_argument("--code-new-tokens", type=int, default=128)
    p.add_argument("--shaped-prompts", type=int, default=0,
                   help="prompts made from the training files: function signatures with their "
                        "docstrings, module heads, edit instructions (a third each)")
    p.add_argument("--code-prompt-len", type=int, default=64)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--validation-every", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=distill_data)

    p = sub.add_parser("evaluate", help="greedy acceptance rate of a draft/target pair")
    p.add_argument("--draft", type=Path, required=True)
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    p.set_defaults(func=evaluate_pair)

    p = sub.add_parser("evaluate-draft", help="acceptance table and speed of a draft for a "
                                              "fetched target (e.g. smollm2)")
    p.add_argument("--draft", type=Path, required=True)
    p.add_argument("--target", required=True, help="a checkpoint directory or fetch name")
    p.add_argument("--ks", type=int, nargs="+", default=[2, 4, 6])
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    p.add_argument("--prompts", type=int, default=10)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--speed-prompts", type=int, default=3)
    p.add_argument("--speed-ks", type=int, nargs="+", default=[4, 2])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=evaluate_draft)

    p = sub.add_parser("index", help="write weights/README.md from the checkpoints' records")
    p.set_defaults(func=write_index)

    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
