"""EAGLE drafters (Li et al. 2024, 2025): a feature-level draft that reads the target.

The drafter lives beside a frozen target and predicts the target's next *feature*, the vector
its LM head reads, rather than the next token. Pair s of the drafter's own sequence, in slot s
of its KV cache, is (f_{s-1}, x_s): the target's feature at position s - 1 and the token that
follows it, which the target has already chosen (Medusa's heads never see it). The drafter's
output at pair s predicts f_s, whose logits propose x_{s+1}; fed back with a drafted token it
makes the next pair, and so on down a chain or a token tree (`specjax.decoding.eagle`).

Two published architectures, one code path (`DrafterConfig.kind`):

EAGLE-1/2 ("eagle1"; the EAGLE repo's `cnets1.py`). f is the target's final-normed hidden state
(what its LM head reads; the repo passes the base model's `last_hidden_state`, which is after
the final norm), and the drafter's output goes to the target's own LM head as it is:

    z_s  = W_fc [E x_s ; f_{s-1}] + b_fc                  E: the target's embeddings
    f'_s = one Llama decoder layer on z_s, whose attention reads z_s without an input norm
    logits of x_{s+1} = W_head f'_s                        the target's LM head

EAGLE-3 ("eagle3"; the repo's `cnets.py`, SpecForge, vllm-project/speculators). f is three of
the target's residual streams, after `taps` of its layers ([l ; m ; h], 3D wide), reduced once
where the target's feature enters; the drafter's own outputs, fed back, are D wide:

    g_{s-1} = W_fc [l ; m ; h]_{s-1}                       (no bias) only for the target's f
    a_s  = [norm_e(E x_s) ; norm_h(g_{s-1})]               attention reads 2D: q/k/v are [., 2D]
    r_s  = g_{s-1} + attention(a_s)                        the residual is the feature itself
                                                           (norm_h(g) with norm_before_residual)
    f'_s = r_s + MLP(norm(r_s))
    logits over its draft vocabulary = W_lm norm(f'_s)     its own head and norm; draft id i is
                                                           target id i + d2t[i]

Published drafters never see the pair in slot 0 (nothing precedes the first token): their
cache reads slot 0 only from slot 0 itself (`KVCache.first`).

specjax's own variants, measured on a CPU, are options of the same code (docs/methods.md):
- `head="subset"`: logits over S frequency-ranked ids through the target's own LM-head rows for
  them (`specjax.heads.shared.projection`), as for Medusa heads: SmolLM2's full LM head is a
  fifth of a target call, which a drafter that runs once per depth cannot pay. A token outside
  the ids has draft probability 0: a miss, never an error.
- `style="specjax"` (EAGLE-1 only; the shipped SmolLM2 drafter): the fusion reads
  [f ; E x], the layer keeps its input norm, and the output goes through a norm of the
  drafter's own before the head; that normed vector is also what is fed back.

An EAGLE checkpoint in specjax's directory layout, or in the published ones, is read and
written by `specjax.io.eagle`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specjax.heads.shared import full_logits, in_dtype, projection, target_identity
from specjax.model.cache import KVCache, TreeAttention
from specjax.model.config import ModelConfig
from specjax.model.layers import lookup, rms_norm
from specjax.model.linear import linear
from specjax.model.params import init_params, layer_params, layer_shapes, stack_layers
from specjax.model.transformer import Model, decoder_layers, final_norm
from specjax.sampling.tree import DynamicTree, Tree

__all__ = ["HEADS", "KINDS", "MODEL_TYPE", "STYLES", "Drafter", "DrafterConfig",
           "default_taps", "draft_features", "draft_logits", "embedding", "from_target",
           "full_logits", "init_drafter", "param_shapes", "resolve_taps", "runtime_weights",
           "with_dtype"]

MODEL_TYPE = "eagle"
KINDS = ("eagle1", "eagle3")
HEADS = ("target", "subset", "own")
STYLES = ("published", "specjax")


@dataclasses.dataclass(frozen=True)
class DrafterConfig:
    """The static shape of a drafter (hashable: part of the compiled spec)."""
    layer: ModelConfig      # its decoder layer: a Llama config with one layer (D its width)
    subset_size: int        # S, how many token ids it may propose (its logits' width)
    kind: str = "eagle1"    # "eagle1" (EAGLE-1/2) or "eagle3"
    head: str = "subset"    # "target": the target's LM head (all V ids); "subset": its rows for
                            # S ids; "own": the drafter's lm_head over its draft vocabulary
    style: str = "published"   # EAGLE-1's layout: "published", or "specjax" (module docstring)
    taps: tuple[int, ...] = ()  # EAGLE-3: the target's layer counts whose outputs it reads
    feature_size: int = 0       # EAGLE-3: the target's width (0: the drafter's D)
    norm_before_residual: bool = False   # EAGLE-3, speculators' option
    own_embeddings: bool = False    # the checkpoint carries embed_tokens (else the target's)
    # EAGLE-3 whose checkpoint names no taps: the EAGLE repo's default, set when it meets its
    # target (`resolve_taps`)
    defer_taps: bool = False

    def __post_init__(self):
        if self.layer.n_layers != 1:
            raise ValueError(f"an EAGLE drafter has one decoder layer, got {self.layer.n_layers}")
        if self.layer.arch != "llama":
            raise ValueError(f"EAGLE drafters are implemented for Llama-family targets, "
                             f"not {self.layer.arch!r}")
        for name, allowed in (("kind", KINDS), ("head", HEADS), ("style", STYLES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        s = self.subset_size
        if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= self.layer.vocab_size:
            raise ValueError(f"subset_size must be an integer in [1, {self.layer.vocab_size}], "
                             f"got {s!r}")
        if self.head == "target" and s != self.layer.vocab_size:
            raise ValueError("a drafter on the target's LM head proposes every id: subset_size "
                             f"must be {self.layer.vocab_size}, got {s}")
        t = self.taps
        if not isinstance(t, tuple) or any(isinstance(n, bool) or not isinstance(n, int)
                                           for n in t) or list(t) != sorted(set(t)) or \
                any(n < 0 for n in t):
            raise ValueError(f"taps must be increasing layer counts >= 0, got {t!r}")
        if self.kind == "eagle3":
            if not t and not self.defer_taps:
                raise ValueError("an EAGLE-3 drafter reads the target's states after some of "
                                 "its layers: taps must not be empty")
            if self.style != "published" or self.head == "target":
                raise ValueError("an EAGLE-3 drafter has its own head (head 'own' or "
                                 "'subset') and the published style")
        elif t or self.norm_before_residual or self.feature_size or self.defer_taps:
            raise ValueError("taps, feature_size and norm_before_residual are EAGLE-3's")
        if self.head == "own" and self.kind != "eagle3":
            raise ValueError("head 'own' is EAGLE-3's; EAGLE-1 predicts through the target's")

    @property
    def hidden_size(self) -> int:
        return self.layer.d_model

    @property
    def target_width(self) -> int:
        """The width of one of the target's states this drafter reads."""
        return self.feature_size or self.hidden_size

    @property
    def first_slot(self) -> int:
        """`KVCache.first` of its cache: published drafters never read the pair in slot 0."""
        return 0 if self.style == "specjax" else 1

    @classmethod
    def for_target(cls, target_config: ModelConfig, subset_size: int | None = None,
                   kind: str = "eagle1", head: str | None = None, style: str = "published",
                   taps: tuple[int, ...] | None = None,
                   norm_before_residual: bool = False) -> "DrafterConfig":
        """A drafter of the target's layer shape. EAGLE-3's taps default as the EAGLE repo's
        (`default_taps`); head defaults to "target" for EAGLE-1 and "own" for EAGLE-3."""
        if kind == "eagle3":
            taps = default_taps(target_config.n_layers) if taps is None else tuple(taps)
            if max(taps) >= target_config.n_layers:
                raise ValueError(f"taps {taps} reach past the target's "
                                 f"{target_config.n_layers} layers")
        head = head or ("own" if kind == "eagle3" else "target")
        size = target_config.vocab_size if subset_size is None else subset_size
        return cls(layer_config(target_config), size, kind, head, style, taps or (),
                   norm_before_residual=norm_before_residual)


def default_taps(n_layers: int) -> tuple[int, ...]:
    """EAGLE-3's taps when a checkpoint names none, as the EAGLE repo and speculators choose
    them: the inputs of layers 2, L // 2 and L - 3, i.e. the states after that many layers.
    A target too shallow for three distinct ones is an error (name them instead)."""
    taps = tuple(sorted({2, n_layers // 2, n_layers - 3}))
    if len(taps) != 3 or taps[0] < 0 or taps[-1] >= n_layers:
        raise ValueError(f"a {n_layers}-layer target has no three distinct default EAGLE-3 "
                         f"taps (2, L // 2, L - 3); name them (eagle_aux_hidden_state_layer_ids)")
    return taps


def resolve_taps(drafter: "Drafter", target_config: ModelConfig) -> "Drafter":
    """`drafter` with its taps set for its target: the EAGLE repo's default where its
    checkpoint named none (`default_taps`), unchanged otherwise."""
    if not drafter.config.defer_taps:
        return drafter
    config = dataclasses.replace(drafter.config, taps=default_taps(target_config.n_layers),
                                 defer_taps=False)
    return dataclasses.replace(drafter, config=config)


def with_dtype(drafter: "Drafter", dtype: str) -> "Drafter":
    """`drafter` with its weights, activations and cache in `dtype` ("float32", "bfloat16",
    "int8": 8-bit matrices, float32 activations, or "q8_0": those quantised too), itself when
    they are. `generate` gives it its target's dtype unless told otherwise (`drafter_dtype`)."""
    if drafter.config.layer.dtype == dtype:
        return drafter
    layer = drafter.config.layer.replace(dtype=dtype)
    return dataclasses.replace(drafter, config=dataclasses.replace(drafter.config, layer=layer),
                               params=in_dtype(drafter.params, dtype))


def layer_config(config: ModelConfig) -> ModelConfig:
    """One decoder layer of `config`'s shape, float32, with nothing that names a model."""
    return dataclasses.replace(config, n_layers=1, dtype="float32", model_type="",
                               bos_token_id=None, eos_token_ids=())


@dataclasses.dataclass(frozen=True)
class Drafter:
    """What `specjax.load` returns for an EAGLE directory."""
    config: DrafterConfig
    params: dict                 # "fc" {"w": [D, 2D] (+ "b": [D]), EAGLE-3 [D, nD_t]},
                                 # "layers": [layer] (EAGLE-3's wq/wk/wv read 2D, + hidden_norm),
                                 # "final_norm" (specjax style, EAGLE-3), "lm_head" [S, D]
                                 # (head "own"), "embed" [V, D] (own_embeddings)
    token_ids: np.ndarray        # [S] int32: the target id of each of its logits
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
                 kind: str = "eagle1", head: str | None = None, style: str = "published",
                 taps: tuple[int, ...] | None = None,
                 norm_before_residual: bool = False) -> Drafter:
    """A new drafter for `target`: normal(0, std) matrices, zero biases, unit norms.

    The fusion starts near a pass-through of the target's feature (the identity on its half,
    or for EAGLE-3 the mean of the taps) plus `std` noise, so an untrained drafter passes the
    feature through one random layer rather than through noise. `token_ids` (or the first
    `subset_size` ids) are the ids it may propose: the subset's for head "subset", the draft
    vocabulary for head "own"; head "target" proposes all."""
    v = target.config.vocab_size
    head = head or ("own" if kind == "eagle3" else ("subset" if token_ids is not None
                                                    or subset_size is not None else "target"))
    if token_ids is None:
        token_ids = np.arange(v if head == "target" else subset_size or v)
    token_ids = np.asarray(token_ids, np.int32)
    config = DrafterConfig.for_target(target.config, int(token_ids.shape[0]), kind, head,
                                      style, taps, norm_before_residual)
    key_fc, key_layer, key_head = jax.random.split(jax.random.key(seed), 3)
    d = config.hidden_size
    base = init_params(config.layer, key_layer, std=std)
    layer = dict(layer_params(base["layers"], 0))
    params = {"layers": [layer]}
    if kind == "eagle3":
        n = len(config.taps)
        params["fc"] = {"w": jnp.tile(jnp.eye(d), (1, n)) / n
                        + std * jax.random.normal(key_fc, (d, n * d))}
        k_q, k_k, k_v = jax.random.split(key_layer, 3)
        for name, key in (("wq", k_q), ("wk", k_k), ("wv", k_v)):
            heads, h, _ = layer[name].shape
            layer[name] = std * jax.random.normal(key, (heads, h, 2 * d))
        layer["hidden_norm"] = {"scale": jnp.ones((d,))}
        params["final_norm"] = base["final_norm"]
        if head == "own":
            params["lm_head"] = std * jax.random.normal(key_head, (len(token_ids), d))
    else:
        half = [jnp.eye(d), jnp.zeros((d, d))]
        eye = jnp.concatenate(half if style == "specjax" else half[::-1], axis=1)
        params["fc"] = {"w": eye + std * jax.random.normal(key_fc, (d, 2 * d)),
                        "b": jnp.zeros((d,))}
        if style == "specjax":
            params["final_norm"] = base["final_norm"]
        else:
            del layer["attn_norm"]
    return Drafter(config, params, token_ids, target_identity(target, token_ids), tree)


def param_shapes(config: DrafterConfig) -> dict:
    """The shape of every parameter of a drafter of `config` (as `Drafter.params` holds them)."""
    d, v = config.hidden_size, config.layer.vocab_size
    layer = dict(layer_shapes(config.layer)["layer"])
    if config.kind == "eagle3":
        for name in ("wq", "wk", "wv"):
            heads, h, _ = layer[name]
            layer[name] = (heads, h, 2 * d)
        layer["hidden_norm"] = {"scale": (d,)}
        fc = {"w": (d, len(config.taps or (0, 0, 0)) * config.target_width)}
    else:
        fc = {"w": (d, 2 * d), "b": (d,)}
        if config.style == "published":
            del layer["attn_norm"]
    shapes = {"fc": fc, "layers": [layer]}
    if config.kind == "eagle3" or config.style == "specjax":
        shapes["final_norm"] = {"scale": (d,)}
    if config.head == "own":
        shapes["lm_head"] = (config.subset_size, d)
    if config.own_embeddings:
        shapes["embed"] = (v, d)
    return shapes


def embedding(weights: dict, target_weights: dict) -> jax.Array:
    """The embeddings the drafter reads tokens through: its own if it carries them, else the
    target's [V, D]."""
    return weights["embed"] if "embed" in weights else target_weights["embed"]


def runtime_weights(drafter: Drafter, target: Model) -> dict:
    """What the compiled step reads: the drafter's weights, the target ids of its logits and
    the head's rows `proj` [S, D] (the target's LM head, its rows for the subset, or the
    drafter's own lm_head), all in the drafter's dtype (`with_dtype`)."""
    config = drafter.config
    if config.head == "own":
        proj = drafter.params["lm_head"]
    else:
        proj = projection(target, drafter.token_ids, config.layer.dtype)
    weights = {k: v for k, v in drafter.params.items() if k != "lm_head"}
    return dict(weights, ids=jnp.asarray(drafter.token_ids), proj=proj)


def from_target(weights: dict, config: DrafterConfig, features: jax.Array) -> jax.Array:
    """The target's features as the drafter reads them, [..., D]: EAGLE-1's final-normed
    hidden states as they are, or EAGLE-3's taps [..., n * D_t] reduced by fc."""
    if config.kind != "eagle3":
        return features
    return linear(features.astype(config.layer.compute_dtype), weights["fc"]["w"],
                  kernels=config.layer.kernels)                                # .E,DE->.D


def draft_features(weights: dict, config: DrafterConfig, embed, features, tokens, positions,
                   cache: KVCache | None = None, tree: TreeAttention | None = None,
                   prefill: bool = False) -> tuple[jax.Array, KVCache | None]:
    """The drafter on pairs: the target's (or its own predicted) features [B, T, D] and the
    tokens after them [B, T] at drafter slots `positions` [B, T] -> its outputs [B, T, D] (what
    `draft_logits` reads and what is fed back) and the drafter's cache (None: the pairs attend
    among themselves, causally, as in training). `embed`: `embedding(...)`, [V, D]. `prefill`:
    the pairs are a prompt's (`transformer.hidden_states`' `prefill`)."""
    layer = weights["layers"][0]
    eps = config.layer.norm_eps
    dtype = config.layer.compute_dtype
    e = lookup(embed, tokens).astype(dtype)                                   # [B, T, D]
    features = features.astype(dtype)
    if config.kind == "eagle3":
        hidden = rms_norm(features, layer["hidden_norm"]["scale"], eps)
        attn_input = jnp.concatenate([rms_norm(e, layer["attn_norm"]["scale"], eps), hidden],
                                     axis=-1)                                 # [B, T, 2D]
        x = hidden if config.norm_before_residual else features
    else:
        pair = [features, e] if config.style == "specjax" else [e, features]
        x = linear(jnp.concatenate(pair, axis=-1), weights["fc"]["w"], prefill=prefill,
                   kernels=config.layer.kernels) + weights["fc"]["b"]              # BTE,DE->BTD
        attn_input = None if config.style == "specjax" else x   # published: no input norm
    # Its one layer as a stack of one (a reshape, not a copy) for the model's decoder.
    x, cache = decoder_layers(stack_layers(weights["layers"]), config.layer, x, positions, cache,
                              tree, attn_input, prefill)
    if config.style == "specjax":
        x = final_norm(weights, config.layer, x)
    return x, cache


def draft_logits(weights: dict, config: DrafterConfig, out: jax.Array) -> jax.Array:
    """The drafter's outputs [..., D] -> its logits over `weights["ids"]` [..., S], float32
    (EAGLE-3 normalises first: its norm sits before the head, not on what is fed back)."""
    if config.kind == "eagle3":
        out = final_norm(weights, config.layer, out)
    return linear(out, weights["proj"], out_dtype=jnp.float32,
                  kernels=config.layer.kernels)                                # .D,SD->.S
