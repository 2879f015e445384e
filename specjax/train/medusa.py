"""Medusa-1 heads (Cai et al. 2024) trained for a frozen target, written in FasterDecoding's
layout.

    from specjax.train import data, eagle3, medusa
    sequences, held_out = data.read("runs/data", target)        # `train data`'s shards
    states = eagle3.features(target, sequences)                 # one pass of the target
    heads = medusa.train(target, states, medusa.TrainConfig(steps=500), checkpoint="run/")
    specjax.io.medusa.save_heads(heads, "out", format="medusa")  # FasterDecoding's layout

The data. The sequences are the target's own continuations of a prompt set (self-distillation,
as Medusa-2's recipe and the shipped heads do: the labels are the tokens the target's decoding
will check), and the heads read the target's final-normed hidden states h_s from one
teacher-forced pass (`eagle3.features`, `Features.final`). Training never runs the target
again.

The loss. Head k (0-based) reads h_s and predicts token s + 2 + k, one place past the target's
own next-token head for each k (`specjax.heads.medusa`). Its cross-entropy is taken on the
positions where that token is a generated one, and head k's is weighted decay^k (the paper's
lambda_k = 0.8^k). Heads with their own LM heads (`head="own"`, the published layout) start as
the target's LM head with identity blocks (Medusa's initialisation: each head starts as the
target's next-token predictor); subset heads (`head="subset"`, specjax's variant) read the
target's LM-head rows for the `subset` ids the target generated most often, frozen, and a label
outside them is not trained on.

The tree. Heads decode best with a tree of their candidates (`specjax.decoding.medusa`), and
the best tree depends on how often each head's r-th candidate is right and on what a step with
a verify call of n tokens costs on the machine that runs it. `rank_accuracy` measures the first
on held-out continuations; `growth` grows the tree as Medusa does, best-first by each node's
chance of being accepted (the product of its path's rank accuracies, the heads taken as
independent); `step_costs` times whole decoding steps with each prefix of that growth as the
tree (`call_costs` times a verify call alone, which leaves out the rest of the step); and
`best_tree` keeps the prefix with the most expected tokens (1 + the sum of the chances) per
unit of cost.

Determinism: batch b of a run is drawn by `numpy.random.default_rng([seed, b])` and XLA on a
CPU is deterministic, so a run resumed from its checkpoint gives the weights of one that never
stopped, bit for bit (tested).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specjax.api.forward import kernels_of
from specjax.api.methods import Medusa
from specjax.heads import medusa as heads_math
from specjax.heads.shared import projection, target_identity
from specjax.model.cache import KVCache
from specjax.model.transformer import Model, forward
from specjax.sampling.tree import Tree
from specjax.train.eagle3 import Features, check_features, draft_vocabulary, step_seconds
from specjax.train.state import (TrainError, check_settings, key_settings, on_mesh,
                                 optimizer, run_steps)

__all__ = ["TrainConfig", "best_tree", "call_costs", "growth", "rank_accuracy", "step_costs",
           "train", "verify_cost"]


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 500                # optimizer steps
    batch: int = 8                  # sequences a step
    learning_rate: float = 1e-3     # peak, after a linear warmup, then cosine to 10%
    warmup: int = 20
    heads: int = 3                  # K
    blocks: int = 1                 # residual blocks per head
    head: str = "own"               # "own": each head's LM head (Medusa-1); "subset"
    subset: int = 1024              # S, for head "subset": the most frequent generated ids
    decay: float = 0.8              # head k's loss weight is decay^k (Medusa's lambda_k)
    clip: float = 1.0               # global gradient norm
    seed: int = 0
    checkpoint_every: int = 100
    # > 0: batches of sequences of like length, about `slots` positions a step, in place of
    # `batch` sequences (`state.batches`: less padding)
    slots: int = 0

    def __post_init__(self):
        check_settings(self, positive=("steps", "batch", "heads", "blocks", "subset",
                                       "checkpoint_every"),
                       non_negative=("warmup", "seed", "slots"),
                       fractions=("learning_rate", "decay"), at_most_inf=("clip",))
        if self.head not in ("own", "subset"):
            raise TrainError(f"head must be 'own' or 'subset', got {self.head!r}")


def labels(features: Features, heads: int, index: np.ndarray) -> np.ndarray:
    """[N, T, K] int32: for position s and head k, the index (in `index`, token id -> index or
    -1) of token s + 2 + k where it is a generated token the heads can propose, else -1."""
    seqs = features.sequences
    n, t = seqs.tokens.shape
    out = np.full((n, t, heads), -1, np.int32)
    for k in range(heads):
        ahead = 2 + k
        if ahead >= t:
            break
        token = seqs.tokens[:, ahead:]                                     # [N, T - ahead]
        position = np.arange(ahead, t)[None]
        generated = (position >= seqs.prompt_length[:, None]) & (position < seqs.length[:, None])
        out[:, :t - ahead, k] = np.where(generated, index[token], -1)
    return out


def _loss(trainable, frozen, batch, config: heads_math.HeadsConfig, decay: float):
    """The heads' weighted cross-entropy and, per head, [loss, top-1 accuracy] for the log."""
    proj = jnp.stack(trainable["lm_heads"]) if config.head == "own" else frozen["proj"]
    logits = heads_math.subset_logits({"blocks": heads_math.runtime_blocks(trainable["blocks"]),
                                       "proj": proj},
                                      batch["final"], kernels=None)            # [B, T, K, S]
    target = batch["labels"]                                                   # [B, T, K]
    mask = (target >= 0).astype(jnp.float32)
    picked = jnp.take_along_axis(jax.nn.log_softmax(logits),
                                 jnp.maximum(target, 0)[..., None], axis=-1)[..., 0]
    count = jnp.maximum(jnp.sum(mask, axis=(0, 1)), 1.0)                       # [K]
    ce = -jnp.sum(picked * mask, axis=(0, 1)) / count
    accuracy = jnp.sum((jnp.argmax(logits, -1) == target) * mask, axis=(0, 1)) / count
    total = jnp.sum(decay ** jnp.arange(config.num_heads) * ce)
    return total, jnp.stack([ce, accuracy], axis=-1)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _step(hc: heads_math.HeadsConfig, config: TrainConfig, trainable, opt_state, batch, frozen):
    (_, parts), grads = jax.value_and_grad(_loss, has_aux=True)(trainable, frozen, batch, hc,
                                                                config.decay)
    updates, opt_state = optimizer(config).update(grads, opt_state, trainable)
    return jax.tree.map(jnp.add, trainable, updates), opt_state, parts


def train(target: Model, data: Features, config: TrainConfig = TrainConfig(),
          checkpoint: str | Path | None = None, progress=None,
          stop_after: int | None = None, mesh=None) -> heads_math.Heads:
    """Trains Medusa-1 heads for `target` on `data` (`eagle3.features`: its final-normed
    states are what the heads read).

    With `checkpoint` (a directory), the run's state is written there every
    `config.checkpoint_every` steps and at the end, and a run started on a directory that holds
    one resumes from it (it must be the same run: target, data and config). `progress(step,
    metrics, heads)` is called after each step with the heads' [loss, accuracy] and a function
    giving the heads as they stand. `stop_after` ends the run after that many steps of this
    call (an interruption, for tests). With `mesh` (data=N), each batch is split over its
    devices (`state.on_mesh`)."""
    t = check_features(target, data)
    vocab = target.config.vocab_size
    own = config.head == "own"
    if not own and config.subset > vocab:
        raise TrainError(f"subset must be in [1, {vocab}], got {config.subset}")
    ids = (np.arange(vocab, dtype=np.int32) if own
           else draft_vocabulary(data.sequences, config.subset, vocab))
    index = np.full(vocab, -1, np.int32)
    index[ids] = np.arange(len(ids), dtype=np.int32)
    targets = labels(data, config.heads, index)
    if not (targets >= 0).any():
        raise TrainError(f"no position to train on: no sequence has {config.heads + 1} "
                         f"generated tokens after a position")
    hc = heads_math.HeadsConfig(num_heads=config.heads, num_blocks=config.blocks,
                                hidden_size=target.config.d_model, vocab_size=vocab,
                                subset_size=len(ids), head=config.head)
    start = heads_math.init_heads(hc, target, token_ids=ids, seed=config.seed)
    trainable = {"blocks": start.params["blocks"]}
    if own:
        trainable["lm_heads"] = start.params["lm_heads"]
    frozen = {} if own else {"proj": projection(target, ids)}
    frozen = on_mesh(frozen, mesh, config)

    def batch_of(rows, w, _):
        return {"final": np.asarray(data.final[rows, :w], np.float32),
                "labels": targets[rows, :w]}

    def heads(params):
        return dataclasses.replace(start, params=dict(start.params, **params),
                                   target=target_identity(target, ids))

    return heads(run_steps(config, data.sequences.length, t, batch_of,
                           functools.partial(_step, hc, config, frozen=frozen), trainable,
                           _run_key(target, data, config), checkpoint, progress, stop_after,
                           model_of=heads, mesh=mesh))


def _run_key(target: Model, data: Features, config: TrainConfig) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(["medusa", target.name, str(target.config), key_settings(config)],
                        sort_keys=True).encode())
    for array in (data.sequences.tokens, data.sequences.length, data.sequences.prompt_length):
        h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()[:16]


# -- The tree -----------------------------------------------------------------------------------

def rank_accuracy(heads: heads_math.Heads, target: Model, data: Features, ranks: int = 10,
                  batch: int = 256) -> np.ndarray:
    """[K, R]: how often head k's r-th most likely token is the token it predicts (s + 2 + k),
    over the positions of `data` (`eagle3.features` of continuations the heads never trained
    on) where that token is a generated one. A token outside the heads' ids is a miss at every
    rank. R is `ranks`, or the heads' ids if fewer."""
    k = heads.config.num_heads
    ranks = min(ranks, heads.config.subset_size)
    vocab = target.config.vocab_size
    wanted = labels(data, k, np.arange(vocab, dtype=np.int32)).reshape(-1, k)    # token ids
    states = np.asarray(data.final, np.float32).reshape(-1, data.final.shape[-1])
    keep = (wanted >= 0).any(axis=1)
    wanted, states = wanted[keep], states[keep]
    if not len(wanted):
        raise TrainError("no position to measure the heads on: the held-out continuations "
                         f"hold no {k + 1} generated tokens after a position")
    weights = heads_math.runtime_weights(heads, target)
    ids = np.asarray(heads.token_ids)
    hits = np.zeros((k, ranks))
    for first in range(0, len(wanted), batch):
        logits = heads_math.subset_logits(weights, jnp.asarray(states[first:first + batch]),
                                          kernels=None)         # XLA's: these are no steps
        top = ids[np.asarray(jax.lax.top_k(logits, ranks)[1])]                 # [B, K, R]
        y = wanted[first:first + batch]
        hits += np.sum((top == y[..., None]) & (y[..., None] >= 0), axis=0)
    return hits / np.maximum(np.sum(wanted >= 0, axis=0), 1)[:, None]


def call_costs(target: Model, sizes=(1, 2, 4, 8, 16, 32), context: int = 256,
               repeats: int = 5) -> dict[int, float]:
    """{n: the time of one target call over n tokens (a tree's root and its n - 1 nodes), after
    `context` cached positions, over a one-token call's}, measured here with the kernels
    `generate` uses: the median of `repeats` calls after one that compiles. A causal call
    stands in for the tree's (the same products; only the mask differs)."""
    if not sizes or min(sizes) < 1:
        raise TrainError(f"call sizes must be >= 1, got {list(sizes)}")
    sizes = sorted(set(sizes) | {1})
    config = target.config.replace(kernels=kernels_of())     # as `generate` runs it
    cache = KVCache.init(config, 1, context + sizes[-1]).with_length(jnp.full((1,), context))
    seconds = {}
    call = jax.jit(lambda params, tokens, positions, cache:
                   forward(params, config, tokens, positions, cache)[0])
    for n in sizes:
        tokens = jnp.zeros((1, n), jnp.int32)
        positions = context + jnp.arange(n, dtype=jnp.int32)[None]
        call(target.params, tokens, positions, cache).block_until_ready()
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            call(target.params, tokens, positions, cache).block_until_ready()
            times.append(time.perf_counter() - began)
        seconds[n] = statistics.median(times)
    return {n: round(seconds[n] / seconds[1], 3) for n in sizes}


def verify_cost(nodes: int, costs: dict[int, float]) -> float:
    """A verify call over the root and `nodes` nodes, in one-token calls, from `costs` ({call
    size: cost}, as `call_costs` gives): linear between the sizes there, and past the largest
    along the line through the last two (flat with one size)."""
    n, sizes = nodes + 1, sorted(costs)
    if n <= sizes[0] or len(sizes) == 1:
        return float(costs[sizes[0]] if n <= sizes[0] else costs[sizes[-1]])
    for lo, hi in zip(sizes, sizes[1:]):
        if n <= hi:
            break
    return float(costs[lo] + (n - lo) * (costs[hi] - costs[lo]) / (hi - lo))


def growth(accuracy: np.ndarray, max_nodes: int) -> tuple[list[tuple[int, ...]], list[float]]:
    """The paths best-first growth adds for heads of rank accuracies `accuracy` [K, R]
    (`rank_accuracy`), in its order, at most `max_nodes` of them, and the expected tokens per
    call of each prefix of them: 1 + the sum of its nodes' chances of acceptance (the product
    of their paths' rank accuracies, the heads taken as independent)."""
    accuracy = np.asarray(accuracy, np.float64)
    depth_limit, ranks = accuracy.shape
    if max_nodes < 1:
        raise TrainError(f"a tree needs at least one node, got max_nodes {max_nodes}")
    # The frontier: (chance, path); a path's first child and next sibling join once it is in.
    frontier = [(float(accuracy[0, 0]), (0,))]
    chances, paths, expected = {(): 1.0}, [], [1.0]
    while frontier and len(paths) < max_nodes:
        frontier.sort(key=lambda item: (-item[0], len(item[1]), item[1]))
        chance, path = frontier.pop(0)
        paths.append(path)
        chances[path] = chance
        expected.append(expected[-1] + chance)
        depth, rank = len(path), path[-1]
        if rank + 1 < ranks:
            frontier.append((chances[path[:-1]] * accuracy[depth - 1, rank + 1],
                             path[:-1] + (rank + 1,)))
        if depth < depth_limit:
            frontier.append((chance * accuracy[depth, 0], path + (0,)))
    return paths, expected[1:]


def best_tree(accuracy: np.ndarray, max_nodes: int,
              costs: dict[int, float] | None = None) -> tuple[Tree, float]:
    """(the tree, its expected tokens per call) of at most `max_nodes` nodes for heads of rank
    accuracies `accuracy` [K, R] (`rank_accuracy`): of the trees met in their `growth`, the one
    with the most expected tokens per unit of `verify_cost` (`costs` None: every call costs the
    same, so the largest)."""
    paths, expected = growth(accuracy, max_nodes)
    best = (-1.0, 0)
    for size, tokens in enumerate(expected, start=1):
        per_cost = tokens / (1.0 if costs is None else verify_cost(size, costs))
        if per_cost > best[0] + 1e-12:
            best = (per_cost, size)
    size = best[1]
    return Tree.from_paths(paths[:size]), round(expected[size - 1], 4)


def step_costs(target: Model, heads: heads_math.Heads, paths, prompt,
               new_tokens: int = 64, repeats: int = 3) -> dict[int, float]:
    """{n: the time of a whole Medusa decoding step whose tree is the first n - 1 of `paths`
    (a verify call of n tokens), over an autoregressive step's}, for n = 2 .. len(paths) + 1:
    `generate` at temperature 0 on `prompt`, each tree's run time over its decoding steps, the
    fastest of `repeats` runs after the one that compiles. A whole step is the verify call with
    all that comes with it (the heads, the tree's walk, the loop), which a verify call timed on
    its own (`call_costs`) leaves out; the prompt's prefill is spread over the steps as in any
    run, so make `new_tokens` long beside it."""
    if new_tokens < 2 or repeats < 1 or not paths:
        raise TrainError(f"step costs need a tree, new_tokens >= 2 and repeats >= 1, got "
                         f"{len(paths)} paths, {new_tokens}, {repeats}")
    one = step_seconds(target, prompt, new_tokens, repeats)
    return {n: round(step_seconds(target, prompt, new_tokens, repeats,
                                  Medusa(heads, tree=Tree.from_paths(paths[:n - 1]))) / one, 3)
            for n in range(2, len(paths) + 2)}
