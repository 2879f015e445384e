"""Medusa heads (Cai et al. 2024, Medusa-1): extra decoding heads on a frozen target.

Head k (k = 1..K) reads the target's final-normed hidden state h_t at position t and predicts
the token at t + 1 + k, one place further ahead than the target's own LM head:

    z = h_t;  z <- z + SiLU(W_kj z + b_kj)  for each of the head's residual blocks j
    logits_k = E_S z        over S, a frequency-ranked subset of the vocabulary

The projection E_S is not a new matrix: it is the rows of the target's own LM head (its tied
embedding, for SmolLM2) for the S token ids the heads may propose, read from the target when the
heads meet it. Why: SmolLM2-135M's LM head is 28M of its 135M parameters, so a full-vocabulary
projection per head would cost about a fifth of a target call; with S = 4,096 a head costs
2.7M multiply-adds (the block is 0.33M), 2% of a target call. A token outside S has draft
probability 0, which token-tree verification handles exactly (the target's residual covers it).

A heads checkpoint is a directory:

    config.json        model_type "medusa", num_heads, num_blocks, hidden_size, vocab_size, the
                       projection, the target's identity, and the tree the heads were tuned for
    model.safetensors  medusa_head.{k}.{j}.linear.weight [D, D] (torch's [out, in]) and .bias
                       [D], as in Medusa's own checkpoints (k from 0), and token_ids [S] int32
    README.md          the model card

The target's identity (its architecture fields, a digest of its tokenizer's vocabulary and the
mean absolute value of the projection rows) is checked when heads meet a target
(`check_target`): heads trained for another model are an error, not a slow run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specjax.checkpoint import CheckpointError, Model
from specjax.tree import Tree, TreeError

MODEL_TYPE = "medusa"
PROJECTION = "target_lm_head_subset"
# Architecture fields of the target that heads are bound to.
_TARGET_FIELDS = ("arch", "vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads",
                  "head_dim", "d_ff", "tie_embeddings")
_CHECKSUM_RTOL = 1e-3     # float32 vs bfloat16 copies of one target agree to ~1e-5


@dataclasses.dataclass(frozen=True)
class HeadsConfig:
    """The static shape of a set of heads (hashable: part of the compiled spec)."""
    num_heads: int          # K: head k predicts the token k + 1 places after the hidden state's
    num_blocks: int         # residual blocks per head
    hidden_size: int        # D, the target's
    vocab_size: int         # the target's id space
    subset_size: int        # S, the token ids the heads may propose

    def __post_init__(self):
        for name in ("num_heads", "num_blocks", "hidden_size", "vocab_size", "subset_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.subset_size > self.vocab_size:
            raise ValueError(f"subset_size {self.subset_size} exceeds vocab_size "
                             f"{self.vocab_size}")


@dataclasses.dataclass(frozen=True)
class Heads:
    """What `specjax.load` returns for a heads directory."""
    config: HeadsConfig
    params: dict                 # {"blocks": [[{"w": [D, D], "b": [D]}] * blocks] * heads}
    token_ids: np.ndarray        # [S] int32, most frequent first
    target: dict                 # the identity of the target they were trained on
    tree: Tree | None = None     # the tree they were tuned for (the default of method="medusa")
    path: Path | None = None

    @property
    def name(self) -> str:
        return self.path.name if self.path else "random-medusa-heads"


# -- The target's identity ----------------------------------------------------------------------

def tokenizer_digest(tokenizer) -> str | None:
    """sha256 of the tokenizer's vocabulary (token -> id, added tokens included)."""
    if tokenizer is None:
        return None
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    return hashlib.sha256(json.dumps(vocab, sort_keys=True).encode()).hexdigest()


def projection(target: Model, token_ids) -> jax.Array:
    """The target's LM-head rows for `token_ids`: [S, D]."""
    ids = jnp.asarray(token_ids)
    if target.config.tie_embeddings:
        return target.params["embed"][ids]
    return target.params["lm_head"][ids]


def target_identity(target: Model, token_ids) -> dict:
    return {"name": target.name,
            "config": {f: getattr(target.config, f) for f in _TARGET_FIELDS},
            "tokenizer_sha256": tokenizer_digest(target.tokenizer),
            "projection_mean_abs": float(np.mean(np.abs(
                np.asarray(projection(target, token_ids), np.float64))))}


def check_target(heads: Heads, target: Model) -> None:
    """Raises CheckpointError (naming the heads' config.json) if `heads` were trained on a
    model other than `target`."""
    where = str(heads.path / "config.json") if heads.path else heads.name
    expected = heads.target
    trained_on = expected.get("name", "another model")
    config = {f: getattr(target.config, f) for f in _TARGET_FIELDS}
    diff = [f for f in _TARGET_FIELDS if expected["config"].get(f) != config[f]]
    if diff:
        f = diff[0]
        raise CheckpointError(f"{where}: these heads were trained on {trained_on}, whose {f} is "
                              f"{expected['config'].get(f)!r}; {target.name} has {config[f]!r}")
    if heads.config.hidden_size != target.config.d_model:
        raise CheckpointError(f"{where}: hidden_size {heads.config.hidden_size} != the target's "
                              f"d_model {target.config.d_model}")
    digest = tokenizer_digest(target.tokenizer)
    if expected.get("tokenizer_sha256") and digest and digest != expected["tokenizer_sha256"]:
        raise CheckpointError(f"{where}: these heads were trained on {trained_on}, whose "
                              f"tokenizer differs from {target.name}'s")
    if int(np.max(heads.token_ids)) >= target.config.vocab_size:
        raise CheckpointError(f"{where}: token_ids reach {int(np.max(heads.token_ids))}, outside "
                              f"{target.name}'s vocabulary ({target.config.vocab_size})")
    checksum = expected.get("projection_mean_abs")
    if checksum is not None:
        mine = target_identity(target, heads.token_ids)["projection_mean_abs"]
        if abs(mine - checksum) > _CHECKSUM_RTOL * abs(checksum):
            raise CheckpointError(f"{where}: these heads were trained on {trained_on}; "
                                  f"{target.name} has the same shape but other LM-head weights "
                                  f"(mean |w| {mine:.6g}, expected {checksum:.6g})")


# -- Parameters and the forward pass ------------------------------------------------------------

def init_heads(config: HeadsConfig, target: Model, token_ids=None, seed: int = 0,
               std: float = 0.0, tree: Tree | None = None) -> Heads:
    """New heads for `target`. With std = 0 (Medusa's initialisation) every block is the
    identity, so each head starts as the target's own next-token head on the subset; tests use
    std > 0 for random heads."""
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
    return Heads(config, {"blocks": blocks}, token_ids, target_identity(target, token_ids), tree)


def runtime_weights(heads: Heads, target: Model) -> dict:
    """What the compiled step reads: the blocks, the subset's ids and projection rows."""
    return {"blocks": heads.params["blocks"], "ids": jnp.asarray(heads.token_ids),
            "proj": projection(target, heads.token_ids)}


def features(weights: dict, hidden: jax.Array, count: int | None = None) -> jax.Array:
    """The first `count` heads' residual blocks (default all K) on hidden states [..., D]:
    [..., count, D]."""
    out = []
    for blocks in weights["blocks"][:count]:
        z = hidden
        for block in blocks:
            z = z + jax.nn.silu(z @ block["w"] + block["b"])
        out.append(z)
    return jnp.stack(out, axis=-2)


def subset_logits(weights: dict, hidden: jax.Array, count: int | None = None) -> jax.Array:
    """Hidden states [..., D] -> the first `count` heads' logits over the subset
    [..., count, S], float32 (default all K heads; a tree of depth d needs only d)."""
    return jnp.einsum("...KD,SD->...KS", features(weights, hidden, count), weights["proj"],
                      preferred_element_type=jnp.float32).astype(jnp.float32)


def full_logits(weights: dict, sub_logits: jax.Array, vocab: int) -> jax.Array:
    """Subset logits [..., S] -> logits over the vocabulary [..., V], -inf outside the subset."""
    full = jnp.full((*sub_logits.shape[:-1], vocab), -jnp.inf, jnp.float32)
    return full.at[..., weights["ids"]].set(sub_logits)


# -- Checkpoints --------------------------------------------------------------------------------

def is_heads_dir(path: Path) -> bool:
    try:
        return json.loads((path / "config.json").read_text()).get("model_type") == MODEL_TYPE
    except (OSError, ValueError, RecursionError, AttributeError):  # the model loader reports it
        return False


def save_heads(heads: Heads, directory: str | Path, extra: dict | None = None) -> Path:
    """Writes `heads` as a directory (`load_heads` reads it back exactly: float32)."""
    from safetensors.numpy import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {"token_ids": np.ascontiguousarray(heads.token_ids, np.int32)}
    for k, blocks in enumerate(heads.params["blocks"]):
        for j, block in enumerate(blocks):
            name = f"medusa_head.{k}.{j}.linear"
            tensors[f"{name}.weight"] = np.ascontiguousarray(np.asarray(block["w"], np.float32).T)
            tensors[f"{name}.bias"] = np.asarray(block["b"], np.float32)
    weights = directory / "model.safetensors"
    save_file(tensors, str(weights), metadata={"format": "pt"})
    weights.chmod(0o644)
    c = heads.config
    config = {"model_type": MODEL_TYPE, "num_heads": c.num_heads, "num_blocks": c.num_blocks,
              "hidden_size": c.hidden_size, "vocab_size": c.vocab_size,
              "projection": {"type": PROJECTION, "tokens": c.subset_size},
              "target": heads.target,
              "tree": [list(p) for p in heads.tree.paths] if heads.tree is not None else None,
              **(extra or {})}
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory


def load_heads(path: str | Path) -> Heads:
    """Reads a heads directory; every error names the file."""
    from safetensors import SafetensorError, safe_open

    path = Path(path).expanduser()
    file = path / "config.json"
    try:
        raw = json.loads(file.read_text())
        projection_kind = raw["projection"]["type"]
        config = HeadsConfig(num_heads=raw["num_heads"], num_blocks=raw["num_blocks"],
                             hidden_size=raw["hidden_size"], vocab_size=raw["vocab_size"],
                             subset_size=raw["projection"]["tokens"])
        target = raw["target"]
        tree = Tree.from_paths(raw["tree"]) if raw.get("tree") else None
    except OSError as e:
        raise CheckpointError(f"{file}: cannot read ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{file}: not valid JSON ({e})") from None
    except (KeyError, TypeError) as e:
        raise CheckpointError(f"{file}: missing or malformed field {e}") from None
    except (ValueError, TreeError) as e:
        raise CheckpointError(f"{file}: {e}") from None
    if projection_kind != PROJECTION:
        raise CheckpointError(f"{file}: projection type {projection_kind!r} is not supported "
                              f"(only {PROJECTION!r})")
    if tree is not None and tree.max_depth > config.num_heads:
        raise CheckpointError(f"{file}: its tree is {tree.max_depth} deep but there are only "
                              f"{config.num_heads} heads")

    weights = path / "model.safetensors"
    try:
        with safe_open(weights, framework="numpy") as reader:
            tensors = {name: reader.get_tensor(name) for name in reader.keys()}
    except (SafetensorError, OSError, ValueError, TypeError) as e:
        raise CheckpointError(f"{weights}: corrupt or unreadable safetensors file ({e})") from None
    d = config.hidden_size
    expected = {"token_ids": (config.subset_size,)}
    for k in range(config.num_heads):
        for j in range(config.num_blocks):
            expected[f"medusa_head.{k}.{j}.linear.weight"] = (d, d)
            expected[f"medusa_head.{k}.{j}.linear.bias"] = (d,)
    for name, shape in expected.items():
        if name not in tensors:
            raise CheckpointError(f"{weights}: missing tensor {name!r}")
        if tuple(tensors[name].shape) != shape:
            raise CheckpointError(f"{weights}: tensor {name!r} has shape "
                                  f"{tuple(tensors[name].shape)}, expected {shape}")
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        raise CheckpointError(f"{weights}: unexpected tensor(s) {unexpected[:5]}")
    ids = tensors["token_ids"].astype(np.int64)
    if ids.min() < 0 or ids.max() >= config.vocab_size or len(np.unique(ids)) != len(ids):
        raise CheckpointError(f"{weights}: token_ids must be distinct ids in "
                              f"[0, {config.vocab_size})")
    blocks = [[{"w": jnp.asarray(tensors[f"medusa_head.{k}.{j}.linear.weight"].T, jnp.float32),
                "b": jnp.asarray(tensors[f"medusa_head.{k}.{j}.linear.bias"], jnp.float32)}
               for j in range(config.num_blocks)] for k in range(config.num_heads)]
    return Heads(config, {"blocks": blocks}, ids.astype(np.int32), target, tree, path)
