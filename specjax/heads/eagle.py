"""EAGLE drafters (Li et al. 2024, EAGLE-1): a feature-level draft that reads the target.

The drafter lives beside a frozen target and predicts the target's next *feature* (its
final-normed hidden state, the vector its LM head reads) rather than the next token. Slot s of
the drafter's own sequence holds the pair (f_{s-1}, x_s): the target's feature at position
s - 1 and the token that follows it, which the target has already chosen (Medusa's heads never
see it). Slot 0 pairs x_0 with a zero feature.

    z_s   = W_fc [f_{s-1} ; E x_s] + b_fc                   fuse (E: the target's embeddings)
    z_s   = one decoder layer of the target's architecture  its own small KV cache over slots
    f'_s  = norm(z_s)                                       the predicted feature f_s
    logits of x_{s+1} = E_S f'_s                           over S, a subset of the vocabulary

Drafting runs at the feature level: the predicted f'_s and a drafted token x_{s+1} make the
pair of slot s + 1, and so on down a chain or a token tree (`specjax.decoding.eagle`).

The projection E_S is the target's own LM-head rows for S frequency-ranked token ids, read from
the target when the drafter meets it, as for Medusa heads (`specjax.heads.medusa`): SmolLM2's
full LM head is a fifth of a target call, which a drafter that runs once per depth cannot pay.
A token outside S has draft probability 0: a miss, never an error.

Two departures from the paper, both measured choices of this project: features are the
final-normed hidden states (what the LM head reads, and what the Medusa stage caches), so the
drafter ends in a norm of its own; and the decoder layer keeps its input norm.

EAGLE-3's fused features (Li et al. 2025) are an option (`DrafterConfig.fused_layers`): the
target's feature is then the residual stream after a low, a middle and a high layer,
concatenated, [l ; m ; h], and one more projection reduces it to D before the fusion,

    f_{s-1} = W_reduce [l ; m ; h]_{s-1}                    only where the target's feature enters

while the drafter's own predicted features, fed back down a chain or tree, stay D wide.

An EAGLE checkpoint is a directory:

    config.json        model_type "eagle", hidden_size, vocab_size, the projection, the target's
                       identity, the layer's shape (the target's), the default tree (a list of
                       paths, or {"dynamic": [depth, top_k, total_tokens]} for EAGLE-2's),
                       fused_layers (EAGLE-3's tapped layer counts; [] or absent: none)
    model.safetensors  fc.weight [D, 2D] (torch's [out, in]), fc.bias [D], the layer as
                       layers.0.* in the Llama checkpoint names, norm.weight [D], token_ids [S];
                       with fused layers, reduce.weight [D, len(fused_layers) * D]
    README.md          the model card
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specjax.heads.shared import full_logits, projection, target_identity
from specjax.model.cache import KVCache, TreeAttention
from specjax.model.config import ModelConfig
from specjax.model.transformer import Model, decoder_layers, final_norm, init_params
from specjax.sampling.tree import DynamicTree, Tree

__all__ = ["MODEL_TYPE", "Drafter", "DrafterConfig", "draft_features", "from_target",
           "full_logits", "init_drafter", "runtime_weights", "subset_logits"]

MODEL_TYPE = "eagle"


@dataclasses.dataclass(frozen=True)
class DrafterConfig:
    """The static shape of a drafter (hashable: part of the compiled spec)."""
    layer: ModelConfig      # its decoder layer's shape: the target's config with one layer
    subset_size: int        # S, the token ids it may propose
    # EAGLE-3: the target's residual stream after these many of its layers, concatenated and
    # reduced, instead of its final-normed hidden state; () for EAGLE-1's feature.
    fused_layers: tuple[int, ...] = ()

    def __post_init__(self):
        if self.layer.n_layers != 1:
            raise ValueError(f"an EAGLE drafter has one decoder layer, got {self.layer.n_layers}")
        if self.layer.arch != "llama":
            raise ValueError(f"EAGLE drafters are implemented for Llama-family targets, "
                             f"not {self.layer.arch!r}")
        s = self.subset_size
        if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= self.layer.vocab_size:
            raise ValueError(f"subset_size must be an integer in [1, {self.layer.vocab_size}], "
                             f"got {s!r}")
        f = self.fused_layers
        if not isinstance(f, tuple) or any(isinstance(n, bool) or not isinstance(n, int)
                                           for n in f) or list(f) != sorted(set(f)) or \
                any(n < 1 for n in f):
            raise ValueError(f"fused_layers must be increasing layer counts >= 1, got {f!r}")

    @property
    def hidden_size(self) -> int:
        return self.layer.d_model

    @classmethod
    def for_target(cls, target_config: ModelConfig, subset_size: int,
                   fused_layers: tuple[int, ...] = ()) -> "DrafterConfig":
        """The target's layer shape; the drafter's weights are float32 whatever the target's."""
        if fused_layers and max(fused_layers) > target_config.n_layers:
            raise ValueError(f"fused_layers {fused_layers} go past the target's "
                             f"{target_config.n_layers} layers")
        return cls(layer_config(target_config), subset_size, tuple(fused_layers))


def layer_config(config: ModelConfig) -> ModelConfig:
    """One decoder layer of `config`'s shape, float32, with nothing that names a model."""
    return dataclasses.replace(config, n_layers=1, dtype="float32", model_type="",
                               bos_token_id=None, eos_token_ids=())


@dataclasses.dataclass(frozen=True)
class Drafter:
    """What `specjax.load` returns for an EAGLE directory."""
    config: DrafterConfig
    params: dict                 # {"fc": {"w": [D, 2D], "b": [D]}, "layers": [layer],
                                 #  "final_norm": {"scale": [D]}}, + "reduce": {"w": [D, nD]}
    token_ids: np.ndarray        # [S] int32, most frequent first
    target: dict                 # the identity of the target it was trained on
    tree: Tree | DynamicTree | None = None   # the tree it was tuned for (method="eagle"'s default)
    path: Path | None = None
    # The default when a call samples (any row at temperature > 0), if it was tuned apart;
    # otherwise `tree` serves both. Greedy and sampled calls are different programs already
    # (their default candidate schemes differ), so the choice costs no recompile.
    sampled_tree: Tree | DynamicTree | None = None

    @property
    def name(self) -> str:
        return self.path.name if self.path else "random-eagle-drafter"


def init_drafter(target: Model, subset_size: int | None = None, token_ids=None, seed: int = 0,
                 std: float = 0.02, tree: Tree | DynamicTree | None = None,
                 fused_layers: tuple[int, ...] = ()) -> Drafter:
    """A new drafter for `target`: normal(0, std) matrices, zero biases, unit norms. The fusion
    starts as the identity on the feature half plus `std` noise, so that an untrained drafter
    passes the target's feature through one random layer rather than through noise; with
    `fused_layers` (EAGLE-3), the reduction starts as the mean of the tapped states plus noise."""
    if token_ids is None:
        token_ids = np.arange(subset_size or target.config.vocab_size)
    token_ids = np.asarray(token_ids, np.int32)
    config = DrafterConfig.for_target(target.config, int(token_ids.shape[0]), fused_layers)
    key_fc, key_layer, key_reduce = jax.random.split(jax.random.key(seed), 3)
    d = config.hidden_size
    base = init_params(config.layer, key_layer, std=std)
    eye = jnp.concatenate([jnp.eye(d), jnp.zeros((d, d))], axis=1)
    params = {"fc": {"w": eye + std * jax.random.normal(key_fc, (d, 2 * d)),
                     "b": jnp.zeros((d,))},
              "layers": base["layers"], "final_norm": base["final_norm"]}
    if config.fused_layers:
        n = len(config.fused_layers)
        params["reduce"] = {"w": jnp.tile(jnp.eye(d), (1, n)) / n
                            + std * jax.random.normal(key_reduce, (d, n * d))}
    return Drafter(config, params, token_ids, target_identity(target, token_ids), tree)


def runtime_weights(drafter: Drafter, target: Model) -> dict:
    """What the compiled step reads: the drafter's weights, the subset's ids and projection
    rows (the target's), and nothing else (the embeddings come from the target's weights)."""
    return dict(drafter.params, ids=jnp.asarray(drafter.token_ids),
                proj=projection(target, drafter.token_ids))


def from_target(weights: dict, config: DrafterConfig, features: jax.Array) -> jax.Array:
    """The target's features as the drafter reads them, [..., D]: its final-normed hidden
    states as they are, or (EAGLE-3) its tapped states [..., len(fused_layers) * D] reduced."""
    if not config.fused_layers:
        return features
    return jnp.einsum("...E,DE->...D", features.astype(jnp.float32), weights["reduce"]["w"])


def draft_features(weights: dict, config: DrafterConfig, embed, features, tokens, positions,
                   cache: KVCache | None = None,
                   tree: TreeAttention | None = None) -> tuple[jax.Array, KVCache | None]:
    """The drafter on pairs: the target's (or its own predicted) features [B, T, D] and the
    tokens after them [B, T] at drafter slots `positions` [B, T] -> the predicted next features
    [B, T, D] and the drafter's cache (None: the pairs attend among themselves, causally, as in
    training). `embed` is the target's embedding matrix [V, D]."""
    fused = jnp.concatenate([features.astype(embed.dtype), embed[tokens]], axis=-1)
    x = jnp.einsum("BTE,DE->BTD", fused, weights["fc"]["w"]) + weights["fc"]["b"]
    x, cache = decoder_layers(weights["layers"], config.layer, x, positions, cache, tree)
    return final_norm(weights, config.layer, x), cache


def subset_logits(weights: dict, features: jax.Array) -> jax.Array:
    """Predicted features [..., D] -> logits over the subset [..., S], float32."""
    return jnp.einsum("...D,SD->...S", features, weights["proj"],
                      preferred_element_type=jnp.float32).astype(jnp.float32)
