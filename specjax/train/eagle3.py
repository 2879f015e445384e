"""A published EAGLE-3 drafter (Li et al. 2025), or EAGLE-1/2 (2024), trained for a target: data,
features, training.

The three stages, each a function:

  continuations(target, prompts)   the target's own continuations of the prompts (`Sequences`):
                                   the drafter learns to predict the text it will verify;
  features(target, sequences)      one teacher-forced pass of the target over them (`Features`):
                                   the states after the tapped layers, which the drafter reads,
                                   and the final-normed states, whose next-token distributions
                                   are its soft labels;
  train(target, features, config)  the drafter (`specjax.heads.eagle.Drafter`, kind "eagle3",
                                   its own head over a draft vocabulary of the most frequent
                                   generated ids), resumable from a checkpoint directory.

The loss, EAGLE-1/2's and the training-time test are `specjax.train.eagle3_loss`'s; an
--init drafter is checked here (`check_init`).

Determinism: batch b of a run is drawn by `numpy.random.default_rng([seed, b])`, and XLA on a
CPU is deterministic, so a run resumed from its checkpoint gives the weights of one that never
stopped, bit for bit (tested).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specjax.api.checks import encode_prompts
from specjax.api.generate import generate
from specjax.api.methods import Eagle
from specjax.heads import eagle
from specjax.heads.shared import projection, target_identity
from specjax.io.sidecar import check_target
from specjax.model.transformer import Model, tapped_states
from specjax.sampling.params import SamplingParams
from specjax.sampling.tree import DynamicTree
from specjax.train import eagle3_loss, feature_files
from specjax.train.state import TrainError, check_settings, key_settings, on_mesh, run_steps

__all__ = ["Features", "Sequences", "TrainConfig", "TrainError", "best_dynamic_tree",
           "check_features", "continuations", "draft_vocabulary", "features", "resolve_taps",
           "step_seconds", "train"]


@dataclasses.dataclass(frozen=True)
class Sequences:
    """Token sequences, right-padded: prompt then the target's continuation."""
    tokens: np.ndarray          # [N, T] int32 (0 past each row's length)
    length: np.ndarray          # [N] int32
    prompt_length: np.ndarray   # [N] int32

    def label_mask(self) -> np.ndarray:
        """[N, T] bool: position s is trained when token s + 1 is a generated one."""
        s = np.arange(self.tokens.shape[1])[None]
        return (s + 1 >= self.prompt_length[:, None]) & (s + 1 < self.length[:, None])


@dataclasses.dataclass(frozen=True)
class Features:
    sequences: Sequences
    taps: tuple[int, ...]
    tapped: np.ndarray          # [N, T, len(taps) * D_t] the states after the tapped layers
    final: np.ndarray           # [N, T, D_t] the final-normed states


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000               # optimizer steps
    batch: int = 8                  # sequences a step
    learning_rate: float = 3e-4     # peak, after a linear warmup, then cosine to 10%
    warmup: int = 50
    unroll: int = 3                 # training-time-test passes
    decay: float = 0.8              # the weight of pass i is decay^i (SpecForge's 0.8)
    clip: float = 0.5               # global gradient norm (the EAGLE repo's)
    draft_vocab: int = 1024         # S, the most frequent generated ids (at most V; EAGLE-3)
    seed: int = 0
    checkpoint_every: int = 100
    kind: str = "eagle3"            # or "eagle1": an EAGLE-1/2 drafter (`train eagle`)
    # EAGLE-1/2 only, specjax's variants (`heads.eagle`): style "specjax" (its own norm, the
    # fusion reading [f ; E x]); subset N: logits over the N most frequent generated ids
    # through the target's LM-head rows for them (0: the target's whole head, as published).
    style: str = "published"
    subset: int = 0
    # Uniform noise of this half-width on pass 0's feature inputs (after the fusion), as
    # EAGLE-1 trains (U(-0.1, 0.1) in its paper) so that the drafter learns to go on from
    # features a little off, as its own are after a first step. 0: none (EAGLE-3, SpecForge).
    noise: float = 0.0
    # > 0: batches of sequences of like length, about `slots` positions a step, in place of
    # `batch` sequences (`state.batches`: less padding)
    slots: int = 0

    def __post_init__(self):
        check_settings(self, positive=("steps", "batch", "unroll", "draft_vocab",
                                       "checkpoint_every"),
                       non_negative=("warmup", "seed", "subset", "slots"),
                       fractions=("learning_rate", "decay"), at_most_inf=("clip",))
        if isinstance(self.noise, bool) or not isinstance(self.noise, (int, float)) or \
                not 0.0 <= self.noise < float("inf"):
            raise TrainError(f"noise must be a number >= 0, got {self.noise!r}")
        if self.kind not in KINDS:
            raise TrainError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.style not in ("published", "specjax"):
            raise TrainError(f"style must be published or specjax, got {self.style!r}")
        if self.kind == "eagle3" and (self.style != "published" or self.subset):
            raise TrainError("style and subset are EAGLE-1/2's variants (kind eagle1)")


KINDS = ("eagle3", "eagle1")
NOISE_STREAM = 1        # batch b's noise: numpy.random.default_rng([seed, b, NOISE_STREAM])


GREEDY = SamplingParams(temperature=0.0)


# -- Data ---------------------------------------------------------------------------------------

def continuations(target: Model, prompts, *, max_new_tokens: int = 64, temperature: float = 0.0,
                  top_p: float = 1.0, seed: int = 0, batch: int = 64,
                  progress=None) -> Sequences:
    """The target's continuations of `prompts` (texts or token-id lists), `batch` at a time,
    as `generate` decodes them (greedy by default; sampled at `temperature`, `top_p`, each row
    with its own seed `seed + i`, so the data does not depend on `batch`)."""
    _check_batch(batch)
    rows = encode_prompts(target, prompts)
    out = []
    for start in range(0, len(rows), batch):
        part = rows[start:start + batch]
        result = generate(target, part, "autoregressive",
                          SamplingParams(temperature=temperature, top_p=top_p),
                          max_new_tokens=max_new_tokens,
                          seed=[seed + start + i for i in range(len(part))])
        out += [(p, p + list(new)) for p, new in zip(part, result.tokens)]
        if progress is not None:
            progress(min(start + batch, len(rows)), len(rows))
    width = max(len(full) for _, full in out)
    tokens = np.zeros((len(out), width), np.int32)
    for i, (_, full) in enumerate(out):
        tokens[i, :len(full)] = full
    return Sequences(tokens, np.array([len(f) for _, f in out], np.int32),
                     np.array([len(p) for p, _ in out], np.int32))


def resolve_taps(target: Model, taps=None) -> tuple[int, ...]:
    """The taps to read: `taps` checked against the target's layers, or EAGLE-3's default
    (`eagle.default_taps`, which a target too shallow for three distinct ones has not)."""
    n = target.config.n_layers
    try:
        taps = eagle.default_taps(n) if taps is None else tuple(taps)
    except ValueError:
        raise TrainError(f"a {n}-layer target has no three distinct default EAGLE-3 taps "
                         f"(2, L // 2, L - 3); name them (taps=, or --taps)") from None
    if not taps or list(taps) != sorted(set(taps)) or taps[0] < 0 or taps[-1] >= n:
        raise TrainError(f"taps must be increasing layer counts in [0, {n}), got {list(taps)}")
    return taps


def _check_batch(batch) -> None:
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise TrainError(f"batch must be an integer >= 1, got {batch!r}")


def features(target: Model, sequences: Sequences, taps: tuple[int, ...] | None = None,
             batch: int = 16, dtype=np.float32, progress=None,
             directory: str | Path | None = None, final_only: bool = False) -> Features:
    """One teacher-forced pass of the target: its states after the `taps` layers (default
    EAGLE-3's, `eagle.default_taps`) and its final-normed states, at every position, kept in
    `dtype` (float16 halves the memory of a large set). Sequences of similar length run
    together, each batch padded to a multiple of 64 only (one program per padded length).

    With `directory`, the arrays are files there (`tapped.npy`, `final.npy`, memory-mapped:
    a set larger than memory), and the pass resumes where an interrupted one stopped (the
    batches done are recorded in `features.json` after each is written); a directory holding
    the features of other sequences, taps, dtype or batch is refused. With `final_only` (for a
    trainer that reads only the final states, EAGLE-1/2's), a finished pass over the same
    sequences in the same dtype is used whatever its taps and batch."""
    taps = resolve_taps(target, taps)
    _check_batch(batch)
    run = jax.jit(lambda params, tokens, positions: tapped_states(
        params, target.config, tokens, positions, taps=taps)[:2])
    n, t = sequences.tokens.shape
    d = target.config.d_model
    shapes = {"tapped": (n, t, len(taps) * d), "final": (n, t, d)}
    done, meta = 0, None
    if directory is None:
        arrays = {name: np.zeros(shape, dtype) for name, shape in shapes.items()}
    else:
        directory = Path(directory)
        arrays, meta, done = feature_files.open_pass(directory, target, sequences, taps, dtype,
                                                     batch, shapes, final_only)
        if done is None:                # a finished pass of other taps, reused
            return Features(sequences, tuple(meta["taps"]), arrays["tapped"], arrays["final"])
    order = np.argsort(sequences.length, kind="stable")
    for number, start in enumerate(range(0, n, batch)):
        if number < done:
            continue
        rows = order[start:start + batch]
        width = min(t, -(-int(sequences.length[rows].max()) // 64) * 64)
        padded = np.zeros((batch, width), np.int32)
        padded[:len(rows)] = sequences.tokens[rows, :width]       # one program per width
        positions = np.broadcast_to(np.arange(width, dtype=np.int32), (batch, width))
        x, f = run(target.params, padded, positions)
        arrays["final"][rows, :width] = np.asarray(x)[:len(rows)]
        arrays["tapped"][rows, :width] = np.asarray(f)[:len(rows)]
        if directory is not None:
            for array in arrays.values():
                array.flush()
            meta["batches_done"] = number + 1
            (directory / "features.json").write_text(json.dumps(meta) + "\n")
        if progress is not None:
            progress(min(start + batch, n), n)
    return Features(sequences, taps, arrays["tapped"], arrays["final"])


def draft_vocabulary(sequences: Sequences, size: int, vocab: int) -> np.ndarray:
    """The `size` ids the target generated most often (ties: the smaller id), ascending, as
    published drafters order their draft vocabulary (`d2t`). Ids it never generated fill the
    rest in id order."""
    if not 1 <= size <= vocab:
        raise TrainError(f"draft_vocab must be in [1, {vocab}], got {size}")
    s = np.arange(sequences.tokens.shape[1])[None]
    generated = (s >= sequences.prompt_length[:, None]) & (s < sequences.length[:, None])
    counts = np.bincount(sequences.tokens[generated], minlength=vocab)
    return np.sort(np.argsort(-counts, kind="stable")[:size]).astype(np.int32)


# -- Training -----------------------------------------------------------------------------------

def train(target: Model, data: Features, config: TrainConfig = TrainConfig(),
          checkpoint: str | Path | None = None, progress=None,
          stop_after: int | None = None, mesh=None,
          init: eagle.Drafter | None = None) -> eagle.Drafter:
    """Trains a published EAGLE-3 drafter for `target` on `data` (`features`), or with
    `config.kind` "eagle1" a published EAGLE-1/2 one (it reads `data.final` only).

    With `init` (a drafter for `target`, ours or published, of the shape this run trains), the
    run starts from its weights and its draft vocabulary instead of from scratch: fine-tuning,
    e.g. with more passes (`unroll`) than it was trained with.

    With `checkpoint` (a directory), the run's state is written there every
    `config.checkpoint_every` steps and at the end, and a run started on a directory that holds
    one resumes from it (it must be the same run: target, data and config). `progress(step,
    metrics, drafter)` is called after each step with the passes' [cross-entropy, agreement]
    and a function giving the drafter as it stands (`state.StepProgress` is such a progress
    bar). `stop_after` ends the run after that many steps of this call (an interruption, for
    tests). With `mesh` (data=N), each batch is split over its devices (`state.on_mesh`)."""
    t = check_features(target, data, tapped=True)
    mask_all = data.sequences.label_mask()
    if not mask_all.any():
        raise TrainError("no position to train on: the sequences hold no generated tokens")
    start, ids = _start(target, data, config, init)
    dc = start.config
    head = projection(target, ids)
    # EAGLE-3's head starts as the target's rows for the draft vocabulary; EAGLE-1/2 reads the
    # target's whole head (or its rows for the subset), frozen. The embeddings stay the
    # target's, frozen (the published drafters read them).
    trainable = dict(start.params, lm_head=head) if config.kind == "eagle3" else start.params
    if init is not None:
        trainable = init_weights(init, trainable)
    frozen = {"embed": target.params["embed"], "head": head}
    source = data.tapped if config.kind == "eagle3" else data.final     # what g_s is made of
    frozen = on_mesh(frozen, mesh, config)

    def batch_of(rows, w, b):
        batch = {"tokens": data.sequences.tokens[rows, :w],
                 "mask": mask_all[rows, :w].astype(np.float32),
                 "tapped": source[rows, :w].astype(np.float32),
                 "final": data.final[rows, :w].astype(np.float32)}
        if config.noise:                # batch b's own draw: a resumed run draws the same
            rng = np.random.default_rng([config.seed, b, NOISE_STREAM])
            batch["noise"] = rng.uniform(-config.noise, config.noise,
                                         (len(rows), w, dc.hidden_size)).astype(np.float32)
        return batch

    def drafter(params):
        return dataclasses.replace(start, params=params, target=target_identity(target, ids))

    return drafter(run_steps(config, data.sequences.length, t, batch_of,
                             functools.partial(eagle3_loss.step, dc, config, frozen=frozen),
                             trainable,
                             _run_key(target, data, config, None if init is None else trainable),
                             checkpoint, progress, stop_after, model_of=drafter, mesh=mesh))


def _start(target: Model, data: Features, config: TrainConfig, init):
    """(the drafter a run starts from, its draft vocabulary): a fresh one of the run's kind, or
    with `init` that drafter's shape and vocabulary (checked: `check_init`)."""
    vocab = target.config.vocab_size
    if config.kind == "eagle3":
        ids = draft_vocabulary(data.sequences, min(config.draft_vocab, vocab), vocab)
        start = eagle.init_drafter(target, token_ids=ids, kind="eagle3", taps=data.taps,
                                   seed=config.seed, std=0.02)
    elif config.subset:
        ids = draft_vocabulary(data.sequences, min(config.subset, vocab), vocab)
        start = eagle.init_drafter(target, token_ids=ids, kind="eagle1", head="subset",
                                   style=config.style, seed=config.seed, std=0.02)
    else:
        ids = np.arange(vocab, dtype=np.int32)
        start = eagle.init_drafter(target, kind="eagle1", head="target", style=config.style,
                                   seed=config.seed, std=0.02)
    if init is not None:
        check_init(init, start.config, target)
        ids = np.asarray(init.token_ids, np.int32)
        start = dataclasses.replace(start, config=init.config, token_ids=ids)
    return start, ids


def check_init(init: eagle.Drafter, dc: eagle.DrafterConfig, target: Model) -> None:
    """`init` must be a drafter trained on `target`, of the kind, shape and draft vocabulary
    size of a fresh start of this run (`dc`). Its layer's other settings (RoPE, norm epsilon)
    are its own, and kept."""
    if not isinstance(init, eagle.Drafter):
        raise TrainError(f"init must be an EAGLE drafter from specjax.load, got "
                         f"{type(init).__name__}")
    try:
        check_target(init, target)
    except ValueError as e:
        raise TrainError(str(e)) from None
    if init.config.subset_size != dc.subset_size and dc.kind == "eagle3":
        raise TrainError(f"{init.name} drafts over {init.config.subset_size} ids; this run's "
                         f"draft_vocab is {dc.subset_size}")
    shape = ("d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff")
    mine = {f.name: getattr(init.config, f.name) for f in dataclasses.fields(dc)
            if f.name != "layer"} | {f: getattr(init.config.layer, f) for f in shape}
    run = {f.name: getattr(dc, f.name) for f in dataclasses.fields(dc)
           if f.name != "layer"} | {f: getattr(dc.layer, f) for f in shape}
    differ = [f for f in run if mine[f] != run[f]]
    if differ:
        shown = ", ".join(f"{f} {mine[f]!r} (this run: {run[f]!r})" for f in differ[:3])
        raise TrainError(f"{init.name} is not the drafter this run trains: {shown}")


def init_weights(init: eagle.Drafter, trainable):
    """`init`'s weights, in float32, in place of a fresh start's (`trainable`)."""
    if set(init.params) != set(trainable):
        raise TrainError(f"{init.name} holds {sorted(init.params)}; this run trains "
                         f"{sorted(trainable)}")
    weights = {k: jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), init.params[k])
               for k in trainable}
    if jax.tree.map(jnp.shape, weights) != jax.tree.map(jnp.shape, trainable):
        raise TrainError(f"{init.name}'s weights differ in shape from this run's")
    return weights


# -- The tree ---------------------------------------------------------------------------------

def step_seconds(target: Model, prompt, new_tokens: int = 64, repeats: int = 3,
                 method="autoregressive") -> float:
    """The time of one decoding step of `generate(target, [prompt], method)` at temperature
    0: a run's time over its decoding steps, the fastest of `repeats` runs after the one that
    compiles. A whole step, with all that comes with the verify call (the drafter, the tree's
    walk, the loop); the prompt's prefill is spread over the steps as in any run, so make
    `new_tokens` long beside it."""
    if new_tokens < 2 or repeats < 1:
        raise TrainError(f"step times need new_tokens >= 2 and repeats >= 1, got {new_tokens} "
                         f"and {repeats}")
    prompt = encode_prompts(target, [prompt])[0]
    runs = [generate(target, [prompt], method, GREEDY, max_new_tokens=new_tokens).stats
            for _ in range(repeats + 1)]
    return min(r.run_s / max(r.steps, 1) for r in runs[1:])


def best_dynamic_tree(target: Model, drafter: eagle.Drafter, trees, prompts, *,
                      max_new_tokens: int = 64, new_tokens: int = 64,
                      repeats: int = 3) -> tuple[DynamicTree, list[dict]]:
    """Of the dynamic trees `trees`, the one that makes `drafter` decode fastest here: its
    tokens per target call on `prompts` at temperature 0 (exact: it does not depend on the
    machine or its load) over the time of a decoding step with it on the first prompt, in
    autoregressive steps (`step_seconds`, measured: keep the machine otherwise idle). Returns
    (the tree, one row per tree: {"tree", "tokens_per_call", "step_cost", "speedup"}), the
    first of equal speedups winning."""
    trees = list(trees)
    if not trees or not prompts or not all(isinstance(t, DynamicTree) for t in trees):
        raise TrainError(f"a tree search needs dynamic trees and prompts, got {trees!r} and "
                         f"{len(prompts)} prompts")
    one = step_seconds(target, prompts[0], new_tokens, repeats)
    rows = []
    for tree in trees:
        calls = generate(target, prompts, Eagle(drafter, tree=tree), GREEDY,
                         max_new_tokens=max_new_tokens).stats
        cost = step_seconds(target, prompts[0], new_tokens, repeats,
                            Eagle(drafter, tree=tree)) / one
        tokens = calls.tokens_per_target_call
        rows.append({"tree": [tree.depth, tree.top_k, tree.total_tokens],
                     "tokens_per_call": round(tokens, 3), "step_cost": round(cost, 3),
                     "speedup": round(tokens / cost, 3)})
    best = max(range(len(trees)), key=lambda i: (rows[i]["speedup"], -i))
    return trees[best], rows


def check_features(target: Model, data: Features, tapped: bool = False) -> int:
    """A trainer's check that `data` holds `target`'s features of its sequences (and, with
    `tapped`, their taps too); returns the sequences' stored width."""
    n, t = data.sequences.tokens.shape
    if data.final.shape[:2] != (n, t) or (tapped and data.tapped.shape[:2] != (n, t)):
        raise TrainError("features and sequences disagree in shape")
    if data.final.shape[2] != target.config.d_model or \
            int(data.sequences.tokens.max(initial=0)) >= target.config.vocab_size:
        raise TrainError(f"the features were not made by {target.name} (width or vocabulary "
                         f"differ)")
    return t


def _run_key(target: Model, data: Features, config: TrainConfig, init=None) -> str:
    """What makes two runs the same: target, data, config and the weights they start from
    (`init`'s, when it is given: a fresh start is fixed by the config's seed)."""
    settings = key_settings(config)
    h = hashlib.sha256()
    h.update(json.dumps([target.name, str(target.config), list(data.taps), settings],
                        sort_keys=True).encode())
    arrays = [data.sequences.tokens, data.sequences.length, data.sequences.prompt_length]
    for array in arrays + ([] if init is None else jax.tree.leaves(init)):
        h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()[:16]
