"""Medusa heads (Cai et al. 2024, Medusa-1): extra decoding heads on a frozen target.

Head k (k = 1..K) reads the target's final-normed hidden state h_t at position t and predicts
the token at t + 1 + k, one place further ahead than the target's own LM head:

    z = h_t;  z <- z + SiLU(W_kj z + b_kj)  for each of the head's residual blocks j
    logits_k = W_k z        as published: each head's own full-vocabulary LM head [V, D]

specjax's own variant (`HeadsConfig.head = "subset"`, the shipped SmolLM2 heads) replaces
W_k with one matrix E_S shared by all heads: the rows of the target's own LM head (its tied
embedding, for SmolLM2) for S frequency-ranked token ids, read from the target when the heads
meet it. Why: SmolLM2-135M's LM head is 28M of its 135M parameters, so a full-vocabulary
projection per head costs about a fifth of a target call; with S = 4,096 a head costs 2.7M
multiply-adds (the block is 0.33M), 2% of a target call. A token outside S has draft
probability 0, which token-tree verification handles exactly (the target's residual covers it).

specjax's heads directory (FasterDecoding's layout is `specjax.io.published`):

    config.json        model_type "medusa", num_heads, num_blocks, hidden_size, vocab_size, the
                       projection, the target's identity, and the tree the heads were tuned for
    model.safetensors  medusa_head.{k}.{j}.linear.weight [D, D] (torch's [out, in]) and .bias
                       [D], as in Medusa's own checkpoints (k from 0), and token_ids [S] int32
    README.md          the model card

The subset projection and the target's identity are shared with EAGLE drafters
(`specjax.heads.shared`); the identity is checked when heads meet a target
(`specjax.io.sidecar.check_target`): heads trained for another model are an error, not a slow
run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specjax.heads.shared import full_logits, in_dtype, projection, target_identity
from specjax.model.linear import Kernels, linear
from specjax.model.quant import Int8Weight
from specjax.model.transformer import Model
from specjax.sampling.tree import Tree

MODEL_TYPE = "medusa"


@dataclasses.dataclass(frozen=True)
class HeadsConfig:
    """The static shape of a set of heads (hashable: part of the compiled spec)."""
    num_heads: int          # K: head k predicts the token k + 1 places after the hidden state's
    num_blocks: int         # residual blocks per head
    hidden_size: int        # D, the target's
    vocab_size: int         # the target's id space
    subset_size: int        # S, the token ids the heads may propose
    head: str = "subset"    # "own": each head's LM head (published); "subset": the target's rows

    def __post_init__(self):
        for name in ("num_heads", "num_blocks", "hidden_size", "vocab_size", "subset_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.subset_size > self.vocab_size:
            raise ValueError(f"subset_size {self.subset_size} exceeds vocab_size "
                             f"{self.vocab_size}")
        if self.head not in ("own", "subset"):
            raise ValueError(f"head must be 'own' or 'subset', got {self.head!r}")
        if self.head == "own" and self.subset_size != self.vocab_size:
            raise ValueError("heads with their own LM heads propose every id: subset_size must "
                             "equal vocab_size")


@dataclasses.dataclass(frozen=True)
class Heads:
    """What `specjax.load` returns for a heads directory."""
    config: HeadsConfig
    params: dict                 # {"blocks": [[{"w": [D, D], "b": [D]}] * blocks] * heads},
                                 # + "lm_heads": [[V, D]] * heads for head "own"
    token_ids: np.ndarray        # [S] int32, most frequent first
    target: dict                 # the identity of the target they were trained on
    tree: Tree | None = None     # the tree they were tuned for (the default of method="medusa")
    path: Path | None = None

    @property
    def name(self) -> str:
        return self.path.name if self.path else "random-medusa-heads"


# -- Parameters and the forward pass ------------------------------------------------------------

def init_heads(config: HeadsConfig, target: Model, token_ids=None, seed: int = 0,
               std: float = 0.0, tree: Tree | None = None) -> Heads:
    """New heads for `target`. With std = 0 (Medusa's initialisation) every block is the
    identity, so each head starts as the target's own next-token head on the subset; tests use
    std > 0 for random heads. Heads with their own LM heads (`config.head == "own"`) start
    from the target's."""
    if token_ids is None:
        token_ids = np.arange(config.subset_size)
    token_ids = np.asarray(token_ids, np.int32)
    if token_ids.shape != (config.subset_size,):
        raise ValueError(f"token_ids must have shape ({config.subset_size},), "
                         f"got {token_ids.shape}")
    d = config.hidden_size
    keys = iter(jax.random.split(jax.random.key(seed), 2 * config.num_heads * config.num_blocks))
    blocks = [[{"w": std * jax.random.normal(next(keys), (d, d)),
                "b": std * jax.random.normal(next(keys), (d,))}
               for _ in range(config.num_blocks)] for _ in range(config.num_heads)]
    params = {"blocks": blocks}
    if config.head == "own":
        head = projection(target, token_ids)
        params["lm_heads"] = [head + std * jax.random.normal(jax.random.key(seed + 1 + k),
                                                             head.shape)
                              for k in range(config.num_heads)]
    return Heads(config, params, token_ids, target_identity(target, token_ids), tree)


def runtime_weights(heads: Heads, target: Model, dtype: str = "float32") -> dict:
    """What the compiled step reads, in `dtype` (`generate` passes the target's unless told
    otherwise, `drafter_dtype`): the blocks (`runtime_blocks`), the ids of the logits and the
    head's rows (`proj`: the subset's rows of the target's LM head [S, D], or each head's own
    [K, V, D])."""
    if heads.config.head == "own":
        proj = in_dtype({"proj": jnp.stack(heads.params["lm_heads"])}, dtype)["proj"]
    else:
        proj = projection(target, heads.token_ids, dtype)
    blocks = in_dtype({"blocks": runtime_blocks(heads.params["blocks"])}, dtype)["blocks"]
    return {"blocks": blocks, "ids": jnp.asarray(heads.token_ids), "proj": proj}


def runtime_blocks(blocks: list) -> list:
    """The heads' blocks as `features` reads them: each "w" [out, in], as every matrix the
    model multiplies by (`specjax.model.linear`); `Heads.params` keeps Medusa's [in, out]."""
    return [[dict(block, w=jnp.transpose(block["w"])) for block in head] for head in blocks]


def features(weights: dict, hidden: jax.Array, count: int | None = None, *,
             kernels: Kernels | None) -> jax.Array:
    """The first `count` heads' residual blocks (default all K) on hidden states [..., D]:
    [..., count, D]. The blocks are `runtime_blocks`; `kernels`: the CPU plug-in the products
    use (the target config's `kernels`), None for XLA's."""
    out = []
    for blocks in weights["blocks"][:count]:
        z = hidden
        for block in blocks:
            z = z + jax.nn.silu(linear(z, block["w"], kernels=kernels) + block["b"])  # .D,ED->.E
        out.append(z)
    return jnp.stack(out, axis=-2)


def subset_logits(weights: dict, hidden: jax.Array, count: int | None = None, *,
                  kernels: Kernels | None) -> jax.Array:
    """Hidden states [..., D] -> the first `count` heads' logits over the subset
    [..., count, S], float32 (default all K heads; a tree of depth d needs only d); `kernels`
    as `features`'."""
    z, proj = features(weights, hidden, count, kernels=kernels), weights["proj"]
    if proj.ndim == 3:                              # each head its own LM head [K, V, D]
        return jnp.stack([linear(z[..., k, :], _head(proj, k), out_dtype=jnp.float32,
                                 kernels=kernels)
                          for k in range(z.shape[-2])], axis=-2)          # .KD,KSD->.KS
    return linear(z, proj, out_dtype=jnp.float32, kernels=kernels)        # .KD,SD->.KS


def _head(proj, k: int):
    """Head k's own LM head of the stacked [K, V, D] (an 8-bit one's values and scales)."""
    if isinstance(proj, Int8Weight):
        return type(proj)(proj.values[k], proj.scales[k])
    return proj[k]
