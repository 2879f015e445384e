"""Stage: EAGLE-1 drafters for a frozen target (`specjax.heads.eagle`), from data to a shipped directory.

    python scripts/train.py medusa-data --target smollm2 ... --out runs/eagle/smollm2
    python scripts/train.py eagle-sequences --data runs/eagle/smollm2 --out data/eagle/smollm2.npz
    python scripts/train.py eagle-features --sequences data/eagle/smollm2.npz --target smollm2 \
        --out runs/eagle/smollm2-features
    python scripts/train.py eagle-unroll --data runs/eagle/smollm2-features --target smollm2 \
        --minutes 5 --out runs/eagle/smollm2-unroll.json
    python scripts/train.py eagle --data runs/eagle/smollm2-features --target smollm2 \
        --unroll-comparison runs/eagle/smollm2-unroll.json --out weights/smollm2-eagle
    python scripts/train.py eagle-tree --drafter-dir weights/smollm2-eagle

The data is the Medusa stage's (scripts/_medusa_heads.py): the target's greedy continuations of
chat and code prompts, and its final-normed hidden states at every position, which are exactly
the drafter's features. `eagle-sequences` keeps the token sequences in the repository
(data/eagle/, a few hundred KB) and `eagle-features` rebuilds the hidden states from them with
one teacher-forced pass, so that neither a training cache of hundreds of MB nor the target's
generation is needed to train again.

Training never runs the target: an example is a window of a document's slots, slot s holding
(f_{s-1}, x_s), and both terms of the loss come from the cached features f_s (the regression
target, and through the target's LM-head rows, the target's next-token distribution).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import shlex
import time
from pathlib import Path

import _corpus
import numpy as np
from _cards import REPRODUCTIONS, flops_per_token, render
from _cards import write_index as write_checkpoints_index
from _eagle_data import load_sequences
from _medusa_heads import (
    SMOLLM2_VERIFY_COST,
    cache_hidden,
    frequent_tokens,
    machine,
    parse_cost,
    verify_cost,
)
from _training import resolve_checkpoint as resolve

GENERATED = ("chat", "function", "module", "edit", "text", "prose")  # the target continued them


# -- Data: the sequences in the repository, the features rebuilt from them ----------------------

def sequences(args) -> None:
    """`eagle-sequences`: a set's token sequences in compact form, with their provenance."""
    import specjax
    from specjax.heads.shared import tokenizer_digest

    directory = Path(args.data)
    index = np.load(directory / "index.npz")
    meta = json.loads((directory / "meta.json").read_text())
    target = specjax.load(resolve(meta["target"]))
    vocab = target.config.vocab_size
    if vocab > 2 ** 16:
        raise SystemExit(f"a vocabulary of {vocab} does not fit uint16 token ids")
    kinds = [str(k) for k in index["kinds"]]
    names = sorted(set(kinds))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, tokens=index["tokens"].astype(np.uint16),
                        starts=index["starts"].astype(np.int32),
                        prompt_length=index["prompt_length"].astype(np.int32),
                        kind=np.array([names.index(k) for k in kinds], np.uint8),
                        kind_names=np.array(names))
    lengths = np.diff(index["starts"])
    provenance = {
        "file": out.name, "sha256": hashlib.sha256(out.read_bytes()).hexdigest(),
        "data": str(directory), "target": meta["target"], "target_name": target.name,
        "tokenizer_sha256": tokenizer_digest(target.tokenizer), "vocab_size": vocab,
        "generated_by": meta["command"],
        "documents": len(kinds), "kinds": {k: kinds.count(k) for k in names},
        "tokens": int(index["tokens"].size),
        "generated_tokens": int(sum(lengths[i] - index["prompt_length"][i]
                                    for i, k in enumerate(kinds) if k in GENERATED)),
        "longest": int(lengths.max()),
        "layout": {"tokens": "uint16 [N], the documents concatenated",
                   "starts": "int32 [M + 1], document i is tokens[starts[i]:starts[i + 1]]",
                   "prompt_length": "int32 [M], tokens of document i that are its prompt",
                   "kind": "uint8 [M], an index into kind_names"}}
    out.with_suffix(".json").write_text(json.dumps(provenance, indent=1) + "\n")
    print(f"wrote {out} ({out.stat().st_size / 2 ** 10:,.0f} KB) and "
          f"{out.with_suffix('.json')}: {provenance['documents']} documents, "
          f"{provenance['tokens']:,} tokens")


def features(args) -> None:
    """`eagle-features`: the cached features of a sequences file (or of a shard directory of
    `eagle-data`, whose provenance is the .json beside it), by one teacher-forced pass of
    the target (`cache_hidden`, the pass `medusa-data` makes), checked against the file's
    recorded tokenizer so that a different target cannot silently produce a cache."""
    import specjax
    from specjax.heads.shared import tokenizer_digest

    started = time.time()
    path = Path(args.sequences)
    provenance = json.loads(path.with_suffix(".json").read_text())
    target = specjax.load(resolve(args.target))
    if tokenizer_digest(target.tokenizer) != provenance["tokenizer_sha256"]:
        raise SystemExit(f"{args.target}'s tokenizer is not the one {path} was made with "
                         f"({provenance['target_name']})")
    # A sequences file, or a shard directory of `eagle-data` (all its shards, or --shards).
    data = load_sequences(path, args.shards)
    names = [str(n) for n in data["kind_names"]]
    tokens, starts = data["tokens"].astype(np.int32), data["starts"]
    seqs = [(names[k], tokens[starts[i]:starts[i + 1]].tolist(), int(p))
            for i, (k, p) in enumerate(zip(data["kind"], data["prompt_length"]))]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    positions = cache_hidden(target, seqs, args.batch, out, tuple(args.layers))
    if "held_out" in data:      # eagle-data shards: the held-out rule and each row's sampling
        np.savez(out / "documents.npz", held_out=data["held_out"],
                 setting=np.asarray(data["setting_names"])[data["setting"]])
    kinds, generated = provenance["kinds"], provenance["generated_tokens"]
    if "held_out" in data:          # eagle-data shards, maybe not all: count what was read
        kinds = {k: int(n) for k, n in zip(*np.unique([s[0] for s in seqs], return_counts=True))}
        generated = int(np.sum(np.diff(starts) - data["prompt_length"]))
    meta = {"target": args.target, "documents": sum(n for k, n in kinds.items()
                                                    if k != "text-original"),
            "generated_tokens": generated, "tokens": positions,
            "generate_s": 0.0, "hidden_s": round(time.time() - started, 1),
            "kinds": {k: n for k, n in kinds.items() if k != "text-original"},
            "sequences": str(path), "shards": args.shards, "layers": args.layers,
            "generated_by": provenance["generated_by"],
            "command": shlex.join(["python", "scripts/train.py", "eagle-features",
                                   "--sequences", str(path), "--target", args.target,
                                   "--batch", str(args.batch), "--out", str(out)]
                                  + (["--shards", *map(str, args.shards)] if args.shards else [])
                                  + (["--layers", *map(str, args.layers)] if args.layers else []))}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta, indent=1))


@dataclasses.dataclass
class Documents:
    """The documents of the cached sets, concatenated: document i is rows begin[i]:end[i] of
    `tokens` and `hidden`, its first prompt[i] tokens the prompt."""
    tokens: np.ndarray        # [N] int32
    hidden: np.ndarray        # [N, D] float16, the target's features
    begin: np.ndarray         # [M]
    end: np.ndarray
    prompt: np.ndarray
    kind: list[str]
    held_out: np.ndarray      # [M] bool
    setting: list[str]        # how the target continued it: "greedy", "t0.7-p0.9", "t1"
    taps: np.ndarray | None = None   # [N, n D] float16: EAGLE-3's tapped states, or None

    @property
    def sources(self) -> np.ndarray:
        """What the drafter reads of the target at each position: the tapped states for an
        EAGLE-3 drafter (reduced inside it), else the final-normed features."""
        return self.hidden if self.taps is None else self.taps

    def select(self, kinds, held_out: bool, settings=None) -> np.ndarray:
        return np.array([i for i, k in enumerate(self.kind)
                         if k in kinds and self.held_out[i] == held_out
                         and (settings is None or self.setting[i] in settings)], int)


def load_documents(data: list[Path], validation_every: int,
                   fused_layers: tuple[int, ...] = ()) -> Documents:
    """The cached sets. Held out: in a set of `eagle-data` shards, the documents its rule
    marked (documents.npz: a prompt's documents in every setting go together); in an older set,
    document i when i % validation_every == validation_every - 1 (the Medusa stage's rule, so
    that EAGLE and Medusa numbers on the same set are measured on the same documents), its
    continuations greedy. A "text-original" document (the original text of a text window) goes
    with its generated twin, whose prompt it shares; a document that an earlier one already is
    (same kind and tokens) is dropped. With `fused_layers`, every set must hold the states
    after those layers (`eagle-features --layers`)."""
    tokens, hidden, taps, rows, seen, offset = [], [], [], [], set(), 0
    for directory in data:
        if fused_layers:
            meta = json.loads((directory / "meta.json").read_text())
            if tuple(meta.get("layers") or ()) != tuple(fused_layers):
                raise SystemExit(f"{directory} holds the states after layers "
                                 f"{meta.get('layers')}, not {list(fused_layers)}: run "
                                 f"eagle-features --layers {' '.join(map(str, fused_layers))}")
            tapped = np.load(directory / "layers.npy", mmap_mode="r")
            taps.append(np.asarray(tapped).reshape(tapped.shape[0], -1))
        index = np.load(directory / "index.npz")
        t, starts, prompts = index["tokens"], index["starts"], index["prompt_length"]
        shards = np.load(directory / "documents.npz") if (directory / "documents.npz").exists() \
            else None
        held_prompts = set()
        for i, kind in enumerate(map(str, index["kinds"])):
            b, e, p = int(starts[i]), int(starts[i + 1]), int(prompts[i])
            setting = str(shards["setting"][i]) if shards is not None else "greedy"
            if shards is not None:
                out = bool(shards["held_out"][i])
            elif kind == "text-original":     # after every generated document in the index
                out = t[b:b + p].tobytes() in held_prompts
            else:
                out = i % validation_every == validation_every - 1
                if out:
                    held_prompts.add(t[b:b + p].tobytes())
            key = (kind, t[b:e].tobytes())
            if key not in seen:
                seen.add(key)
                rows.append((offset + b, offset + e, p, kind, out, setting))
        tokens.append(t.astype(np.int32))
        hidden.append(np.load(directory / "hidden.npy"))
        offset += t.size
    begin, end, prompt, kind, held, setting = zip(*rows)
    return Documents(np.concatenate(tokens), np.concatenate(hidden), np.array(begin),
                     np.array(end), np.array(prompt), list(kind), np.array(held), list(setting),
                     np.concatenate(taps) if taps else None)


def windows(docs: Documents, picks: np.ndarray, size: int) -> np.ndarray:
    """[W, 3] (start row, stop row, row of the document's first token): the documents cut into
    windows of at most `size` slots. A window after a document's first keeps the absolute
    positions and takes the true feature before it as its first input; it does not see the
    slots before it, which is the price of a bounded width."""
    out = [(s, min(s + size, docs.end[i]), docs.begin[i])
           for i in picks for s in range(docs.begin[i], docs.end[i], size)]
    return np.array(out, np.int64)


class Batches:
    """Batches of windows, by width: each window goes to the smallest multiple of `quantum`
    slots that holds it, and a batch of width w has slots // w rows, so every batch costs about
    the same and padding stays under `quantum` slots a window. The order is a function of
    (seed, epoch) only, so a resumed run draws the batches of the run it resumes."""

    def __init__(self, docs: Documents, wins: np.ndarray, slots: int, quantum: int, seed: int):
        self.docs, self.wins, self.slots, self.seed = docs, wins, slots, seed
        lengths = wins[:, 1] - wins[:, 0]
        self.width = (-(-lengths // quantum) * quantum).astype(int)
        self.per_epoch = len(self.epoch(0))

    def epoch(self, e: int) -> list[np.ndarray]:
        rng = np.random.default_rng((self.seed, e))
        batches = []
        for w in np.unique(self.width):
            members = rng.permutation(np.flatnonzero(self.width == w))
            rows = max(1, self.slots // w)
            batches += [members[i:i + rows] for i in range(0, len(members), rows)]
        return [batches[i] for i in rng.permutation(len(batches))]

    def stream(self, skip: int = 0):
        """Batches forever from step `skip` on."""
        e, i = divmod(skip, self.per_epoch)
        while True:
            for picks in self.epoch(e)[i:]:
                yield self.arrays(picks)
            e, i = e + 1, 0

    def arrays(self, picks: np.ndarray) -> dict:
        """A batch: tokens, positions, mask [B, T]; the target's features [B, T, D] (float16,
        cast on the device); what the drafter reads of the target at each slot, [B, T, E]
        (`Documents.sources`: the features again, or EAGLE-3's tapped states); that at the
        slot before each window [B, E] and whether there is one (False: a document's start,
        where f_{-1} = 0)."""
        width = int(self.width[picks[0]])
        rows, d = len(picks), self.docs.hidden.shape[1]
        sources = self.docs.sources
        e = sources.shape[1]
        tokens = np.zeros((rows, width), np.int32)
        positions = np.zeros((rows, width), np.int32)
        mask = np.zeros((rows, width), bool)
        target = np.zeros((rows, width, d), np.float16)
        source = np.zeros((rows, width, e), np.float16) if self.docs.taps is not None else None
        first = np.zeros((rows, e), np.float16)
        for r, (start, stop, doc) in enumerate(self.wins[picks]):
            n = stop - start
            tokens[r, :n] = self.docs.tokens[start:stop]
            positions[r] = start - doc + np.arange(width)
            mask[r, :n] = True
            target[r, :n] = self.docs.hidden[start:stop]
            if source is not None:
                source[r, :n] = sources[start:stop]
            if start > doc:
                first[r] = sources[start - 1]
        return {"tokens": tokens, "positions": positions, "mask": mask, "target": target,
                "source": target if source is None else source,
                "first": first, "has_first": self.wins[picks, 0] > self.wins[picks, 2]}


# -- The loss and the training step --------------------------------------------------------------

def make_loss(config, unroll: int, decay: float, ce_weight: float, noise: float):
    """The EAGLE-1 loss on a batch, with `unroll` passes (training-time test, EAGLE-3's idea).

    Pass 0 reads the target's features, each with uniform noise of half-width `noise` (in the
    features' own units; EAGLE-1 used U(-0.1, 0.1)) so that the drafter learns to continue
    from features that are a little off, which is all it will have after its first step. Its
    loss at slot s is SmoothL1(f'_s, f_s) averaged over the D dimensions plus `ce_weight` x the
    cross-entropy of its subset logits against the target's distribution on the subset,
    softmax(E_S f_s): soft labels, the target's whole distribution rather than its argmax.

    Pass i > 0 feeds the previous pass's predictions back, slot s + 1 reading f'_s, and is
    weighted decay^i. This is stricter than drafting, where only the chain's own slots hold
    predictions and the context holds the target's features (EAGLE-3 builds that mask), but
    it needs no attention mask beyond the library's causal one. Gradients flow through the
    fed-back features, as in EAGLE-3."""
    import jax
    import jax.numpy as jnp
    import optax

    from specjax.heads.eagle import draft_features, draft_logits, from_target

    def loss_fn(trainable, frozen, batch, key):
        weights = {**trainable, "proj": frozen["proj"]}
        target = batch["target"].astype(jnp.float32)                          # [B, T, D]
        source = from_target(weights, config, batch["source"].astype(jnp.float32))
        first = from_target(weights, config, batch["first"].astype(jnp.float32))
        first = jnp.where(batch["has_first"][:, None], first, 0.0)
        inputs = jnp.concatenate([first[:, None], source[:, :-1]], axis=1)    # f_{s-1}
        is_feature = jnp.concatenate([batch["has_first"][:, None],
                                      jnp.ones_like(batch["mask"][:, 1:])], axis=1)
        inputs = inputs + is_feature[..., None] * jax.random.uniform(
            key, inputs.shape, minval=-noise, maxval=noise)
        soft = jax.nn.softmax(draft_logits(weights, config, target), axis=-1)        # [B, T, S]
        mask = batch["mask"].astype(jnp.float32)
        count = jnp.maximum(mask.sum(), 1.0)
        total, parts = 0.0, []
        for i in range(unroll):
            pred, _ = draft_features(weights, config, frozen["embed"], inputs, batch["tokens"],
                                     batch["positions"])
            logits = draft_logits(weights, config, pred)
            regression = jnp.sum(optax.huber_loss(pred, target).mean(-1) * mask) / count
            ce = jnp.sum(optax.softmax_cross_entropy(logits, soft) * mask) / count
            agree = jnp.sum((jnp.argmax(logits, -1) == jnp.argmax(soft, -1)) * mask) / count
            total = total + decay ** i * (regression + ce_weight * ce)
            parts.append(jnp.stack([regression, ce, agree]))
            inputs = jnp.concatenate([inputs[:, :1], pred[:, :-1]], axis=1)
        return total, jnp.stack(parts)                                        # [unroll, 3]

    return loss_fn


def subset_mass(target, docs: Documents, picks: np.ndarray, ids: np.ndarray,
                temperatures=(1.0, 0.7), positions: int = 4096) -> dict[float, float]:
    """The target's probability mass on the subset, mean over (up to `positions`, evenly
    spaced) generated positions of the documents `picks`, at each temperature: what a drafter
    that proposes only the subset can at best match when the target samples."""
    import jax
    import jax.numpy as jnp

    from specjax.model.transformer import lm_head

    rows = np.concatenate([np.arange(docs.begin[i] + docs.prompt[i] - 1, docs.end[i] - 1)
                           for i in picks])
    rows = rows[np.linspace(0, rows.size - 1, min(positions, rows.size)).astype(int)]
    inside = np.zeros(target.config.vocab_size, bool)
    inside[ids] = True
    head = jax.jit(lambda x: lm_head(target.params, target.config, x))
    out = {}
    for t in temperatures:
        total = 0.0
        for c in range(0, rows.size, 512):
            logits = head(jnp.asarray(docs.hidden[rows[c:c + 512]], jnp.float32))
            probs = jax.nn.softmax(logits / t, axis=-1)
            total += float(jnp.sum(probs[:, inside]))
        out[t] = total / rows.size
    return out


def make_optimizer(args):
    """AdamW (b1 0.9, b2 0.95, decay on the matrices) with gradient clipping, the learning
    rate an argument of each step rather than a schedule inside it: the compiled step does not
    depend on the step count, so the timing run that picks the count compiles it once for
    the training run too."""
    import jax
    import optax

    def decay_mask(params):
        return jax.tree.map(lambda a: a.ndim >= 2, params)

    return optax.chain(optax.clip_by_global_norm(args.clip), optax.scale_by_adam(0.9, 0.95),
                       optax.add_decayed_weights(args.weight_decay, decay_mask))


def make_step(loss_fn, optimizer):
    import jax
    import optax

    @jax.jit
    def step(trainable, opt_state, frozen, batch, key, lr):
        (loss, parts), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable, frozen,
                                                                          batch, key)
        updates, opt_state = optimizer.update(grads, opt_state, trainable)
        updates = jax.tree.map(lambda u: -lr * u, updates)
        return optax.apply_updates(trainable, updates), opt_state, loss, parts

    return step


def calibrate(step, trainable, opt_state, frozen, batches: Batches, minutes: float) -> int:
    """The steps that fit in `minutes` of training, from a timing run after compiling every
    batch width, with 15% left for the shared CPU being slower later than during the timing.
    The timing steps' updates are thrown away (learning rate 0, their own optimizer state)."""
    import jax

    key = jax.random.key(0)
    by_width = {}
    for picks in batches.epoch(0):
        by_width.setdefault(int(batches.width[picks[0]]), picks)
    for picks in by_width.values():
        step(trainable, opt_state, frozen, batches.arrays(picks), key, 0.0)[2].block_until_ready()
    t0, n = time.time(), 0
    for batch in batches.stream():
        step(trainable, opt_state, frozen, batch, key, 0.0)[2].block_until_ready()
        n += 1
        if n == 8:
            break
    per_step = (time.time() - t0) / n
    steps = max(10, int(60 * minutes * 0.85 / per_step))
    print(f"timing: {per_step:.2f} s/step -> {steps} steps in {minutes} minutes", flush=True)
    return steps


def save_checkpoint(path: Path, step: int, steps: int, trainable, opt_state) -> None:
    import jax

    leaves = jax.tree.leaves((trainable, opt_state))
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, step=step, steps=steps, **{f"leaf{i}": np.asarray(a)
                                             for i, a in enumerate(leaves)})
    tmp.replace(path)


def load_checkpoint(path: Path, trainable, opt_state):
    import jax
    import jax.numpy as jnp

    data = np.load(path)
    structure = jax.tree.structure((trainable, opt_state))
    leaves = [jnp.asarray(data[f"leaf{i}"]) for i in range(structure.num_leaves)]
    trainable, opt_state = jax.tree.unflatten(structure, leaves)
    return int(data["step"]), int(data["steps"]), trainable, opt_state


# -- Held-out evaluation: greedy chains ---------------------------------------------------------

def chain_accuracy(drafter, target, docs: Documents, picks: np.ndarray, depth: int,
                   rows: int = 256, group: int = 16) -> dict:
    """Greedy chain drafting on held-out documents, as decoding would run it.

    At a generated position s of a document (the target has read x_0 .. x_{s-1} and chosen
    x_s), the drafter's slots 0 .. s hold the true pairs (f_{j-1}, x_j) in its KV cache; it
    drafts x_{s+1} from slot s, then feeds its own predicted feature and drafted token back,
    slot after slot, for `depth` tokens. accuracy[d - 1] is the fraction of positions whose
    first d drafted tokens are all the document's, over the positions where the document has
    d tokens after s; for a greedy continuation those are the target's greedy tokens, so this
    is what a chain of d drafts would get accepted. Tokens outside the subset are misses."""
    import jax
    import jax.numpy as jnp

    from specjax.heads.eagle import draft_features, draft_logits, from_target, runtime_weights
    from specjax.model.cache import KVCache

    config, embed = drafter.config, target.params["embed"]
    weights = runtime_weights(drafter, target)
    width = int((docs.end[picks] - docs.begin[picks]).max())
    sources = docs.sources

    @jax.jit
    def prefill(weights, inputs, tokens, positions):
        inputs = from_target(weights, config, inputs)
        cache = KVCache.init(config.layer, inputs.shape[0], width + depth, jnp.float32)
        pred, cache = draft_features(weights, config, embed, inputs, tokens, positions, cache)
        return pred, weights["ids"][jnp.argmax(draft_logits(weights, config, pred), -1)], cache

    @jax.jit
    def chain(weights, cache, feature, token, start):         # [R, D], [R], [R]: slot start
        drafted = [token]
        for j in range(1, depth):
            feature, cache = draft_features(weights, config, embed, feature[:, None],
                                            token[:, None], (start + j)[:, None], cache)
            feature = feature[:, 0]
            token = weights["ids"][jnp.argmax(draft_logits(weights, config, feature), -1)]
            drafted.append(token)
        return jnp.stack(drafted, axis=1)                      # [R, depth]

    hits, counts = np.zeros(depth), np.zeros(depth)
    for g in range(0, len(picks), group):
        members = picks[g:g + group]
        tokens = np.zeros((group, width), np.int32)
        inputs = np.zeros((group, width, sources.shape[1]), np.float32)
        for r, i in enumerate(members):
            n = docs.end[i] - docs.begin[i]
            tokens[r, :n] = docs.tokens[docs.begin[i]:docs.end[i]]
            inputs[r, 1:n] = sources[docs.begin[i]:docs.end[i] - 1]
        positions = np.broadcast_to(np.arange(width, dtype=np.int32), tokens.shape)
        pred, first, cache = prefill(weights, inputs, tokens, positions)
        where = [(r, s) for r, i in enumerate(members)
                 for s in range(docs.prompt[i], docs.end[i] - docs.begin[i] - 1)]
        for c in range(0, len(where), rows):
            chunk = np.array(where[c:c + rows] + [where[0]] * (rows - len(where[c:c + rows])))
            real = min(rows, len(where) - c)
            r, s = jnp.asarray(chunk[:, 0]), jnp.asarray(chunk[:, 1])
            sub = KVCache(tuple(k[r] for k in cache.k), tuple(v[r] for v in cache.v), s + 1)
            drafted = np.asarray(chain(weights, sub, pred[r, s], first[r, s], s))[:real]
            doc = members[chunk[:real, 0]]
            ahead = chunk[:real, 1, None] + 1 + np.arange(depth)             # [R, depth]
            exists = ahead < (docs.end[doc] - docs.begin[doc])[:, None]
            truth = docs.tokens[np.minimum(docs.begin[doc][:, None] + ahead, len(docs.tokens) - 1)]
            prefix = np.cumprod(drafted == truth, axis=1).astype(bool)
            hits += np.sum(prefix & exists, axis=0)
            counts += np.sum(exists, axis=0)
    accuracy = hits / counts
    return {"positions": int(counts[0]), "documents": len(picks),
            "accuracy": [round(float(a), 4) for a in accuracy],
            "expected_tokens_per_call": [round(1 + float(accuracy[:k].sum()), 3)
                                         for k in range(1, depth + 1)]}


# -- Training ---------------------------------------------------------------------------------

def train_drafter(args) -> tuple[object, dict]:
    """Trains one drafter as `args` says and evaluates it (float16-rounded, as shipped) on the
    held-out documents; returns the drafter and its record."""
    import jax
    import jax.numpy as jnp
    import optax

    import specjax
    from specjax.heads.eagle import Drafter, init_drafter, runtime_weights
    from specjax.sampling.tree import Tree

    started = time.time()
    target = specjax.load(resolve(args.target))
    data = [Path(d) for d in args.data]
    fused = tuple(args.fused_layers)
    if fused:
        raise SystemExit("--fused-layers trained specjax's earlier EAGLE-3 variant, retired for "
                         "the published EAGLE-3 (specjax.heads.eagle, kind 'eagle3')")
    docs = load_documents(data, args.validation_every, fused)
    train_docs = docs.select(args.kinds, held_out=False)
    # Held-out chains are compared with the documents' tokens: greedy continuations only.
    eval_docs = docs.select(args.eval_kinds, held_out=True, settings=("greedy",))
    # The subset: the most frequent tokens the drafter is asked for in training (every token
    # after a training document's prompt), coverage measured on the held-out drafted tokens.
    labels = np.concatenate([docs.tokens[docs.begin[i] + docs.prompt[i]:docs.end[i]]
                             for i in train_docs])
    ids = frequent_tokens(labels, args.subset, target.config.vocab_size)
    start = specjax.load(Path(args.init)) if args.init else None
    if start is not None and start.token_ids.size == ids.size:
        # A later stage keeps the first stage's subset (its projection rows are what it learnt
        # to address), even on more data, whose most frequent tokens differ a little.
        ids = np.asarray(start.token_ids)
    asked = np.concatenate([docs.tokens[docs.begin[i] + docs.prompt[i] + 1:docs.end[i]]
                            for i in eval_docs])
    coverage = float(np.mean(np.isin(asked, ids)))
    mass = subset_mass(target, docs, docs.select(args.eval_kinds, held_out=True), ids)
    train_rows = np.concatenate([np.arange(docs.begin[i], docs.end[i]) for i in train_docs])
    rms = float(np.sqrt(np.mean(np.square(docs.hidden[train_rows[::7]].astype(np.float64)))))
    wins = windows(docs, train_docs, args.window)
    batches = Batches(docs, wins, args.slots, args.quantum, args.seed)
    print(f"{len(train_docs)} training documents ({train_rows.size:,} slots, {len(wins)} "
          f"windows, {batches.per_epoch} batches an epoch), {len(eval_docs)} held out; subset "
          f"{ids.size} covers {coverage:.1%} of the held-out drafted tokens and "
          f"{', '.join(f'{m:.1%} at T = {t}' for t, m in mass.items())} of the target's "
          f"probability mass; feature RMS {rms:.3f}", flush=True)

    drafter = init_drafter(target, token_ids=ids, seed=args.seed, tree=Tree.chain(args.chain),
                           style="specjax")
    weights = runtime_weights(drafter, target)
    frozen = {"proj": weights["proj"], "embed": target.params["embed"]}
    # The drafter's output norm starts as the target's final norm, which made the features it
    # predicts: their scale (SmolLM2's norm weights are 1.6 to 3.3) is then right from the
    # first step instead of hundreds of Adam steps away from the initial 1.
    trainable = {"fc": drafter.params["fc"], "layers": drafter.params["layers"],
                 "final_norm": target.params["final_norm"],
                 **({"reduce": drafter.params["reduce"]} if fused else {})}
    if start is not None:   # a second stage: go on from a trained drafter of the same shape
        if start.config != drafter.config or not np.array_equal(start.token_ids, ids):
            raise SystemExit(f"--init {args.init}: not a drafter of this shape and subset "
                             "(fused layers and subset size must match)")
        trainable = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32),
                                 {k: start.params[k] for k in trainable})
        print(f"starting from {args.init}", flush=True)
    loss_fn = make_loss(drafter.config, args.unroll, args.decay, args.ce_weight, args.noise)

    optimizer = make_optimizer(args)
    step = make_step(loss_fn, optimizer)
    opt_state = optimizer.init(trainable)
    checkpoint = Path(args.checkpoint) if args.checkpoint else None
    done = 0
    if checkpoint and checkpoint.exists():
        done, steps, trainable, opt_state = load_checkpoint(checkpoint, trainable, opt_state)
        print(f"resuming {checkpoint} at step {done} of {steps}", flush=True)
    elif args.steps:
        steps = args.steps
    elif args.minutes:
        steps = calibrate(step, trainable, opt_state, frozen, batches, args.minutes)
    else:
        raise SystemExit("give --steps or --minutes")
    warmup = min(args.warmup, steps // 10 + 1)
    schedule = optax.warmup_cosine_decay_schedule(0.0, args.lr, warmup, steps, args.lr * 0.1)

    key = jax.random.key(args.seed)
    log, t0, last_save = [], time.time(), time.time()
    stream = batches.stream(done)
    for i in range(done + 1, steps + 1):
        trainable, opt_state, loss, parts = step(trainable, opt_state, frozen, next(stream),
                                                 jax.random.fold_in(key, i),
                                                 float(schedule(i - 1)))
        if i % args.log_every == 0 or i == steps:
            parts = np.asarray(parts)
            log.append({"step": i, "loss": round(float(loss), 4),
                        "smooth_l1": [round(float(v), 4) for v in parts[:, 0]],
                        "cross_entropy": [round(float(v), 4) for v in parts[:, 1]],
                        "top1_agreement": [round(float(v), 4) for v in parts[:, 2]],
                        "seconds": round(time.time() - t0, 1)})
            print(json.dumps(log[-1]), flush=True)
        if checkpoint and time.time() - last_save > 60 * args.checkpoint_minutes and i < steps:
            save_checkpoint(checkpoint, i, steps, trainable, opt_state)
            last_save = time.time()
    train_s = time.time() - t0
    if checkpoint and checkpoint.exists():       # for an interrupted run only
        checkpoint.unlink()

    # Evaluate the weights as shipped: rounded to float16.
    params = jax.tree.map(lambda a: a.astype(jnp.float16).astype(jnp.float32), trainable)
    trained = Drafter(drafter.config, params, ids, drafter.target, drafter.tree)
    t1 = time.time()
    evaluation = chain_accuracy(trained, target, docs, eval_docs, args.depth)
    evaluation["seconds"] = round(time.time() - t1, 1)
    print(json.dumps(evaluation), flush=True)
    # Earlier drafters for the same target, on the same held-out documents (none of them saw
    # one: the held-out rule depends on the prompt alone).
    previous = {}
    for directory in args.compare or ():
        previous[str(directory)] = {"all": chain_accuracy(specjax.load(Path(directory)), target,
                                                          docs, eval_docs, args.depth)}
        log_file = Path(directory) / "train_log.json"
        if log_file.exists():          # what it was trained on, for the card
            earlier = json.loads(log_file.read_text())
            previous[str(directory)]["trained_on"] = {
                "generated_tokens": sum(m["generated_tokens"] for m in earlier.get("data", [])),
                "train_slots": earlier.get("train_slots"), "steps": earlier.get("steps")}
        print(json.dumps({str(directory): previous[str(directory)]}), flush=True)
    record = {
        "target": args.target, "unroll": args.unroll, "steps": steps,
        "slots_per_batch": args.slots, "window": args.window, "quantum": args.quantum,
        "batches_per_epoch": batches.per_epoch,
        "epochs": round(steps / batches.per_epoch, 2),
        "train_documents": len(train_docs), "train_slots": int(train_rows.size),
        "train_windows": len(wins), "kinds": list(args.kinds), "eval_kinds": list(args.eval_kinds),
        "validation_every": args.validation_every, "subset": int(ids.size),
        "label_coverage": round(coverage, 4),
        "subset_mass": {str(t): round(m, 4) for t, m in mass.items()},
        "fused_layers": list(fused), "feature_rms": round(rms, 4),
        "noise": args.noise, "ce_weight": args.ce_weight, "decay": args.decay, "lr": args.lr,
        "warmup": warmup, "weight_decay": args.weight_decay, "clip": args.clip,
        "seed": args.seed, "train_s": round(train_s, 1), "resumed_at": done or None,
        "init": str(args.init) if args.init else None,
        "final_train": log[-1] if log else None, "held_out": evaluation, "log": log,
        **({"against_previous": previous} if previous else {}),
        "seconds": round(time.time() - started, 1)}
    return trained, record


def regenerate_command(args, steps: int) -> str:
    """The command with every training option named and the step count fixed, so that a rerun
    does not depend on the machine's speed (`--minutes` picks the steps from a timing run)."""
    words = ["python", "scripts/train.py", "eagle", "--data", *map(str, args.data),
             "--target", args.target]
    for name in ("subset", "window", "slots", "quantum", "lr", "warmup", "weight_decay", "clip",
                 "noise", "ce_weight", "decay", "unroll", "chain", "depth", "validation_every",
                 "seed"):
        words += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    if args.fused_layers:
        words += ["--fused-layers", *map(str, args.fused_layers)]
    if args.init:
        words += ["--init", str(args.init)]
    words += ["--kinds", *args.kinds, "--eval-kinds", *args.eval_kinds]
    words += ["--steps", str(steps)]
    if args.unroll_comparison:
        words += ["--unroll-comparison", str(args.unroll_comparison)]
    return shlex.join(words + ["--out", str(args.out)])


def train_and_ship(args) -> None:
    """`eagle`: train, evaluate, and write the drafter directory with its record and card."""
    from specjax.io.eagle import save_drafter
    from specjax.io.sidecar import tree_to_json

    trained, record = train_drafter(args)
    out = Path(args.out)
    record.update(
        tree=tree_to_json(trained.tree),
        data=[json.loads((Path(d) / "meta.json").read_text()) for d in args.data],
        machine=machine(), command=regenerate_command(args, record["steps"]))
    if args.unroll_comparison:
        record["unroll_comparison"] = json.loads(Path(args.unroll_comparison).read_text())
    save_drafter(trained, out, storage="float16", extra={"training": {
        "loss": f"SmoothL1 + {args.ce_weight:g} x soft cross-entropy",
        "unroll": args.unroll, "decay": args.decay, "noise": args.noise}})
    (out / "train_log.json").write_text(json.dumps(record, indent=1) + "\n")
    write_card(out)
    print(f"wrote {out}: held-out chain accuracy {record['held_out']['accuracy']}")


def compare_unroll(args) -> None:
    """`eagle-unroll`: the same training for each --unrolls value, each given --minutes of
    training (unrolling costs steps, so the comparison is at equal wall time), evaluated on the
    held-out chains; written to --out for `eagle --unroll-comparison`."""
    if not args.minutes:
        raise SystemExit("eagle-unroll compares at equal wall time: give --minutes")
    runs = []
    for unroll in args.unrolls:
        print(f"-- unroll {unroll}", flush=True)
        run = argparse.Namespace(**{**vars(args), "unroll": unroll, "steps": 0,
                                    "checkpoint": None})
        _, record = train_drafter(run)
        runs.append({k: record[k] for k in ("unroll", "steps", "train_s", "epochs")}
                    | {"accuracy": record["held_out"]["accuracy"],
                       "expected_tokens_per_call": record["held_out"]["expected_tokens_per_call"],
                       "final_train": record["final_train"]})
    result = {"minutes": args.minutes, "runs": runs, "machine": machine(),
              "command": shlex.join(["python", "scripts/train.py", *args.argv])}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


TREE_SETTINGS = {"greedy": dict(temperature=0.0), "t0.7-p0.9": dict(temperature=0.7, top_p=0.9),
                 "t1": dict(temperature=1.0)}


def choose_tree(args) -> None:
    """`eagle-tree`: measure the tokens per target call of candidate trees (chains, and
    EAGLE-2's dynamic trees, whose shape the drafter's confidence picks every step) on held-out
    prompts in each sampling setting of --settings, and ship the tree with the most tokens per
    unit of step cost in the first setting (greedy by default): the verify call's cost
    (`verify_cost`) plus the drafter's calls (one per depth, --drafter-cost each, both in
    one-token steps, from `scripts/bench_forward.py --sizes --eagle` on the host). The best tree
    of every other setting is recorded beside it, with every row's acceptance by depth.

    The prompts are the held-out chat questions of `_corpus.EVAL_QUESTIONS` (no training
    template makes them), not the bench suite's: the tests and the bench measure the drafter
    there, and a tree tuned on them would not be an independent check. A sampled setting runs
    each prompt with --seeds seeds, its tokens per call being random. The chain model of
    `chain_accuracy` cannot price branching trees, hence a measurement; the drafter's weights
    are rewritten unchanged (float16 loads and saves exactly)."""
    import specjax
    from specjax.api.generate import generate
    from specjax.api.results import acceptance_by_position
    from specjax.io import chat
    from specjax.io.eagle import save_drafter
    from specjax.io.sidecar import tree_from_json, tree_to_json
    from specjax.sampling.tree import DynamicTree, Tree

    out = Path(args.drafter_dir)
    record = json.loads((out / "train_log.json").read_text())
    config = json.loads((out / "config.json").read_text())
    target = specjax.load(resolve(record["target"]))
    drafter = specjax.load(out)
    prompts = [chat.encode(target, chat.render(target, q)) for q in _corpus.EVAL_QUESTIONS]
    candidates = [Tree.chain(k) for k in args.chains] + [DynamicTree(*d) for d in args.dynamic]
    settings = {}
    for name in args.settings:
        sampling = TREE_SETTINGS[name]
        seeds = range(args.seeds) if sampling["temperature"] > 0 else range(1)
        rows = []
        for tree in candidates:
            new = calls = 0
            histogram = np.zeros(tree.max_depth + 1, np.int64)
            for seed in seeds:
                stats = generate(target, prompts, method="eagle", drafter=drafter, tree=tree,
                                 max_new_tokens=args.new_tokens, seed=seed, **sampling).stats
                new, calls = new + stats.new_tokens, calls + stats.target_calls
                histogram += np.asarray(stats.accepted_histogram)
            tpc = new / calls
            verify = verify_cost(tree.size, args.verify_cost)
            cost = verify + tree.max_depth * args.drafter_cost
            by_depth = acceptance_by_position(histogram.tolist())
            rows.append({"tree": tree_to_json(tree), "nodes": tree.size,
                         "tokens_per_target_call": round(tpc, 3),
                         "acceptance_by_depth": [None if a is None else round(a, 3)
                                                 for a in by_depth],
                         "verify_cost": round(verify, 3), "step_cost": round(cost, 3),
                         "tokens_per_cost": round(tpc / cost, 3)})
            print(json.dumps({"setting": name, **rows[-1]}), flush=True)
        settings[name] = {"sampling": sampling, "seeds": len(seeds), "rows": rows,
                          "best": max(rows, key=lambda r: r["tokens_per_cost"])["tree"]}
    pick = settings[args.settings[0]]["best"]
    sampled = sampled_pick(settings, pick)
    save_drafter(dataclasses.replace(drafter, tree=tree_from_json(pick),
                                     sampled_tree=tree_from_json(sampled)), out,
                 storage=config["storage"], extra={"training": config["training"]})
    first = settings[args.settings[0]]
    record.update(tree=pick, sampled_tree=sampled, tree_choice={
        "prompts": len(prompts), "new_tokens": args.new_tokens,
        "drafter_cost": args.drafter_cost, "rows": first["rows"], "setting": args.settings[0],
        "settings": settings,
        "verify_cost": {str(n): c for n, c in sorted(args.verify_cost.items())},
        "command": shlex.join(["python", "scripts/train.py", *args.argv])})
    (out / "train_log.json").write_text(json.dumps(record, indent=1) + "\n")
    write_card(out)
    print(f"shipped tree: {pick}; best per setting: "
          f"{ {name: v['best'] for name, v in settings.items()} }")


def sampled_pick(settings: dict, greedy_pick):
    """The tree a drafter ships for sampled calls: the best by tokens per cost averaged over the
    measured sampled settings (temperature > 0), or None when there are none or it is the greedy
    pick (one default then serves both)."""
    sampled = [v for v in settings.values() if v["sampling"]["temperature"] > 0]
    if not sampled:
        return None
    score = {}
    for v in sampled:
        for r in v["rows"]:
            key = json.dumps(r["tree"])
            score[key] = score.get(key, 0.0) + r["tokens_per_cost"] / len(sampled)
    best = json.loads(max(score, key=score.get))
    return None if best == greedy_pick else best


# -- The model card (cards/eagle.md) ------------------------------------------------------------

def describe_tree(tree) -> str:
    """A tree as train_log.json records it (paths, or {"dynamic": [...]}) in words."""
    if isinstance(tree, dict):
        depth, top_k, total = tree["dynamic"]
        return (f"EAGLE-2's dynamic tree: {depth} levels of the drafter's top {top_k}, the "
                f"{total} most probable nodes verified")
    paths = " ".join("(" + ",".join(map(str, p)) + ")" for p in tree)
    return f"{len(tree)} nodes, {max(len(p) for p in tree)} deep: {paths}"

DRAFTERS = ("llama-eagle", "smollm2-eagle")


def index_section() -> str:
    """weights/README.md's section on the shipped EAGLE drafters (empty when there are none)."""
    rows = []
    for name in DRAFTERS:
        d = _corpus.REPO / "weights" / name
        if not (d / "train_log.json").exists():
            continue
        r = json.loads((d / "train_log.json").read_text())
        held_out = r["held_out"]
        choice = r.get("tree_choice")
        if choice:
            row = next(x for x in choice["rows"] if x["tree"] == r["tree"])
            per_call = f"{row['tokens_per_target_call']:.2f} (measured)"
        else:
            depth = max(len(p) for p in r["tree"])
            per_call = f"{held_out['expected_tokens_per_call'][depth - 1]:.2f} (expected)"
        size = (d / "model.safetensors").stat().st_size / 2 ** 20
        rows.append(f"| [`{name}`]({name}/) | {r['target']} | {r['subset']:,} | "
                    f"{', '.join(f'{a:.2f}' for a in held_out['accuracy'][:4])} | "
                    f"{describe_tree(r['tree'])} | {per_call} | {size:.1f} MB |")
    return "\n" + render("index-eagle.md", rows="\n".join(rows)) if rows else ""


def write_index(args) -> None:
    """`index`: weights/README.md, the checkpoints' and heads' sections and the drafters'."""
    write_checkpoints_index(args)
    index = _corpus.REPO / "weights" / "README.md"
    index.write_text(index.read_text() + index_section())


USAGE = {
    "smollm2": 'python -m specjax generate --preset smollm2 --method eagle --chat --prompt "How do bees make honey?"',
    "weights/llama-target": 'python -m specjax generate --preset tiny-llama --method eagle --prompt "def fibonacci(n):"',
}
MEDUSA = {"smollm2": "smollm2-medusa", "weights/llama-target": "llama-medusa"}


def parameter_count(directory: Path) -> int:
    """The learned parameters in a drafter directory (the subset's ids are not parameters)."""
    from safetensors import safe_open

    with safe_open(str(directory / "model.safetensors"), "np") as f:
        names = [k for k in f.keys() if k != "token_ids"]  # noqa: SIM118 (not a dict)
        return int(sum(np.prod(f.get_slice(k).get_shape()) for k in names))


def write_card(directory: Path) -> None:
    """The card of an EAGLE directory, from its config.json and train_log.json."""
    import specjax
    from specjax.io.fetch import CHECKPOINTS, fetch

    record = json.loads((directory / "train_log.json").read_text())
    config = json.loads((directory / "config.json").read_text())
    target_dir = (fetch(record["target"]) if record["target"] in CHECKPOINTS
                  else _corpus.REPO / record["target"])
    target_config = specjax.ModelConfig.from_file(target_dir / "config.json")
    layer = specjax.ModelConfig.from_hf(config["layer"])
    d, s = config["hidden_size"], config["projection"]["tokens"]
    target_macs = flops_per_token(target_config) // 2
    layer_macs = flops_per_token(layer) // 2 - layer.vocab_size * d     # one layer, no head
    node_macs = 2 * d * d + layer_macs + s * d
    evaluation = record["held_out"]
    accuracy, expected = evaluation["accuracy"], evaluation["expected_tokens_per_call"]
    medusa_dir = _corpus.REPO / "weights" / MEDUSA.get(record["target"], "")
    medusa = (json.loads((medusa_dir / "train_log.json").read_text())
              if (medusa_dir / "train_log.json").exists() else None)
    rows = []
    for k, (a, e) in enumerate(zip(accuracy, expected), start=1):
        m = (f"{medusa['top1'][k - 1]:.3f}" if medusa and k <= len(medusa["top1"]) else "")
        rows.append(f"| {k} | {a:.3f} | {e:.2f} | {m} |")
    medusa_text = (
        f"The Medusa heads for the same target ([`{medusa_dir.name}`](../{medusa_dir.name}/)) "
        f"predict from the last feature alone, head k the token k + 1 places ahead; their "
        f"column is each head's top-1 accuracy on its own held-out examples (from the same "
        f"prompt pool, the head's token alone, not a chain prefix, so an upper bound on what a "
        f"chain of Medusa heads gets accepted)." if medusa else "")
    comparison = record.get("unroll_comparison")
    if comparison:
        lines = "\n".join(
            f"| {r['unroll']} | {r['steps']} | {r['train_s'] / 60:.1f} | "
            f"{', '.join(f'{a:.3f}' for a in r['accuracy'])} | "
            f"{r['expected_tokens_per_call'][min(3, len(r['expected_tokens_per_call']) - 1)]:.2f} |"
            for r in comparison["runs"])
        unroll_text = (
            f"**Unrolling** (`--unroll K`, training-time test, the idea of EAGLE-3): after the "
            f"first pass, K - 1 more passes feed the drafter's own predicted features back "
            f"(slot s + 1 reads f'_s), weighted {record['decay']:g}^i. Measured at equal wall "
            f"time (`eagle-unroll`, {comparison['minutes']:g} minutes of training each, the "
            f"same held-out chains):\n\n"
            f"| unroll | steps | minutes | chain accuracy, depth 1..{len(accuracy)} | "
            f"expected tokens per call, chain of 4 |\n|--:|--:|--:|---|--:|\n{lines}\n\n"
            f"The shipped drafter was trained with unroll {record['unroll']}.")
    else:
        unroll_text = f"Trained with unroll {record['unroll']} (no comparison recorded)."
    sets = record["data"]
    documents = sum(m["documents"] for m in sets)
    kinds = {}
    for m in sets:
        for kind, n in m["kinds"].items():
            kinds[kind] = kinds.get(kind, 0) + n
    sequences = [m["sequences"] for m in sets if m.get("sequences")]
    provenance = [json.loads(Path(_corpus.REPO / p).with_suffix(".json").read_text())
                  for p in sequences]
    commands = ["python -m specjax fetch smollm2"] if record["target"] == "smollm2" else []
    commands += list(dict.fromkeys(p["generated_by"] for p in provenance))
    commands += [f"python scripts/train.py eagle-sequences --data {p['data']} --out {seq}"
                 for p, seq in zip(provenance, sequences) if "data" in p]   # eagle-data: none
    commands += [m["command"] for m in sets]
    if comparison:
        commands.append(comparison["command"])
    if record.get("stage_one"):
        commands.append(record["stage_one"]["command"])
    commands.append(record["command"])
    choice = record.get("tree_choice")
    if choice:
        commands.append(choice["command"])
        lines = "\n".join(f"| {describe_tree(r['tree'])} | {r['tokens_per_target_call']:.2f} | "
                          f"{r['verify_cost']:.2f} | {r['step_cost']:.2f} | "
                          f"{r['tokens_per_cost']:.2f} |" for r in choice["rows"])
        tree_text = (
            f"**Tree.** The chain model above cannot price a branching tree, so candidate trees "
            f"were run greedily on {choice['prompts']} held-out chat questions (`EVAL_QUESTIONS` "
            f"in scripts/_corpus.py, which no training template makes; not the bench suite's "
            f"prompts, on which the tests and the bench measure the drafter; "
            f"{choice['new_tokens']} new tokens each; `eagle-tree`), and the shipped default is "
            f"the one with the most tokens per unit of step cost: the verify call (a call of n "
            f"tokens over a one-token step, `--verify-cost`, from `scripts/bench_forward.py "
            f"--sizes`: {', '.join(f'{n}: {c:g}' for n, c in choice['verify_cost'].items())}) plus "
            f"{choice['drafter_cost']:g} per drafter call, one per depth (`bench_forward.py "
            f"--eagle`: 0.044 for one pair, 0.088 for four):\n\n"
            f"| tree | tokens per target call | verify cost | step cost | tokens per cost |\n"
            f"|---|--:|--:|--:|--:|\n{lines}")
        sampled = {name: v for name, v in choice.get("settings", {}).items()
                   if name != choice.get("setting")}
        if sampled:
            shipped = json.dumps(record["tree"])
            def cell(v, tree):
                r = next(r for r in v["rows"] if json.dumps(r["tree"]) == tree)
                by_depth = ", ".join(f"{a:.2f}" for a in r["acceptance_by_depth"] if a is not None)
                return f"{r['tokens_per_target_call']:.2f} ({by_depth})"

            lines = "\n".join(
                f"| `{name}` ({v['seeds']} seeds) | {cell(v, shipped)} | "
                f"{describe_tree(v['best'])} | {cell(v, json.dumps(v['best']))} |"
                for name, v in sampled.items())
            tree_text += (
                "\n\nSampling, the same trees on the same questions (`eagle-tree --settings`): "
                "tokens per target call (acceptance by depth) of the greedy default, and each "
                "setting's best tree by tokens per cost with its own:\n\n| setting | greedy "
                "default | best tree | best tree's tokens per call |\n|---|---|---|---|\n"
                + lines)
            if record.get("sampled_tree"):
                tree_text += (
                    f"\n\n**Default when sampling:** {describe_tree(record['sampled_tree'])} "
                    f"(`sampled_tree` in config.json), the best by tokens per cost averaged over "
                    f"the sampled settings; `generate` uses it when any row of a call samples "
                    f"and no tree is given, the greedy default above otherwise.")
    else:
        depth = max(len(p) for p in record["tree"])
        tree_text = (f"With the default chain of {depth}: "
                     f"**{expected[min(depth, len(expected)) - 1]:.2f}** expected tokens per "
                     f"target call (a model of the walk on held-out documents; the bench "
                     f"measures it).")
    if any("settings" in p for p in provenance):        # `eagle-data` shards
        shards = sorted(s for m in sets for s in m.get("shards", []))
        settings = provenance[0]["settings"]
        data_text = (
            f"SmolLM2's own continuations of {documents // len(settings):,} prompts ({', '.join(f'{n // len(settings)} {k}' for k, n in kinds.items())}), "
            f"each continued {len(settings)} times: {', '.join(f'`{x}`' for x in settings)} "
            f"(`eagle-data`, shards {', '.join(f'{x:03d}' for x in shards)} of "
            f"{', '.join(dict.fromkeys(f'`{q}`' for q in sequences))}; data/eagle2/README.md has "
            f"the prompt set and its provenance): {documents:,} documents, "
            f"{sum(m['generated_tokens'] for m in sets):,} generated tokens, and the target's "
            f"final-normed features at every one of the {sum(m['tokens'] for m in sets):,} "
            f"positions (float16), so that training never runs the target; `eagle-features` "
            f"rebuilds them with one teacher-forced pass ({sum(m['hidden_s'] for m in sets) / 60:.1f} "
            f"minutes here). A prompt is held out, in all {len(settings)} settings, by the md5 rule "
            f"of data/eagle2/README.md; training uses the other {record['train_documents']:,} "
            f"documents ({record['train_slots']:,} slots), and the held-out chains below run on "
            f"the held-out greedy documents.")
    else:
        data_text = (
            f"The target's greedy continuations of {documents:,} prompts ({', '.join(f'{n} {k}' for k, n in kinds.items())}; `medusa-data`),\n"
            f"{sum(m['generated_tokens'] for m in sets):,} generated tokens, and its final-normed features at every one of the\n"
            f"{sum(m['tokens'] for m in sets):,} positions (float16), so that training never runs the target. The token\n"
            f"sequences are in the repository, {', '.join(f'`{p}`' for p in sequences) or '(none)'}, with their provenance beside them (the\n"
            f"generating command, the tokenizer's digest, the counts); `eagle-features` rebuilds the\n"
            f"features from them with one teacher-forced pass of the target ({sum(m['hidden_s'] for m in sets) / 60:.1f} minutes here).\n"
            f"One document in {record['validation_every']} is held out (the Medusa stage's rule, so the Medusa heads'\n"
            f"held-out documents from the same set are these); training uses the other {record['train_documents']}\n"
            f"documents of the kinds {', '.join(record['kinds'])} ({record['train_slots']:,} slots; \"text-original\" is the original\n"
            f"standard-library text of a text window, read by the target, its twin's split).")
    stage = record.get("stage_one")
    stage_text = (f" A second stage: it went on from a first run of the same command with "
                  f"learning rate {stage['lr']:g} and {stage['warmup']} warm-up steps, "
                  f"{stage['steps']} steps in {stage['train_s'] / 60:.1f} minutes (held-out "
                  f"chains then {', '.join(f'{a:.3f}' for a in stage['accuracy'])}), "
                  f"`--init`; the first command below is that run's." if stage else "")
    init = record.get("init")
    if init and not stage:
        earlier = (record.get("against_previous") or {}).get(init, {}).get("trained_on")
        stage_text = (f" It went on (`--init`) from the drafter that was in `{init}` before "
                      "it" + (f" (its last stage {earlier['steps']} steps, on "
                              f"{earlier['generated_tokens']:,} generated tokens, compared below)"
                              if earlier else "")
                      + ", keeping its subset; its card, in the repository's history, has "
                        "the commands that made it.")
    train_minutes = (record["train_s"] + (stage["train_s"] if stage else 0)) / 60
    comparison_text = ""
    fused_runs = record.get("fused_comparison")
    if fused_runs:
        def chains(run):
            return ", ".join(f"{a:.3f}" for a in run["held_out"]["accuracy"])
        last, fused = fused_runs["last"], fused_runs["fused"]
        comparison_text += (
            f"\n**EAGLE-3's fused features, measured.** The first stage was run twice at equal wall "
            f"time: on the final feature ({last['steps']} steps, held-out chain accuracy "
            f"{chains(last)}) and on the states after layers "
            f"{', '.join(map(str, fused['fused_layers']))} reduced by one projection "
            f"(`--fused-layers`; {fused['steps']} steps: {chains(fused)}). The fused drafter's "
            f"chain collapses after its first token: trained with unroll 1 it never reads its own "
            f"predicted features, which live in the final feature's space, not the reduced taps' "
            f"(EAGLE-3 trains with its training-time test for this reason). The final feature "
            f"went on to the second stage.\n")
    for earlier, old in (record.get("against_previous") or {}).items():
        a = old["all"]
        trained_on = old.get("trained_on")
        if trained_on:
            what = (f"the drafter that was in `{earlier}` before this one, trained on "
                    f"{trained_on['generated_tokens']:,} generated tokens")
        else:
            what = "the previous drafter, trained on `data/eagle/`'s 115k greedy tokens"
        comparison_text += (
            f"\n**Against {what}**, on the same {a['documents']} held-out documents: chain "
            f"accuracy {', '.join(f'{x:.3f}' for x in a['accuracy'])}, expected tokens per call "
            f"with a chain of 4 {a['expected_tokens_per_call'][3]:.2f}, against this drafter's "
            f"{expected[3]:.2f} (the table below)")
        if "not_in_data_eagle" in old:
            o = old["not_in_data_eagle"]
            comparison_text += (f"; {o['expected_tokens_per_call'][3]:.2f} on the "
                                f"{o['documents']} whose prompt it did not train on")
        comparison_text += ".\n"
    final = record["final_train"]
    nl = "\n"
    text = render(
        "eagle.md", name=directory.name, reproduction=REPRODUCTIONS.get(directory.name, ""),
        target_name={"smollm2": "SmolLM2-135M-Instruct"}.get(record["target"],
                                                             f"`{record['target']}`"),
        usage=USAGE.get(record["target"], f"python -m specjax generate --target "
                        f"{record['target']} --method eagle --drafter weights/{directory.name}"),
        train_minutes=f"{train_minutes:.1f}",
        trained_in=(f"trained here, its last stage in {train_minutes:.1f}" if init and not stage
                    else f"trained here in {train_minutes:.1f}"),
        hidden_size=d,
        layer=(f"{layer.n_heads} query heads, {layer.n_kv_heads} key/value heads of "
               f"{layer.head_dim}, SwiGLU MLP {layer.d_ff} wide, RoPE theta "
               f"{layer.rope_theta:g}"),
        subset=f"{s:,}", label_coverage=f"{record['label_coverage']:.1%}",
        vocab_size=f"{layer.vocab_size:,}",
        parameters=f"{parameter_count(directory):,}",
        node_macs=f"{node_macs:,}", target_macs=f"{target_macs:,}",
        node_ratio=f"{node_macs / target_macs:.3f}",
        tree=describe_tree(record["tree"]) + (
            f"; when sampling, {describe_tree(record['sampled_tree'])}"
            if record.get("sampled_tree") else ""), tree_text=tree_text,
        model_mb=f"{(directory / 'model.safetensors').stat().st_size / 2 ** 20:.1f}",
        documents=f"{documents:,}",
        kinds=", ".join(f"{n} {k}" for k, n in kinds.items()),
        generated_tokens=f"{sum(m['generated_tokens'] for m in sets):,}",
        cached_tokens=f"{sum(m['tokens'] for m in sets):,}",
        sequences=", ".join(f"`{p}`" for p in sequences) or "(none)",
        data_minutes=f"{sum(m['hidden_s'] for m in sets) / 60:.1f}",
        validation_every=record["validation_every"], train_documents=record["train_documents"],
        train_slots=f"{record['train_slots']:,}", train_kinds=", ".join(record["kinds"]),
        window=record["window"], noise=record["noise"], feature_rms=record["feature_rms"],
        ce_weight=f"{record['ce_weight']:g}", unroll_text=unroll_text, lr=record["lr"],
        warmup=record["warmup"], weight_decay=record["weight_decay"], clip=record["clip"],
        slots=f"{record['slots_per_batch']:,}", steps=record["steps"],
        epochs=record["epochs"], cpu_count=record["machine"]["cpu_count"],
        cpu=record["machine"].get("cpu", "AMD EPYC (AVX2)"),
        jax=record["machine"]["jax"],
        final_loss=(f"SmoothL1 {final['smooth_l1'][0]:.3f}, cross-entropy "
                    f"{final['cross_entropy'][0]:.3f}, top-1 agreement with the target "
                    f"{final['top1_agreement'][0]:.3f} (first pass, last logged batch)"),
        data_text=data_text, stage_text=stage_text, comparison_text=comparison_text,
        eval_documents=evaluation["documents"], eval_positions=f"{evaluation['positions']:,}",
        accuracy_rows=nl.join(rows), medusa_text=medusa_text,
        commands=nl.join(commands))
    (directory / "README.md").write_text(text)


def add_commands(sub) -> None:
    p = sub.add_parser("eagle-sequences", help="a `medusa-data` set's token sequences, compact, "
                                               "for the repository")
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True, help="an .npz; its provenance goes to .json")
    p.set_defaults(func=sequences)

    p = sub.add_parser("eagle-features", help="the cached features of `eagle-sequences` output: "
                                              "one teacher-forced pass of the target")
    p.add_argument("--sequences", type=Path, required=True)
    p.add_argument("--target", required=True, help="a checkpoint directory or fetch name")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--shards", type=int, nargs="+",
                   help="of a shard directory, only these (default: all)")
    p.add_argument("--layers", type=int, nargs="*", default=[],
                   help="also cache the residual stream after these many decoder layers "
                        "(EAGLE-3's low, middle and high features, e.g. 3 15 28)")
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=features)

    common = argparse.ArgumentParser(add_help=False)    # training options, both commands
    common.add_argument("--data", type=Path, nargs="+", required=True,
                        help="`medusa-data` or `eagle-features` sets")
    common.add_argument("--target", required=True)
    common.add_argument("--subset", type=int, default=8192,
                        help="the frequency-ranked vocabulary subset the drafter projects onto")
    common.add_argument("--kinds", nargs="+", default=[*GENERATED, "text-original"])
    common.add_argument("--eval-kinds", nargs="+", default=list(GENERATED))
    common.add_argument("--window", type=int, default=256, help="slots per example, at most")
    common.add_argument("--slots", type=int, default=4096, help="slots per batch, about")
    common.add_argument("--quantum", type=int, default=64, help="batch widths are multiples")
    common.add_argument("--steps", type=int, default=0, help="default: as many as fit --minutes")
    common.add_argument("--minutes", type=float, default=0.0, help="training time to fit")
    common.add_argument("--lr", type=float, default=1e-3)
    common.add_argument("--warmup", type=int, default=50)
    common.add_argument("--weight-decay", type=float, default=0.0)
    common.add_argument("--clip", type=float, default=1.0)
    common.add_argument("--noise", type=float, default=0.1,
                        help="half-width of the uniform noise on input features")
    common.add_argument("--ce-weight", type=float, default=0.1)
    common.add_argument("--decay", type=float, default=0.8, help="pass i weighs decay ** i")
    common.add_argument("--chain", type=int, default=4, help="the default tree: a chain")
    common.add_argument("--depth", type=int, default=5, help="held-out chains this deep")
    common.add_argument("--validation-every", type=int, default=16)
    common.add_argument("--fused-layers", type=int, nargs="*", default=[],
                        help="EAGLE-3: read the target's states after these many layers "
                             "(the sets' eagle-features --layers) instead of its final feature")
    common.add_argument("--seed", type=int, default=0)
    common.add_argument("--log-every", type=int, default=50)
    common.add_argument("--checkpoint", type=Path,
                        help="an .npz saved every --checkpoint-minutes, resumed from if "
                             "present, removed when training ends")
    common.add_argument("--checkpoint-minutes", type=float, default=3.0)
    common.add_argument("--compare", type=Path, nargs="*", default=[],
                        help="trained drafters of the same target to measure on the same "
                             "held-out documents (recorded as against_previous)")
    common.add_argument("--init", type=Path,
                        help="a trained drafter directory of the same shape and subset size to go "
                             "on from (a second stage, with its own learning-rate schedule; it "
                             "keeps that drafter's subset of token ids)")

    p = sub.add_parser("eagle", parents=[common], help="train an EAGLE drafter on cached features")
    p.add_argument("--unroll", type=int, default=1, help="training passes, the later ones on "
                                                         "the drafter's own features")
    p.add_argument("--unroll-comparison", type=Path, help="an `eagle-unroll` result to record")
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=train_and_ship)

    p = sub.add_parser("eagle-unroll", parents=[common],
                       help="train with each --unrolls for --minutes, compare held-out chains")
    p.add_argument("--unrolls", type=int, nargs="+", default=[1, 2])
    p.add_argument("--out", type=Path, required=True, help="a .json for `eagle --unroll-comparison`")
    p.set_defaults(func=compare_unroll)

    p = sub.add_parser("eagle-tree", help="measure candidate trees on held-out prompts and ship "
                                          "the one the rule picks as the drafter's default")
    p.add_argument("--drafter-dir", type=Path, required=True)
    p.add_argument("--chains", type=int, nargs="+", default=[2, 4])
    p.add_argument("--dynamic", nargs="*", default=[(4, 2, 8), (5, 4, 16), (6, 8, 32)],
                   type=lambda text: tuple(int(v) for v in text.split(",")),
                   help="dynamic trees as depth,top_k,total_tokens")
    p.add_argument("--drafter-cost", type=float, default=0.07,
                   help="one drafter call, in one-token steps of the target")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--verify-cost", type=parse_cost, default=SMOLLM2_VERIFY_COST)
    p.add_argument("--settings", nargs="+", choices=list(TREE_SETTINGS), default=["greedy"],
                   help="sampling settings to measure in; the first one's best tree ships")
    p.add_argument("--seeds", type=int, default=3, help="runs of every prompt when sampling")
    p.set_defaults(func=choose_tree)
