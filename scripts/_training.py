"""Model training: the `model` stage of scripts/train.py.

The model's config, its initialisation (GPT-2 style), the next-token and distillation losses,
the optimizer, the training windows, and `train_model`, which trains, validates, saves the
checkpoint with its train_log.json and writes its card (scripts/_cards.py). Also the helpers
that evaluation shares with it: `resolve_checkpoint`, `windows_at`.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import time
from pathlib import Path

import _corpus
import numpy as np
from _cards import write_card

VAL_WINDOWS = 128


def command_line(command: str, args, options: tuple[str, ...]) -> str:
    """`python scripts/train.py COMMAND --option value ...` with every option named, defaults
    included, so that a recorded command does not depend on the defaults of a later version."""
    words = ["python", "scripts/train.py", command]
    for name in options:
        words += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    return shlex.join(words)


def resolve_checkpoint(name_or_dir: str) -> Path:
    """A checkpoint directory, or a name that specjax.io.fetch knows (e.g. "smollm2")."""
    from specjax.io.fetch import CHECKPOINTS, fetch

    path = Path(name_or_dir).expanduser()
    if path.is_dir():
        return path
    if name_or_dir in CHECKPOINTS:
        return fetch(name_or_dir)
    raise SystemExit(f"{name_or_dir!r} is neither a checkpoint directory nor one of "
                     f"{sorted(CHECKPOINTS)}")


def build_config(args, vocab_size: int):
    """The config of the model to train."""
    from specjax import ModelConfig

    head_dim = args.d_model // args.heads
    special = dict(bos_token_id=_corpus.EOT_ID, eos_token_ids=(_corpus.EOT_ID,))
    common = dict(vocab_size=vocab_size, d_model=args.d_model, n_layers=args.layers,
                  n_heads=args.heads, head_dim=head_dim, d_ff=args.d_ff,
                  max_positions=args.max_positions or args.context, **special)
    if args.arch == "gpt2":
        return ModelConfig(arch="gpt2", n_kv_heads=args.heads, norm_eps=1e-5,
                           activation="gelu_tanh", tie_embeddings=True, qkv_bias=True,
                           out_bias=True, mlp_bias=True, model_type="gpt2", **common)
    return ModelConfig(arch="llama", n_kv_heads=args.kv_heads or args.heads, norm_eps=1e-5,
                       activation="silu", tie_embeddings=False,
                       rope_theta=10000.0, model_type="llama", **common)


def init(config, seed: int):
    """GPT-2 initialisation: N(0, 0.02), residual output projections scaled by 1/sqrt(2L)."""
    import jax

    from specjax.model.params import init_params

    params = init_params(config, jax.random.key(seed), std=0.02)
    scale = 1.0 / math.sqrt(2 * config.n_layers)
    layers = params["layers"]
    for name in ("wo", "w_out", "w_down"):
        if name in layers:
            layers[name] = layers[name] * scale
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

    from specjax import Model
    from specjax.io.checkpoint import save
    from specjax.model.transformer import count_params

    started = time.time()
    tokenizer = Tokenizer.from_file(str(args.tokenizer))
    data = _corpus.corpus(args.tokenizer)
    train_tokens, context = data["train"], args.context
    config = build_config(args, tokenizer.get_vocab_size(with_added_tokens=True))
    params = init(config, args.seed)
    n_params = count_params(params)
    print(f"{args.out}: {config.arch}, {n_params:,} parameters, "
          f"{train_tokens.size:,} training tokens", flush=True)

    rng = np.random.default_rng(args.seed)

    def next_batch():
        starts = rng.integers(0, train_tokens.size - context - 1, size=args.batch)
        return jnp.asarray(windows_at(train_tokens, starts, context + 1))

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

    out = Path(args.out)
    save(Model(config, params, tokenizer), out, dtype="float16")
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
        "machine": {"platform": platform.platform(), "processor": platform.processor() or
                    platform.machine(), "cpu_count": os.cpu_count(),
                    "jax": jax.__version__, "backend": jax.default_backend(),
                    "python": platform.python_version()},
        "log": log,
    }
    (out / "train_log.json").write_text(json.dumps(record, indent=1) + "\n")
    write_card(out)
    print(f"saved {out} in {time.time() - started:.0f} s", flush=True)


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
    if args.teacher:
        teacher = Path(args.teacher)
        parts += ["--teacher", f"weights/{teacher.name}" if teacher.is_dir() else args.teacher,
                  "--distill-weight", args.distill_weight]
    if done < steps:   # cut short by --minutes: the schedule is still that of `steps`
        parts += ["--stop-after", done]
    parts += ["--out", f"weights/{Path(args.out).name}"]
    return shlex.join(str(p) for p in parts)
