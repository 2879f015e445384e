"""Stage: Medusa heads for a frozen target (`specjax.heads.medusa`), from data to a shipped directory.

    python scripts/train.py medusa-data --target smollm2 --out runs/medusa/smollm2
    python scripts/train.py medusa --data runs/medusa/smollm2 --target smollm2 \
        --out weights/smollm2-medusa

`medusa-data` makes the training set once: the target's own greedy continuations of chat and
code prompts (self-distillation: the labels are exactly the tokens greedy decoding will ask the
heads for), then one teacher-forced pass of the target over each document that caches its final
hidden states (float16). Training then never runs the target: each example is a cached hidden
state h_t and the K tokens after the next, so an epoch costs only the heads' own work.

`--text-windows` adds stdlib windows in two forms for the labels comparison (`medusa
--labels data`): the original text after a 32-token prompt (the data's next tokens) and the
target's greedy continuation of the same prompt.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import time
from pathlib import Path

import _corpus
import numpy as np
from _cards import write_heads_card
from _training import command_line
from _training import resolve_checkpoint as resolve

from specjax.train.medusa import best_tree, verify_cost   # the tree search `train medusa` runs

# The verify call on SmolLM2-135M by its size, measured by `scripts/bench_forward.py --sizes` on
# the 2-core host (a call of n tokens over a one-token step), interpolated to price a tree of
# n - 1 nodes. (An earlier measurement on the same machine type gave 1.42 for 5 tokens.)
SMOLLM2_VERIFY_COST = {1: 0.98, 3: 1.36, 5: 1.64, 9: 1.95, 13: 2.16, 17: 2.42, 25: 2.6}


# -- Data -----------------------------------------------------------------------------------------

def _jobs(args, target, directory: Path) -> list[dict]:
    """The documents to generate: (kind, prompt ids, new tokens, eos ids, original text)."""
    jobs = []
    if target.tokenizer.token_to_id("<|im_start|>") is not None and args.chat_prompts:
        questions = random.Random(args.seed).sample(_corpus.chat_questions(), args.chat_prompts)
        for i, q in enumerate(questions):
            prompt = _corpus.chatml(q, _corpus.SMOLLM2_SYSTEM if i % 2 else None)
            jobs.append({"kind": "chat", "prompt": target.tokenizer.encode(prompt).ids,
                         "new": args.chat_new_tokens, "eos": None})
    if args.code_prompts:
        shaped = _corpus.code_prompts(args.code_prompts, args.seed)
        jobs += sorted(({"kind": kind, "prompt": target.tokenizer.encode(p).ids,
                         "new": args.code_new_tokens, "eos": None} for kind, p in shaped),
                       key=lambda j: len(j["prompt"]))
    if args.text_windows:
        stream = _corpus.corpus(directory / "tokenizer.json")["train"]
        length = args.text_prompt_len + args.text_new_tokens
        starts = np.random.default_rng(args.seed).integers(0, stream.size - length,
                                                           size=args.text_windows)
        for s in starts:
            window = stream[s:s + length].tolist()
            jobs.append({"kind": "text", "prompt": window[:args.text_prompt_len],
                         "new": args.text_new_tokens, "eos": (), "original": window})
    context = target.config.max_positions
    return [j for j in jobs if len(j["prompt"]) + j["new"] <= context]


def medusa_data(args) -> None:
    """Greedy continuations (resumable: one JSON line per document), then cached hidden states."""
    import specjax

    started = time.time()
    directory = resolve(args.target)
    target = specjax.load(directory)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    docs_file = out / "documents.jsonl"
    done = docs_file.read_text().splitlines() if docs_file.exists() else []
    jobs = _jobs(args, target, directory)
    print(f"{len(jobs)} documents, {len(done)} already generated", flush=True)
    with open(docs_file, "a") as f:
        for first in range(len(done), len(jobs), args.batch):
            batch = jobs[first:first + args.batch]
            t0 = time.time()
            result = specjax.generate(target, [j["prompt"] for j in batch], temperature=0.0,
                                      max_new_tokens=max(j["new"] for j in batch),
                                      eos_ids=batch[0]["eos"])
            for job, new in zip(batch, result.tokens):
                f.write(json.dumps({"kind": job["kind"], "prompt": job["prompt"], "new": new,
                                    "original": job.get("original")}) + "\n")
            f.flush()
            print(f"documents {first}-{first + len(batch)}: {result.stats.new_tokens} tokens in "
                  f"{time.time() - t0:.0f} s", flush=True)
    generate_s = time.time() - started

    docs = [json.loads(line) for line in docs_file.read_text().splitlines()]
    # Text windows are also kept in their original form, for `--labels data`.
    sequences = [(d["kind"], d["prompt"] + d["new"], len(d["prompt"])) for d in docs]
    sequences += [("text-original", d["original"], len(d["prompt"])) for d in docs
                  if d.get("original")]
    # Forced windows: stdlib text read by the target, nothing generated (see `examples`).
    if args.forced_windows:
        stream = _corpus.corpus(directory / "tokenizer.json")["train"]
        starts = np.random.default_rng(args.seed + 1).integers(
            0, stream.size - args.forced_len, size=args.forced_windows)
        sequences += [("forced", stream[s:s + args.forced_len].tolist(), 1) for s in starts]
    t0 = time.time()
    positions = cache_hidden(target, sequences, args.batch, out)
    meta = {"target": args.target, "documents": len(docs),
            "forced_windows": args.forced_windows, "forced_len": args.forced_len,
            "generated_tokens": int(sum(len(d["new"]) for d in docs)),
            "tokens": positions, "generate_s": round(generate_s, 1),
            "hidden_s": round(time.time() - t0, 1),
            "kinds": {k: sum(1 for kind, _, _ in sequences if kind == k) for k in
                      sorted({kind for kind, _, _ in sequences} - {"text-original"})},
            "command": command_line("medusa-data", args, (
                "target", "chat_prompts", "code_prompts", "text_windows", "text_prompt_len",
                "text_new_tokens", "chat_new_tokens", "code_new_tokens", "forced_windows",
                "forced_len", "batch", "seed", "out"))}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta, indent=1))


def cache_hidden(target, sequences: list[tuple[str, list[int], int]], batch: int,
                 out: Path, layers: tuple[int, ...] = ()) -> int:
    """One teacher-forced pass of `target` over `sequences`, (kind, token ids, prompt length)
    each: writes out/hidden.npy, the final-normed hidden states of every position (float16,
    the documents concatenated in order), and out/index.npz (tokens, starts, prompt_length,
    kinds); returns the number of positions. With `layers` (counts of decoder layers, e.g.
    (3, 15, 28)) also out/layers.npy [N, len(layers), D] float16: the residual stream after
    that many layers, EAGLE-3's low, middle and high features. Shared by `medusa-data` and
    `eagle-features`, so that a set rebuilt from its token sequences is the set that was
    generated."""
    tokens = np.concatenate([np.asarray(s, np.int32) for _, s, _ in sequences])
    starts = np.cumsum([0] + [len(s) for _, s, _ in sequences])
    d = target.config.d_model
    hidden = np.lib.format.open_memmap(out / "hidden.npy", mode="w+", dtype=np.float16,
                                       shape=(tokens.size, d))
    taps = (np.lib.format.open_memmap(out / "layers.npy", mode="w+", dtype=np.float16,
                                      shape=(tokens.size, len(layers), d)) if layers else None)
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i][1]))
    for first in range(0, len(order), batch):
        rows = order[first:first + batch]
        width = max(len(sequences[i][1]) for i in rows)
        ids = np.zeros((len(rows), width), np.int32)
        for r, i in enumerate(rows):
            ids[r, :len(sequences[i][1])] = sequences[i][1]
        positions = np.broadcast_to(np.arange(width, dtype=np.int32), ids.shape)
        x, tapped = layer_states(target, ids, positions, layers)
        for r, i in enumerate(rows):
            hidden[starts[i]:starts[i + 1]] = x[r, :len(sequences[i][1])]
            if taps is not None:
                taps[starts[i]:starts[i + 1]] = tapped[r, :len(sequences[i][1])]
    hidden.flush()
    if taps is not None:
        taps.flush()
    np.savez(out / "index.npz", tokens=tokens, starts=starts,
             prompt_length=np.array([p for _, _, p in sequences], np.int32),
             kinds=np.array([k for k, _, _ in sequences]))
    return int(tokens.size)


def layer_states(target, ids, positions, layers: tuple[int, ...] = ()):
    """The final-normed hidden states [B, T, D] of `target` on `ids`, and the residual stream
    after each count of decoder layers in `layers` [B, T, len(layers), D] (None without)."""
    from specjax.model.transformer import decoder_layers, final_norm

    params, config = target.params, target.config
    if config.arch != "llama" and layers:
        raise SystemExit("layer features are implemented for Llama-family targets")
    if list(layers) != sorted(set(layers)) or any(not 1 <= n <= config.n_layers for n in layers):
        raise SystemExit(f"--layers must be increasing counts in 1..{config.n_layers}, "
                         f"got {layers}")
    x, done, tapped = params["embed"][ids], 0, []
    if config.arch == "gpt2":
        x = x + params["pos_embed"][positions]
    for n in [*layers, config.n_layers]:
        x, _ = decoder_layers(params["layers"][done:n], config, x, positions)
        tapped.append(x)
        done = n
    x = np.asarray(final_norm(params, config, x), np.float32)
    return x, (np.stack([np.asarray(t) for t in tapped[:-1]], axis=2) if layers else None)


def examples(data: list[Path], heads: int, kinds: tuple[str, ...], validation_every: int,
             target=None):
    """Rows of the cached sets: (position in their hidden states, concatenated in order, and
    labels [K] or -1) per split.

    In a generated document, a position t is an example when it is at or after the last prompt
    position (so every label is a generated token, or a data token for "text-original") and at
    least one of its K labels, tokens t + 2 .. t + 1 + K, is inside the document. In a "forced"
    window (text the target only read) head k's label at t is the target's own greedy token at
    t + k, kept only where the text's tokens t + 1 .. t + k are the target's greedy tokens too:
    exactly what a greedy continuation from t would have produced, at the price of one forward
    pass instead of generation. One document in `validation_every` of each set is held out; a
    document that an earlier set already holds (the same kind and tokens) is skipped.
    """
    split = {"train": ([], []), "validation": ([], [])}
    seen, offset = set(), 0
    for directory in data:
        index = np.load(directory / "index.npz")
        tokens, starts = index["tokens"], index["starts"]
        greedy = (greedy_tokens(directory, target) if "forced" in kinds and "forced" in
                  set(map(str, index["kinds"])) else None)
        for i, kind in enumerate(index["kinds"]):
            begin, end = int(starts[i]), int(starts[i + 1])
            key = (str(kind), tokens[begin:end].tobytes())
            if str(kind) not in kinds or key in seen:
                continue
            seen.add(key)
            t = np.arange(begin + int(index["prompt_length"][i]) - 1, end - 2)
            if t.size == 0:
                continue
            k = np.arange(1, heads + 1)[None]
            if str(kind) == "forced":
                agree = np.zeros(end - begin, bool)           # text[p + 1] == greedy[p]
                agree[:-1] = tokens[begin + 1:end] == greedy[begin:end - 1]
                run = np.cumprod(agree[np.minimum((t - begin)[:, None] + np.arange(heads)[None],
                                                  end - begin - 1)], axis=1).astype(bool)
                labels = np.where(run & (t[:, None] + k < end), greedy[np.minimum(t[:, None] + k,
                                                                                  end - 1)], -1)
            else:
                ahead = t[:, None] + 1 + k                                   # [T, K]
                labels = np.where(ahead < end, tokens[np.minimum(ahead, end - 1)], -1)
            keep = labels[:, 0] >= 0
            name = "validation" if i % validation_every == validation_every - 1 else "train"
            split[name][0].append(offset + t[keep])
            split[name][1].append(labels[keep])
        offset += int(starts[-1])
    return {name: (np.concatenate(t), np.concatenate(y)) for name, (t, y) in split.items()}


def greedy_tokens(directory: Path, target, batch: int = 2048) -> np.ndarray:
    """The target's greedy token at every cached position of a set (from its cached hidden
    states and its LM head), computed once into greedy.npy."""
    import jax.numpy as jnp

    from specjax.model.transformer import lm_head

    path = directory / "greedy.npy"
    if path.exists():
        return np.load(path)
    hidden = np.load(directory / "hidden.npy", mmap_mode="r")
    out = np.empty(hidden.shape[0], np.int32)
    for first in range(0, hidden.shape[0], batch):
        h = jnp.asarray(hidden[first:first + batch], jnp.float32)
        logits = lm_head(target.params, target.config, h[None])[0]
        out[first:first + batch] = np.asarray(jnp.argmax(logits, axis=-1))
    np.save(path, out)
    return out


def cached_hidden(data: list[Path]) -> np.ndarray:
    """The cached hidden states of the sets, concatenated (float16, in memory)."""
    return np.concatenate([np.load(directory / "hidden.npy") for directory in data])


def frequent_tokens(labels: np.ndarray, count: int, vocab: int) -> np.ndarray:
    """The `count` most frequent label ids (ties by id), then the rest by id to fill up."""
    freq = np.bincount(labels[labels >= 0], minlength=vocab)
    return np.argsort(-freq, kind="stable")[:count].astype(np.int32)


def train_heads(args) -> dict:
    import jax
    import jax.numpy as jnp
    import optax

    import specjax
    from specjax.heads import medusa

    started = time.time()
    directory = resolve(args.target)
    target = specjax.load(directory)
    data = [Path(d) for d in args.data]
    kinds = ("text-original",) if args.labels == "data" else tuple(args.kinds)
    sets = examples(data, args.heads, kinds, args.validation_every, target)
    valid_sets = examples(data, args.heads, tuple(args.eval_kinds), args.validation_every, target)
    hidden = cached_hidden(data)
    train_rows, train_labels = sets["train"]
    eval_rows, eval_labels = valid_sets["validation"]
    vocab = target.config.vocab_size
    ids = frequent_tokens(train_labels, args.tokens, vocab)
    to_subset = np.full(vocab, -1, np.int32)
    to_subset[ids] = np.arange(ids.size)
    config = medusa.HeadsConfig(num_heads=args.heads, num_blocks=args.blocks,
                                hidden_size=target.config.d_model, vocab_size=vocab,
                                subset_size=ids.size)
    heads = medusa.init_heads(config, target, ids)
    weights = medusa.runtime_weights(heads, target)
    proj = weights["proj"]
    lam = jnp.asarray([args.decay ** k for k in range(1, args.heads + 1)], jnp.float32)

    def loss_fn(blocks, h, y):
        logits = medusa.subset_logits({"blocks": blocks, "proj": proj}, h)      # [B, K, S]
        y_sub = jnp.asarray(to_subset)[jnp.maximum(y, 0)]
        mask = (y >= 0) & (y_sub >= 0)
        logp = jax.nn.log_softmax(logits, axis=-1)
        nll = -jnp.take_along_axis(logp, jnp.maximum(y_sub, 0)[..., None], axis=-1)[..., 0]
        per_head = jnp.sum(nll * mask, axis=0) / jnp.maximum(jnp.sum(mask, axis=0), 1)
        return jnp.sum(lam * per_head), per_head

    steps = args.steps or max(1, int(args.epochs * len(train_rows) / args.batch))
    schedule = optax.warmup_cosine_decay_schedule(0.0, args.lr, min(args.warmup, steps // 5),
                                                  steps, args.lr * 0.1)
    optimizer = optax.chain(optax.clip_by_global_norm(1.0),
                            optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=args.weight_decay))
    blocks = heads.params["blocks"]
    opt_state = optimizer.init(blocks)

    @jax.jit
    def train_step(blocks, opt_state, h, y):
        (loss, per_head), grads = jax.value_and_grad(loss_fn, has_aux=True)(blocks, h, y)
        updates, opt_state = optimizer.update(grads, opt_state, blocks)
        return optax.apply_updates(blocks, updates), opt_state, loss, per_head

    rng = np.random.default_rng(args.seed)
    log, t0 = [], time.time()
    order = rng.permutation(len(train_rows))
    cursor = 0
    for step in range(1, steps + 1):
        if cursor + args.batch > len(order):
            order, cursor = rng.permutation(len(train_rows)), 0
        pick = np.sort(order[cursor:cursor + args.batch])
        cursor += args.batch
        h = jnp.asarray(hidden[train_rows[pick]], jnp.float32)
        blocks, opt_state, loss, per_head = train_step(blocks, opt_state, h,
                                                       jnp.asarray(train_labels[pick]))
        if step % args.log_every == 0 or step == steps:
            log.append({"step": step, "loss": float(loss),
                        "per_head": [round(float(v), 4) for v in per_head],
                        "seconds": round(time.time() - t0, 1)})
            print(json.dumps(log[-1]), flush=True)
    train_s = time.time() - t0
    trained = medusa.Heads(config, {"blocks": blocks}, ids, heads.target)
    accuracy = rank_accuracy(trained, target, hidden, eval_rows, eval_labels)
    last = log[-1]["per_head"] if log else []
    record = {"steps": steps, "batch": args.batch, "epochs": round(steps * args.batch / len(train_rows), 2),
              "train_examples": int(len(train_rows)), "validation_examples": int(len(eval_rows)),
              "train_s": round(train_s, 1), "labels": args.labels, "kinds": list(kinds),
              "eval_kinds": list(args.eval_kinds), "decay": args.decay, "lr": args.lr,
              "warmup": min(args.warmup, steps // 5), "weight_decay": args.weight_decay,
              "tokens": int(ids.size), "validation_every": args.validation_every,
              "label_coverage": round(float(np.mean(np.isin(eval_labels[eval_labels >= 0], ids))), 4),
              "top1": [round(float(a[0]), 4) for a in accuracy],
              "top5": [round(float(a[:5].sum()), 4) for a in accuracy],
              "final_train_loss": last,
              "rank_accuracy": [[round(float(v), 4) for v in a] for a in accuracy],
              "log": log}
    print(json.dumps({k: v for k, v in record.items() if k not in ("log", "rank_accuracy")}),
          flush=True)
    if args.out:
        tree, expected = best_tree(accuracy, args.max_nodes, args.verify_cost)
        trained = medusa.Heads(config, {"blocks": blocks}, ids, heads.target, tree)
        record.update(tree=[list(p) for p in tree.paths], expected_tokens_per_call=expected,
                      max_nodes=args.max_nodes,
                      verify_cost={str(n): c for n, c in sorted(args.verify_cost.items())},
                      target=args.target,
                      data=[json.loads((d / "meta.json").read_text()) for d in data],
                      seconds=round(time.time() - started, 1), machine=machine(),
                      command=shlex.join(["python", "scripts/train.py", *args.argv]))
        out = Path(args.out)
        previous = out / "train_log.json"
        if previous.exists():     # a labels comparison made for an earlier run stays
            kept = json.loads(previous.read_text()).get("labels_comparison")
            if kept:
                record["labels_comparison"] = kept
        medusa.save_heads(trained, out, extra={"loss_weights": [round(args.decay ** k, 6) for k in
                                                                range(1, args.heads + 1)]})
        (out / "train_log.json").write_text(json.dumps(record, indent=1) + "\n")
        write_heads_card(out)
        print(f"wrote {out}: tree of {tree.size} nodes, expected {expected:.2f} tokens per call")
    return record


def compare_labels(args) -> None:
    """`medusa-labels`: the same training run with self-distilled labels and with the data's
    next tokens, both evaluated on the held-out generated documents; written into the shipped
    heads' train_log.json and card."""
    runs = {}
    for labels in ("self", "data"):
        print(f"-- labels {labels}", flush=True)
        # The same prompts either way: the target's continuation ("text") or the original text.
        run = argparse.Namespace(**{**vars(args), "labels": labels, "kinds": ["text"],
                                    "out": None})
        runs[labels] = {k: v for k, v in train_heads(run).items()
                        if k in ("steps", "train_examples", "kinds", "top1", "top5", "train_s")}
    out = Path(args.heads_dir)
    record = json.loads((out / "train_log.json").read_text())
    record["labels_comparison"] = {
        **runs, "command": shlex.join(["python", "scripts/train.py", *args.argv])}
    (out / "train_log.json").write_text(json.dumps(record, indent=1) + "\n")
    write_heads_card(out)
    print(json.dumps(record["labels_comparison"], indent=1))


def choose_tree(args) -> None:
    """`medusa-tree`: measure the greedy tokens per target call of candidate trees (the best
    trees of several sizes under the heads' rank accuracies) on held-out prompts, the bench
    suite's (all but the long-editing ones, which do not fit every context), and ship the tree
    with the best measured tokens per unit of verify cost among those reaching
    --min-tokens-per-call (the most tokens per call when none does)."""
    import specjax
    from specjax.api.generate import generate
    from specjax.bench.prompts import SUITE
    from specjax.io import chat
    from specjax.sampling.tree import Tree

    out = Path(args.heads_dir)
    record = json.loads((out / "train_log.json").read_text())
    target = specjax.load(resolve(record["target"]))
    heads = specjax.load(out)
    prompts = [chat.encode(target, chat.render(target, p["prompt"])) if p.get("chat") else
               p["prompt"] for p in SUITE["prompts"] if p["category"] != "long-code-editing"]
    accuracy = np.asarray(record["rank_accuracy"])
    rows = []
    for size in args.sizes:
        tree, _ = best_tree(accuracy, size, {1: 1.0, 2: 1.0})   # the most expected tokens
        result = generate(target, prompts, method="medusa", heads=heads, tree=tree,
                          max_new_tokens=args.new_tokens, temperature=0.0)
        tpc = result.stats.tokens_per_target_call
        cost = verify_cost(tree.size, args.verify_cost)
        rows.append({"nodes": tree.size, "tree": [list(p) for p in tree.paths],
                     "tokens_per_target_call": round(tpc, 3), "verify_cost": round(cost, 3),
                     "tokens_per_cost": round(tpc / cost, 3)})
        print(json.dumps(rows[-1]), flush=True)
    good = [r for r in rows if r["tokens_per_target_call"] >= args.min_tokens_per_call]
    pick = (max(good, key=lambda r: r["tokens_per_cost"]) if good else
            max(rows, key=lambda r: r["tokens_per_target_call"]))
    chosen = Tree.from_paths([tuple(p) for p in pick["tree"]])
    medusa_heads = specjax.Heads(heads.config, heads.params, heads.token_ids, heads.target, chosen)
    specjax.save_heads(medusa_heads, out, extra={"loss_weights": [
        round(record["decay"] ** k, 6) for k in range(1, heads.config.num_heads + 1)]})
    record.update(tree=pick["tree"], tree_choice={
        "prompts": len(prompts), "new_tokens": args.new_tokens,
        "min_tokens_per_call": args.min_tokens_per_call, "rows": rows,
        "verify_cost": {str(n): c for n, c in sorted(args.verify_cost.items())},
        "command": shlex.join(["python", "scripts/train.py", *args.argv])})
    (out / "train_log.json").write_text(json.dumps(record, indent=1) + "\n")
    write_heads_card(out)
    print(f"shipped tree: {pick}")


def machine() -> dict:
    import os
    import platform

    import jax

    return {"platform": platform.platform(), "cpu_count": os.cpu_count(), "cpu": cpu_name(),
            "jax": jax.__version__, "python": platform.python_version()}


def cpu_name() -> str:
    """The CPU as the cards name it: its model and its widest vector extension (the hosts of
    one model name differ there), e.g. "AMD EPYC, AVX-512"; from /proc/cpuinfo on Linux."""
    import platform

    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        return model
    vector = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else None
    return f"{model}, {vector}" if vector else model


def rank_accuracy(heads, target, hidden, rows, labels, ranks: int = 10, batch: int = 4096):
    """a[k][r]: how often head k's r-th most likely token is the label ([K, ranks]); labels
    outside the heads' tokens count as misses."""
    import jax.numpy as jnp

    from specjax.heads import medusa

    weights = medusa.runtime_weights(heads, target)
    hits = np.zeros((heads.config.num_heads, ranks))
    counts = np.zeros(heads.config.num_heads)
    for first in range(0, len(rows), batch):
        h = jnp.asarray(hidden[rows[first:first + batch]], jnp.float32)
        top = np.asarray(weights["ids"])[np.argsort(-np.asarray(medusa.subset_logits(weights, h)),
                                                    axis=-1)[..., :ranks]]      # [B, K, R]
        y = labels[first:first + batch]
        hits += np.sum((top == y[..., None]) & (y[..., None] >= 0), axis=0)
        counts += np.sum(y >= 0, axis=0)
    return hits / counts[:, None]


def parse_cost(text: str) -> dict[int, float]:
    return {int(a): float(b) for a, b in (item.split(":") for item in text.split(","))}


def add_commands(sub) -> None:
    p = sub.add_parser("medusa-data", help="the target's greedy continuations and its cached "
                                           "hidden states, for `medusa`")
    p.add_argument("--target", required=True, help="a checkpoint directory or fetch name")
    p.add_argument("--chat-prompts", type=int, default=512)
    p.add_argument("--code-prompts", type=int, default=384,
                   help="prompts shaped from the stdlib's functions and modules")
    p.add_argument("--text-windows", type=int, default=0,
                   help="stdlib windows continued by the target and kept as text too")
    p.add_argument("--text-prompt-len", type=int, default=32)
    p.add_argument("--text-new-tokens", type=int, default=96)
    p.add_argument("--chat-new-tokens", type=int, default=128)
    p.add_argument("--code-new-tokens", type=int, default=96)
    p.add_argument("--forced-windows", type=int, default=0,
                   help="stdlib windows only read by the target: labels where it agrees")
    p.add_argument("--forced-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=medusa_data)

    common = argparse.ArgumentParser(add_help=False)    # training options, both commands
    common.add_argument("--data", type=Path, nargs="+", required=True,
                        help="`medusa-data` sets; documents repeated in a later set are skipped")
    common.add_argument("--target", required=True)
    common.add_argument("--heads", type=int, default=4)
    common.add_argument("--blocks", type=int, default=1)
    common.add_argument("--tokens", type=int, default=4096,
                        help="the frequency-ranked vocabulary subset the heads project onto")
    common.add_argument("--kinds", nargs="+",
                        default=["chat", "function", "module", "edit", "text", "forced"])
    common.add_argument("--eval-kinds", nargs="+",
                        default=["chat", "function", "module", "edit", "text"])
    common.add_argument("--epochs", type=float, default=4.0)
    common.add_argument("--steps", type=int, default=0, help="default: from --epochs")
    common.add_argument("--batch", type=int, default=512)
    common.add_argument("--lr", type=float, default=1e-3)
    common.add_argument("--warmup", type=int, default=50)
    common.add_argument("--weight-decay", type=float, default=0.0)
    common.add_argument("--decay", type=float, default=0.8, help="lambda_k = decay ** k")
    common.add_argument("--validation-every", type=int, default=16)
    common.add_argument("--max-nodes", type=int, default=16)
    common.add_argument("--verify-cost", type=parse_cost,
                        default=SMOLLM2_VERIFY_COST,
                        help="call size:cost pairs, e.g. 1:1,5:1.42,9:1.76,16:1.94")
    common.add_argument("--seed", type=int, default=0)
    common.add_argument("--log-every", type=int, default=50)
    p = sub.add_parser("medusa", parents=[common], help="train Medusa heads on a `medusa-data` set")
    p.add_argument("--labels", choices=("self", "data"), default="self",
                   help="self: the target's greedy continuations; data: the stdlib text")
    p.add_argument("--out", type=Path)
    p.set_defaults(func=train_heads)

    p = sub.add_parser("medusa-labels", parents=[common],
                       help="train on the same text windows with self-distilled and with the "
                            "data's labels, the same steps, and record both in a heads card")
    p.add_argument("--heads-dir", type=Path, required=True, help="the shipped heads to annotate")
    p.set_defaults(func=compare_labels)

    p = sub.add_parser("medusa-tree", help="measure candidate trees on held-out prompts and "
                                           "ship the one the rule picks")
    p.add_argument("--heads-dir", type=Path, required=True)
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--min-tokens-per-call", type=float, default=1.6)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--verify-cost", type=parse_cost, default=SMOLLM2_VERIFY_COST)
    p.set_defaults(func=choose_tree)
