"""A DFlash block drafter (arXiv 2602.06036) trained for a target, in JAX.

The data are those of the EAGLE trainers: the target's own continuations of prompts
(`eagle3.continuations`, or `train data`'s shards) and one teacher-forced pass of the target
over them (`eagle3.features`) for its states after the drafter's taps.

A step draws, for each of `batch` sequences, `anchors` random anchor positions among those whose
next token the target generated (each step's draws from `numpy.random.default_rng([seed, b,
ANCHOR_STREAM])`, so a resumed run draws what an uninterrupted one draws). At anchor a the block
is the token at a and `block_size - 1` mask tokens at positions a + 1 ..; it reads the fused
context of every position before a and its own block, none of the other blocks
(`heads.dflash.blocks_states`: the same attention a decoding step's block has). Block position j
is scored by the cross-entropy of its logits (the target's LM head, frozen, as are its
embeddings) against the token at a + j, weighted exp(-(j - 1) / decay): the paper weights early
positions more, since a chain is accepted only up to its first miss. Positions past a sequence's
end are not scored.

Determinism: XLA on a CPU is deterministic and the draws are seeded by step, so a run resumed
from its checkpoint gives the weights of one that never stopped, bit for bit (tested).
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

from specjax.heads import dflash
from specjax.heads.shared import target_identity
from specjax.model.transformer import Model
from specjax.train.eagle3 import Features, check_features
from specjax.train.state import TrainError, check_settings, key_settings, optimizer, run_steps

__all__ = ["ANCHOR_STREAM", "TrainConfig", "TrainError", "train"]

ANCHOR_STREAM = 2       # step b's anchors: numpy.random.default_rng([seed, b, ANCHOR_STREAM])


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000               # optimizer steps
    batch: int = 8                  # sequences a step
    learning_rate: float = 6e-4     # peak, after a linear warmup, then cosine to 10%
    warmup: int = 50
    clip: float = 1.0               # global gradient norm
    seed: int = 0
    checkpoint_every: int = 100
    block_size: int = 8             # the block: the anchor's token and block_size - 1 drafts
    layers: int = 1                 # draft layers, of the target's width and heads
    anchors: int = 8                # blocks a sequence a step
    decay: float = 4.0              # block position j's loss weight exp(-(j - 1) / decay)
    slots: int = 0                  # > 0: batches of like lengths, about `slots` positions

    def __post_init__(self):
        check_settings(self, positive=("steps", "batch", "checkpoint_every", "layers",
                                       "anchors"),
                       non_negative=("warmup", "seed", "slots"), fractions=("learning_rate",),
                       at_most_inf=("clip", "decay"))
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or \
                self.block_size < 2:
            raise TrainError(f"block_size must be an integer >= 2, got {self.block_size!r}")


def _loss(trainable, frozen, batch, dc: dflash.DFlashConfig, decay: float):
    """The weighted cross-entropy of every block position (module docstring), and [loss, top-1
    accuracy, mean accepted prefix] for the log: the prefix of a block's drafts that match the
    data's tokens, what a greedy step would accept."""
    states = dflash.blocks_states(trainable, dc, frozen["embed"], batch["tapped"],
                                  batch["tokens"], batch["anchors"])          # [B, A, S, D]
    logits = jnp.einsum("BASD,VD->BASV", states[:, :, 1:], frozen["head"])
    if dc.output_multiplier != 1.0:
        logits = logits * dc.output_multiplier
    logp = jax.nn.log_softmax(logits, axis=-1)
    labels, valid = batch["labels"], batch["valid"]                          # [B, A, S - 1]
    ce = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
    weight = jnp.exp(-jnp.arange(labels.shape[-1], dtype=jnp.float32) / decay) * valid
    loss = jnp.sum(ce * weight) / jnp.maximum(jnp.sum(weight), 1e-6)
    right = (jnp.argmax(logits, -1) == labels) & (valid > 0)
    accuracy = jnp.sum(right) / jnp.maximum(jnp.sum(valid), 1.0)
    prefix = jnp.sum(jnp.cumprod(right, axis=-1), axis=-1)                    # [B, A]
    blocks = jnp.maximum(jnp.sum(valid[..., 0]), 1.0)
    return loss, jnp.stack([loss, accuracy, jnp.sum(prefix * valid[..., 0]) / blocks])[None]


@functools.partial(jax.jit, static_argnums=(0, 1))
def _step(dc: dflash.DFlashConfig, config: TrainConfig, trainable, opt_state, batch, frozen):
    (_, metrics), grads = jax.value_and_grad(_loss, has_aux=True)(
        trainable, frozen, batch, dc, config.decay)
    updates, opt_state = optimizer(config).update(grads, opt_state, trainable)
    return jax.tree.map(jnp.add, trainable, updates), opt_state, metrics


def anchors_of(sequences, rows, width: int, config: TrainConfig, b: int):
    """Step b's anchors [R, A] for `rows`, the block's labels [R, A, S - 1] (the tokens at
    a + 1 ..) and which are scored [R, A, S - 1]: anchors uniform among the positions whose next
    token was generated (a row with none gets anchor 0 and nothing scored)."""
    rng = np.random.default_rng([config.seed, b, ANCHOR_STREAM])
    length = sequences.length[rows].astype(np.int64)
    low = np.maximum(sequences.prompt_length[rows].astype(np.int64) - 1, 0)
    high = np.maximum(length - 1, low + 1)            # anchors in [low, high)
    anchors = low[:, None] + np.floor(rng.random((len(rows), config.anchors))
                                      * (high - low)[:, None]).astype(np.int64)
    anchors = np.minimum(anchors, width - 1)
    offsets = anchors[..., None] + np.arange(1, config.block_size)            # [R, A, S - 1]
    valid = (offsets < length[:, None, None]) & (length > low + 1)[:, None, None]
    labels = np.take_along_axis(sequences.tokens[rows], np.minimum(offsets, width - 1)
                                .reshape(len(rows), -1), axis=1).reshape(offsets.shape)
    return anchors.astype(np.int32), labels.astype(np.int32), valid.astype(np.float32)


def train(target: Model, data: Features, config: TrainConfig = TrainConfig(),
          checkpoint: str | Path | None = None, progress=None, stop_after: int | None = None,
          mask_token_id: int | None = None) -> dflash.BlockDrafter:
    """Trains a DFlash drafter for `target` on `data` (`eagle3.features` at the drafter's taps:
    `data.taps`, layer counts >= 1), in the published layout's shape. `mask_token_id` defaults
    to the target's last id (a real DFlash drafter for a model with a reserved mask token
    names it). With `checkpoint` (a directory), the state is written every
    `config.checkpoint_every` steps and at the end, and a run on a directory holding one of the
    same run resumes from it. `progress(step, metrics, drafter)` follows each step, metrics
    [[loss, accuracy, accepted prefix]]; `stop_after` ends this call after that many steps."""
    t = check_features(target, data, tapped=True)
    if not data.taps or min(data.taps) < 1:
        raise TrainError(f"a DFlash drafter reads the states after layers (taps >= 1), got "
                         f"{list(data.taps)}")
    if target.config.arch != "llama":
        raise TrainError(f"DFlash drafters serve Llama-family targets, not "
                         f"{target.config.arch!r}")
    start = dflash.init_block_drafter(target, layers=config.layers, block_size=config.block_size,
                                      mask_token_id=mask_token_id, taps=data.taps,
                                      seed=config.seed)
    dc = start.config
    head = target.params["embed" if target.config.tie_embeddings else "lm_head"]
    frozen = {"embed": target.params["embed"], "head": head}

    def batch_of(rows, w, b):
        anchors, labels, valid = anchors_of(data.sequences, rows, w, config, b)
        return {"tokens": data.sequences.tokens[rows, :w], "anchors": anchors,
                "tapped": data.tapped[rows, :w].astype(np.float32), "labels": labels,
                "valid": valid}

    def drafter(params):
        return dataclasses.replace(start, params=params)

    return drafter(run_steps(config, data.sequences.length, t, batch_of,
                             functools.partial(_step, dc, config, frozen=frozen), start.params,
                             _run_key(target, data, config, dc.mask_token_id), checkpoint,
                             progress, stop_after, model_of=drafter))


def _run_key(target: Model, data: Features, config: TrainConfig, mask: int) -> str:
    h = hashlib.sha256(json.dumps([target.name, str(target.config), list(data.taps),
                                   key_settings(config), mask], sort_keys=True).encode())
    for array in (data.sequences.tokens, data.sequences.length, data.sequences.prompt_length):
        h.update(np.ascontiguousarray(array).tobytes())
    h.update(json.dumps(target_identity(target, [0])["config"], sort_keys=True).encode())
    return h.hexdigest()[:16]
