"""A draft model for speculative decoding: a small plain Llama LM trained for a frozen target.

    from specjax.train import data, draft, eagle3
    sequences, held_out = data.read("runs/data", target)        # `train data`'s shards
    states = eagle3.features(target, sequences, taps=(0,))      # one pass of the target
    model = draft.train(target, states, draft.TrainConfig(steps=500), checkpoint="run/")
    specjax.io.checkpoint.save(model, "out")                    # a LlamaForCausalLM checkpoint

The result is a `specjax.Model` with the target's tokenizer, vocabulary and special tokens, so
`specjax.generate(target, ..., method="speculative", draft=model)` runs it, and
`specjax.io.checkpoint.save` writes the plain Hugging Face Llama checkpoint that every engine's
draft-model speculation reads. Unlike an EAGLE drafter or Medusa heads it never reads the
target's states while decoding: it is a language model of its own, and pays for that with its
own context.

The data. The sequences are the target's own continuations of a prompt set, as for the other
trainers (the draft learns the text it will be asked to propose), and the soft labels are the
target's next-token distributions from one teacher-forced pass (`eagle3.features`, whose
`.final` are the target's final-normed states: the distribution is softmax(final @ LM head)).
Training never runs the target again.

The loss. The cross-entropy of the draft's next-token logits against the target's distribution
(forward KL(target || draft) up to the target's entropy, which has no gradient), on the
positions `Sequences.label_mask` marks: those whose next token the target generated. Soft
labels only, no hard ones: on greedy continuations the hard label is the soft label's argmax,
and on sampled ones it is a draw from it, whose cross-entropy the soft one is the expectation
of, with less noise. Matching the whole distribution is what acceptance asks for: greedy
acceptance wants the draft's argmax to be the target's, sampled acceptance is 1 - TV(p, q)
(Leviathan et al. 2023), which the KL bounds (Pinsker; DistillSpec, Zhou et al. 2023).

The initialisation. The token embeddings (tied: they are the LM head too, which halves the
vocabulary's share of a small draft) start as the target's, projected onto their top d_model
principal axes (each axis's sign fixed, so the projection is deterministic) and rescaled to
entries of standard deviation 0.02: the differences between tokens, which are what a tied head
turns into logits, are kept, at the scale of the rest of the initialisation. The layers are
drawn from `seed` (GPT-2's: N(0, 0.02), the residual output projections scaled by
1 / sqrt(2 L)).

Determinism: batch b of a run is drawn by `numpy.random.default_rng([seed, b])` and XLA on a
CPU is deterministic, so a run resumed from its checkpoint gives the weights of one that never
stopped, bit for bit (tested).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specjax.heads.shared import projection
from specjax.model.config import ConfigError, ModelConfig
from specjax.model.quant import rows
from specjax.model.params import init_params
from specjax.model.transformer import Model, forward
from specjax.train.eagle3 import Features, check_features
from specjax.train.state import (TrainError, check_settings, key_settings, on_mesh,
                                 optimizer, run_steps)

__all__ = ["TrainConfig", "draft_config", "train"]

EMBED_STD = 0.02        # the projected embeddings' scale: the initialisation's


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 500                # optimizer steps
    batch: int = 8                  # sequences a step
    learning_rate: float = 1e-3     # peak, after a linear warmup, then cosine to 10%
    warmup: int = 20
    clip: float = 1.0               # global gradient norm
    seed: int = 0
    checkpoint_every: int = 100
    # > 0: batches of sequences of like length, about `slots` positions a step, in place of
    # `batch` sequences (`state.batches`: less padding)
    slots: int = 0
    # The draft's shape; None takes the default from the target (`draft_config`).
    layers: int = 2
    d_model: int | None = None      # default: half the target's width
    heads: int | None = None        # default: d_model / the target's head size (at least 1)
    kv_heads: int | None = None     # default: heads (multi-head attention)
    d_ff: int | None = None         # default: the target's d_ff / d_model ratio, a multiple of 32

    def __post_init__(self):
        shape = [n for n in ("d_model", "heads", "kv_heads", "d_ff")
                 if getattr(self, n) is not None]
        check_settings(self, positive=("steps", "batch", "checkpoint_every", "layers", *shape),
                       non_negative=("warmup", "seed", "slots"),
                       fractions=("learning_rate",), at_most_inf=("clip",))


def draft_config(target: Model, config: TrainConfig) -> ModelConfig:
    """The draft's ModelConfig: `config`'s shape, its defaults taken from the target, with the
    target's vocabulary, special tokens and context. A shape that does not fit (a width that
    the heads do not divide, a width past the target's) is a TrainError naming it."""
    t = target.config
    d = config.d_model if config.d_model is not None else max(1, t.d_model // 2)
    if d > t.d_model:
        raise TrainError(f"d_model {d} is wider than the target's {t.d_model}: its embeddings "
                         f"are projected onto d_model of their principal axes")
    heads = config.heads if config.heads is not None else max(1, d // t.head_dim)
    kv_heads = config.kv_heads if config.kv_heads is not None else heads
    if d % heads:
        raise TrainError(f"d_model {d} is not a multiple of heads {heads}")
    if heads % kv_heads:
        raise TrainError(f"heads {heads} is not a multiple of kv_heads {kv_heads}")
    if (d // heads) % 2:
        raise TrainError(f"the head size d_model / heads = {d // heads} must be even (RoPE)")
    d_ff = (config.d_ff if config.d_ff is not None
            else max(32, round(t.d_ff / t.d_model * d / 32) * 32))
    llama = t.arch == "llama"       # a GPT-2 target's draft takes Llama's usual settings
    try:
        return ModelConfig(
            arch="llama", vocab_size=t.vocab_size, d_model=d, n_layers=config.layers,
            n_heads=heads, n_kv_heads=kv_heads, head_dim=d // heads, d_ff=d_ff,
            max_positions=t.max_positions, norm_eps=t.norm_eps if llama else 1e-5,
            activation="silu", tie_embeddings=True,
            rope_theta=t.rope_theta if llama else 10000.0,
            rope_scaling=t.rope_scaling if llama else None, bos_token_id=t.bos_token_id,
            eos_token_ids=t.eos_token_ids, model_type="llama")
    except ConfigError as e:
        raise TrainError(f"the draft's shape: {e}") from None


def principal_embeddings(target: Model, d_model: int) -> np.ndarray:
    """The target's token embeddings [V, D_t] centred and projected onto their top `d_model`
    principal axes, each axis signed so that its largest entry is positive (eigenvectors have
    no sign of their own), rescaled to entries of standard deviation EMBED_STD: [V, d_model]."""
    v = target.config.vocab_size
    embed = np.asarray(rows(target.params["embed"], jnp.arange(v)), np.float32)
    mean = embed.mean(axis=0, dtype=np.float64)
    covariance = np.zeros((embed.shape[1],) * 2)
    for start in range(0, v, 8192):           # float64 a slice at a time (V x D_t can be GBs)
        part = embed[start:start + 8192].astype(np.float64) - mean
        covariance += part.T @ part
    _, vectors = np.linalg.eigh(covariance)                         # ascending
    axes = vectors[:, ::-1][:, :d_model]                            # [D_t, d_model]
    largest = np.argmax(np.abs(axes), axis=0)
    axes = axes * np.sign(axes[largest, np.arange(d_model)])
    projected = (embed - mean.astype(np.float32)) @ axes.astype(np.float32)
    return (projected * (EMBED_STD / max(float(projected.std()), 1e-12))).astype(np.float32)


def init(target: Model, dc: ModelConfig, seed: int) -> dict:
    """The draft's starting parameters (module docstring)."""
    params = init_params(dc, jax.random.key(seed), std=0.02)
    scale = 1.0 / math.sqrt(2 * dc.n_layers)
    layers = params["layers"]
    params["layers"] = dict(layers, wo=layers["wo"] * scale, w_down=layers["w_down"] * scale)
    params["embed"] = jnp.asarray(principal_embeddings(target, dc.d_model))
    return params


def _loss(params, head, batch, dc: ModelConfig):
    """The cross-entropy against the target's distribution (module docstring) and [loss, top-1
    agreement with the target] for the log."""
    tokens, mask = batch["tokens"], batch["mask"]
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
    logits, _ = forward(params, dc, tokens, positions)                          # [B, T, V]
    soft = jax.nn.softmax(jnp.einsum("BTD,VD->BTV", batch["final"], head), axis=-1)
    count = jnp.maximum(jnp.sum(mask), 1.0)
    ce = -jnp.sum(jnp.sum(soft * jax.nn.log_softmax(logits), -1) * mask) / count
    agree = jnp.sum((jnp.argmax(logits, -1) == jnp.argmax(soft, -1)) * mask) / count
    return ce, jnp.stack([ce, agree])[None]         # one "pass", as the trainers' logs read


@functools.partial(jax.jit, static_argnums=(0, 1))
def _step(dc: ModelConfig, config: TrainConfig, params, opt_state, batch, head):
    (_, parts), grads = jax.value_and_grad(_loss, has_aux=True)(params, head, batch, dc)
    updates, opt_state = optimizer(config).update(grads, opt_state, params)
    return jax.tree.map(jnp.add, params, updates), opt_state, parts


def train(target: Model, data: Features, config: TrainConfig = TrainConfig(),
          checkpoint: str | Path | None = None, progress=None,
          stop_after: int | None = None, mesh=None) -> Model:
    """Trains a draft model for `target` on `data` (`eagle3.features`: its final-normed states
    give the soft labels; any taps will do, (0,) is the cheapest).

    With `checkpoint` (a directory), the run's state is written there every
    `config.checkpoint_every` steps and at the end, and a run started on a directory that holds
    one resumes from it (it must be the same run: target, data and config). `progress(step,
    metrics, model)` is called after each step with the draft's [[loss, agreement]] and a
    function giving the draft as it stands (`state.StepProgress` is such a progress bar).
    `stop_after` ends the run after that many steps of this call (an interruption, for
    tests). With `mesh` (data=N), each batch is split over its devices (`state.on_mesh`)."""
    t = check_features(target, data)
    mask_all = data.sequences.label_mask()
    if not mask_all.any():
        raise TrainError("no position to train on: the sequences hold no generated tokens")
    dc = draft_config(target, config)
    head = on_mesh(projection(target, np.arange(target.config.vocab_size)), mesh, config)

    start = init(target, dc, config.seed)

    def batch_of(picked, w, _):
        return {"tokens": data.sequences.tokens[picked, :w],
                "mask": mask_all[picked, :w].astype(np.float32),
                "final": np.asarray(data.final[picked, :w], np.float32)}

    def model(params):
        return Model(dc, params, target.tokenizer, None, target.chat_template)

    return model(run_steps(config, data.sequences.length, t, batch_of,
                           functools.partial(_step, dc, config, head=head), start,
                           _run_key(target, data, config, dc), checkpoint, progress, stop_after,
                           model_of=model, mesh=mesh))


def _run_key(target: Model, data: Features, config: TrainConfig, dc: ModelConfig) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(["draft", target.name, str(target.config), key_settings(config),
                         str(dc)], sort_keys=True).encode())
    for array in (data.sequences.tokens, data.sequences.length, data.sequences.prompt_length):
        h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()[:16]
