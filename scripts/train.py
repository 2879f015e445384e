"""Trains the small checkpoints shipped in weights/ (and their tokenizer), then measures them.

    python scripts/train.py tokenizer --out runs/tokenizer.json
    python scripts/train.py model --arch llama --layers 2 --d-model 128 ... --out weights/llama-draft
    python scripts/train.py evaluate --draft weights/llama-draft --target weights/llama-target
    python scripts/train.py index

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
import sys
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

def build_config(args, vocab_size: int):
    from specjax import ModelConfig

    head_dim = args.d_model // args.heads
    common = dict(vocab_size=vocab_size, d_model=args.d_model, n_layers=args.layers,
                  n_heads=args.heads, head_dim=head_dim, d_ff=args.d_ff,
                  max_positions=args.context, bos_token_id=_corpus.EOT_ID,
                  eos_token_ids=(_corpus.EOT_ID,))
    if args.arch == "gpt2":
        return ModelConfig(arch="gpt2", n_kv_heads=args.heads, norm_eps=1e-5,
                           activation="gelu_tanh", tie_embeddings=True, qkv_bias=True,
                           out_bias=True, mlp_bias=True, model_type="gpt2", **common)
    return ModelConfig(arch="llama", n_kv_heads=args.kv_heads or args.heads, norm_eps=1e-5,
                       activation="silu", tie_embeddings=False, rope_theta=10000.0,
                       model_type="llama", **common)


def init(config, seed: int):
    """GPT-2 initialisation: N(0, 0.02), residual output projections scaled by 1/sqrt(2L)."""
    import jax

    from specjax import init_params

    params = init_params(config, jax.random.key(seed), std=0.02)
    scale = 1.0 / math.sqrt(2 * config.n_layers)
    for name in ("wo", "w_out", "w_down"):
        if name in params["layers"]:
            params["layers"][name] = params["layers"][name] * scale
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

    def make_step(optimizer):
        @jax.jit
        def step(params, opt_state, windows):
            loss, grads = jax.value_and_grad(loss_fn)(params, config, windows)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss, optax.global_norm(grads)
        return step

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
    expected = (1 - rate ** (args.k + 1)) / (1 - rate) if rate < 1 else args.k + 1
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
                f"drafted tokens accepted; {spec['expected_tokens_per_target_call']:.2f} expected "
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
    held_out = ", ".join(f"`{f}`" for f in data["validation_files"])
    stop = (f" of a {record['resolved_steps']}-step schedule (`--stop-after "
            f"{record['steps_done']}`: the pair's first run was cut there by its wall-clock cap)"
            if record["stopped_by_minutes"] else "")
    text = f"""# {name}

A small {arch.split(' (')[0]} model trained from scratch on the Python standard library's source
code, shipped with specjax as the **{role}** of the `{name.split('-')[0]}` speculative-decoding
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

Next-token cross-entropy on random {hp['context']}-token windows of the training stream, batch
{hp['batch']}, AdamW (b1 0.9, b2 0.95, weight decay {hp['weight_decay']} on weight matrices and embeddings),
peak learning rate {hp['lr']} with {hp['warmup']} warmup steps and cosine decay to 10%,
gradient clipping at {hp['clip']}, seed {hp['seed']}, float32. The draft and the target of a
pair share the seed, the schedule and the stopping step, so they see the same windows in the
same order: the difference between them is the model size alone.

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

From the repository root, after `python scripts/train.py tokenizer` (see [../README.md](../README.md)):

```
{record['command']}
```

The command names the step count (and, for a run that the wall-clock cap `--minutes` cut
short, the step it stopped at), so a rerun does not depend on the machine's speed. Results are
reproducible on the same Python (the corpus is its standard library), tokenizers and JAX
versions.
"""
    (directory / "README.md").write_text(text)


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
    for name in ("llama-draft", "llama-target", "gpt2-draft", "gpt2-target"):
        if (WEIGHTS / name / "train_log.json").exists():
            commands.append(json.loads((WEIGHTS / name / "train_log.json").read_text())["command"])
    commands += ["python scripts/train.py evaluate --draft weights/llama-draft --target weights/llama-target",
                 "python scripts/train.py evaluate --draft weights/gpt2-draft --target weights/gpt2-target",
                 "python scripts/train.py index"]
    nl = "\n"
    text = f"""# Shipped checkpoints

Four small models trained from scratch on the Python standard library's source (CPython's own
`.py` files), so that the CLI, the examples and the tests have real models on a fresh machine,
with no download. Each directory is a Hugging Face checkpoint (`config.json`,
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
round-trips Python source, and each target's validation loss is below its draft's.

The model commands name their step counts (`--stop-after` where the original run was cut short
by its `--minutes` wall-clock cap), so they reproduce the shipped weights on any machine; give
`--minutes M` without `--steps` to let the script fit the steps to another time budget. Each card gives its own
command, data split, machine and results; `scripts/_corpus.py` documents the corpus.
"""
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
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=train_model)

    p = sub.add_parser("evaluate", help="greedy acceptance rate of a draft/target pair")
    p.add_argument("--draft", type=Path, required=True)
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    p.set_defaults(func=evaluate_pair)

    p = sub.add_parser("index", help="write weights/README.md from the checkpoints' records")
    p.set_defaults(func=write_index)

    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
