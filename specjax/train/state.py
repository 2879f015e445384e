"""What every trainer in `specjax.train` shares: its error, its optimizer, its checkpoints and
its progress bar.

A checkpoint is a directory holding the run's trainable parameters and optimizer state
(state.npz, the pytree's leaves in order) and state.json (the run's key and the steps done). It
is written to a temporary file and renamed, so an interruption leaves the previous checkpoint
whole; a run resumes from it only if its key (target, data and settings, hashed by the trainer)
is the same.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec


__all__ = ["StepProgress", "TrainError", "batches", "check_settings", "key_settings", "on_mesh",
           "optimizer", "resume_state", "run_steps", "save_state"]


class TrainError(ValueError):
    """A training request that cannot run: bad settings, data of another target, a checkpoint
    of another run."""


def check_settings(config, positive=(), non_negative=(), fractions=(), at_most_inf=()) -> None:
    """A trainer's settings checked where they enter: the fields named in `positive` are
    integers >= 1, in `non_negative` integers >= 0, in `fractions` numbers in (0, 1], in
    `at_most_inf` numbers > 0. A TrainError names the first that is not."""
    for names, low in ((positive, 1), (non_negative, 0)):
        for name in names:
            value = getattr(config, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise TrainError(f"{name} must be an integer >= {low}, got {value!r}")
    for names, high in ((fractions, 1.0), (at_most_inf, float("inf"))):
        for name in names:
            value = getattr(config, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not 0.0 < value <= high:
                raise TrainError(f"{name} must be a number in (0.0, {high}], got {value!r}")


LATER = ("noise", "slots")      # settings added after runs were made with the trainers


def key_settings(config) -> dict:
    """A config's fields as they go into its run key. Settings added after runs were made
    (`LATER`) enter it only when they are set, so those runs keep their keys and resume."""
    settings = dataclasses.asdict(config)
    for name in LATER:
        if name in settings and not settings[name]:
            del settings[name]
    return settings


def optimizer(config):
    """AdamW (b1 0.9, b2 0.95) with the global gradient norm clipped to `config.clip`, at a
    learning rate warmed up linearly over `config.warmup` steps to `config.learning_rate`, then
    cosine-decayed to a tenth of it at `config.steps`."""
    try:
        import optax    # lazy: the `train` extra; the rest of specjax runs without it
    except ImportError:
        raise TrainError("training needs optax: pip install specjax[train]") from None
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, config.learning_rate, max(config.warmup, 1), max(config.steps, config.warmup + 1),
        end_value=config.learning_rate / 10)
    return optax.chain(optax.clip_by_global_norm(config.clip),
                       optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=0.0))


def on_mesh(tree, mesh, config=None):
    """`tree` replicated on every device of `mesh` (None: as it is), for data-parallel
    training: the trainable parameters, the optimizer's state and the frozen arrays live
    whole on every device, each step's batch is split by row over "data" (`run_steps`), and
    XLA sums the gradients across devices. With `config`, the mesh is checked against it."""
    if mesh is None:
        return tree
    if config is not None:
        data, model = mesh.shape.get("data", 1), mesh.shape.get("model", 1)
        if model != 1:
            raise TrainError(f"training runs data-parallel: a mesh of data=N (model=1), "
                             f"got model={model}")
        if config.batch % data and not config.slots:    # with slots, `batches` splits
            raise TrainError(f"batch {config.batch} does not split over the mesh's data="
                             f"{data} devices; make it a multiple of {data}")
    return jax.device_put(tree, NamedSharding(mesh, PartitionSpec()))


def run_steps(config, lengths: np.ndarray, width: int, batch_of, step, trainable, run_key: str,
              checkpoint=None, progress=None, stop_after: int | None = None, model_of=None,
              mesh=None):
    """The training loop every trainer shares; returns the trainable parameters.

    Step b draws its rows of the N sequences (their `lengths` [N], stored `width` wide) and
    their width with `batches` and calls `step(trainable, opt_state, batch_of(rows, w, b))` ->
    (trainable, opt_state, metrics) (b: for what else a batch draws, as EAGLE's input noise).
    With `checkpoint` (a directory) the state is saved every `config.checkpoint_every` steps
    and at the end, and a run started on a checkpoint of the same `run_key` resumes from it;
    `progress(step, metrics, model)` follows each step, `model()` giving the trained model as
    it stands (`model_of(trainable)`); `stop_after` ends this call after that many steps. With
    `mesh` (data=N), each batch is split by row over its devices (`on_mesh`: the caller places
    the frozen arrays with it too). The gradients are then sums across devices, in another
    order than one device's: a run on a mesh resumes bit for bit on the same mesh, and matches
    a one-device run to float rounding."""
    opt_state = optimizer(config).init(trainable)
    done = 0
    if checkpoint is not None:
        checkpoint = Path(checkpoint)
        trainable, opt_state, done = resume_state(checkpoint, run_key, trainable, opt_state)
    trainable, opt_state = on_mesh((trainable, opt_state), mesh, config)
    if mesh is not None:
        by_row = NamedSharding(mesh, PartitionSpec("data"))
        batch_of = (lambda of: lambda rows, w, b: jax.device_put(of(rows, w, b), by_row))(
            batch_of)
    draw = batches(config, lengths, width, 1 if mesh is None else mesh.shape.get("data", 1))
    limit = config.steps if stop_after is None else min(config.steps, done + stop_after)
    for b in range(done, limit):
        rows, w = draw(b)
        # XLA's formulations: a loaded model's config names no CPU kernels (`ModelConfig.kernels`)
        trainable, opt_state, metrics = step(trainable, opt_state, batch_of(rows, w, b))
        if progress is not None:
            progress(b + 1, np.asarray(metrics),
                     lambda now=trainable: model_of(_one_device(now, mesh)))
        if checkpoint is not None and ((b + 1) % config.checkpoint_every == 0 or
                                       b + 1 == limit):
            save_state(checkpoint, run_key, trainable, opt_state, b + 1)
    return _one_device(trainable, mesh)


def batches(config, lengths: np.ndarray, width: int, multiple: int = 1):
    """The function b -> (rows, w) that gives step b its sequences (indices into `lengths`, the
    sequences' lengths) and the width they are cut to (<= `width`), drawn by
    `numpy.random.default_rng([config.seed, b])`: a resumed run draws what an uninterrupted one
    does.

    `config.batch` sequences, taken to a multiple of 64 past the longest (a few programs), or,
    with `config.slots` > 0, sequences of like length: the sequences are classed by their
    length rounded up to a multiple of 64, and step b draws a class, then as many of its
    sequences as fill `slots` positions at its width (a multiple of `multiple`, the mesh's
    devices, and at least that). A class is drawn with a chance in proportion to its sequences
    over the rows of its batches, so that every sequence is drawn equally often, as with
    `batch`; but a batch wastes less than 64 positions a row on padding, where a draw of
    `batch` from sequences of mixed lengths pads them all to about the longest. One program
    per class."""
    n = len(lengths)
    rounded = np.minimum(width, -(-np.asarray(lengths, np.int64) // 64) * 64)
    if not config.slots:
        def draw(b):
            rows = np.random.default_rng([config.seed, b]).choice(n, config.batch,
                                                                  replace=n < config.batch)
            return rows, int(rounded[rows].max())
        return draw
    widths, classes = np.unique(rounded, return_inverse=True)
    members = [np.flatnonzero(classes == k) for k in range(len(widths))]
    rows_of = [max(multiple, config.slots // int(w) // multiple * multiple) for w in widths]
    chance = np.array([len(m) / r for m, r in zip(members, rows_of)])

    def draw(b):
        rng = np.random.default_rng([config.seed, b])
        k = rng.choice(len(widths), p=chance / chance.sum())
        rows = rng.choice(members[k], rows_of[k], replace=len(members[k]) < rows_of[k])
        return rows, int(widths[k])
    return draw


def _one_device(tree, mesh):
    """A tree replicated on `mesh` back on the default device, where the model it goes into
    decodes (the target's arrays are there)."""
    return tree if mesh is None else jax.device_put(tree, jax.devices()[0])


def save_state(directory: Path, run_key: str, trainable, opt_state, step: int) -> None:
    """The run's state after `step` steps, into `directory`; a write that fails (a full disk)
    is a TrainError naming it, and leaves the checkpoint before it whole."""
    leaves = jax.tree.leaves((trainable, opt_state))
    arrays = {f"leaf_{i:04d}": np.asarray(a) for i, a in enumerate(leaves)}
    partial, partial_meta = directory / "state.npz.partial", directory / "state.json.partial"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(partial, "wb") as f:
            np.savez(f, **arrays)
        partial_meta.write_text(json.dumps(
            {"run": run_key, "step": step, "leaves": len(leaves), "time": time.time()}) + "\n")
        # Both written before either replaces the last checkpoint's (a rename takes no room).
        os.replace(partial, directory / "state.npz")
        os.replace(partial_meta, directory / "state.json")
    except OSError as e:
        raise TrainError(f"{directory}: cannot write the checkpoint of step {step} "
                         f"({e.strerror or e})") from None


def resume_state(directory: Path, run_key: str, trainable, opt_state):
    """(trainable, opt_state, steps done) from `directory`'s checkpoint of this run, or the
    given ones and 0 when it holds none; a checkpoint of another run is a TrainError."""
    meta_file, state_file = directory / "state.json", directory / "state.npz"
    if not meta_file.exists() or not state_file.exists():
        return trainable, opt_state, 0
    try:
        meta = json.loads(meta_file.read_text())
        step, run = int(meta["step"]), meta["run"]
    except (ValueError, KeyError, TypeError):
        raise TrainError(f"{meta_file}: not a specjax training checkpoint") from None
    if run != run_key:
        raise TrainError(f"{directory} holds a checkpoint of another run (other target, data or "
                         f"settings); use a new directory or remove it")
    leaves, treedef = jax.tree.flatten((trainable, opt_state))
    with np.load(state_file) as saved:
        if len(saved.files) != len(leaves):
            raise TrainError(f"{state_file}: {len(saved.files)} arrays, expected {len(leaves)}")
        restored = [jnp.asarray(saved[f"leaf_{i:04d}"], dtype=a.dtype)
                    for i, a in enumerate(leaves)]
    for got, want in zip(restored, leaves):
        if got.shape != want.shape:
            raise TrainError(f"{state_file}: an array of shape {got.shape}, expected {want.shape}")
    trainable, opt_state = jax.tree.unflatten(treedef, restored)
    return trainable, opt_state, step


class StepProgress:
    """A training run's progress bar: the step, the loss and agreement of each pass or head,
    steps per second and the time left; and every `evaluate_every` steps `evaluate(model)`,
    the held-out tokens per target call at temperature 0 (deterministic for a seed, as the
    loss is). A line rewritten in place on a terminal, a plain line every `log_every` steps and
    at each evaluation otherwise (a log). Called as `progress(step, metrics, model)`."""

    def __init__(self, steps: int, label: str = "loss/agreement", evaluate=None,
                 evaluate_every: int = 0, stream=None):
        self.steps, self.label, self.evaluate = steps, label, evaluate
        self.evaluate_every = evaluate_every if evaluate is not None else 0
        self.stream = stream or sys.stderr
        self.tty, self.log_every = self.stream.isatty(), max(1, steps // 20)
        self.started, self.first, self.held_out = time.time(), None, None

    def __call__(self, step: int, metrics: np.ndarray, model) -> None:
        if self.first is None:                          # a resumed run starts past 0
            self.first, self.started = step - 1, time.time()
        evaluated = self.evaluate_every and (step % self.evaluate_every == 0 or
                                             step == self.steps)
        if evaluated:
            self.held_out = self.evaluate(model())
        if not (self.tty or evaluated or step % self.log_every == 0 or step == self.steps):
            return
        rate = (step - self.first) / max(time.time() - self.started, 1e-9)
        parts = " ".join(f"{row[0]:.3f}/" + "/".join(f"{v:.2f}" for v in row[1:])
                         for row in np.asarray(metrics))
        line = f"train: step {step}/{self.steps}, {self.label} {parts}"
        if self.held_out is not None:
            line += f", held out {self.held_out:.2f} tokens/call"
        line += f", {rate:.2f} steps/s, {duration((self.steps - step) / rate)} left"
        if self.tty:
            self.stream.write("\r\x1b[K" + line + ("\n" if step == self.steps else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def duration(seconds: float) -> str:
    """'4m05s', or '1h04m' past an hour."""
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"
