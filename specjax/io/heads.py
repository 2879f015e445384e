"""Medusa heads on disk: the directory `specjax.save_heads` writes and `specjax.load` reads,
and the check that heads meet the target they were trained on.

The layout (config.json, model.safetensors, README.md) and the target's identity are described
in `specjax.heads.medusa`; the math lives there, the files here.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from specjax.heads.medusa import (
    MODEL_TYPE,
    PROJECTION,
    TARGET_FIELDS,
    Heads,
    HeadsConfig,
    target_identity,
    tokenizer_digest,
)
from specjax.io.errors import CheckpointError
from specjax.model.transformer import Model
from specjax.sampling.tree import Tree, TreeError

CHECKSUM_RTOL = 1e-3     # float32 vs bfloat16 copies of one target agree to ~1e-5


def check_target(heads, target: Model) -> None:
    """Raises CheckpointError (naming the heads' config.json) if `heads` (Medusa heads or an
    EAGLE drafter: both carry the same identity) were trained on a model other than
    `target`."""
    where = str(heads.path / "config.json") if heads.path else heads.name
    expected = heads.target
    trained_on = expected.get("name", "another model")
    config = {f: getattr(target.config, f) for f in TARGET_FIELDS}
    diff = [f for f in TARGET_FIELDS if expected["config"].get(f) != config[f]]
    if diff:
        f = diff[0]
        raise CheckpointError(f"{where}: it was trained on {trained_on}, whose {f} is "
                              f"{expected['config'].get(f)!r}; {target.name} has {config[f]!r}")
    if heads.config.hidden_size != target.config.d_model:
        raise CheckpointError(f"{where}: hidden_size {heads.config.hidden_size} != the target's "
                              f"d_model {target.config.d_model}")
    digest = tokenizer_digest(target.tokenizer)
    if expected.get("tokenizer_sha256") and digest and digest != expected["tokenizer_sha256"]:
        raise CheckpointError(f"{where}: it was trained on {trained_on}, whose "
                              f"tokenizer differs from {target.name}'s")
    if int(np.max(heads.token_ids)) >= target.config.vocab_size:
        raise CheckpointError(f"{where}: token_ids reach {int(np.max(heads.token_ids))}, outside "
                              f"{target.name}'s vocabulary ({target.config.vocab_size})")
    checksum = expected.get("projection_mean_abs")
    if checksum is not None:
        mine = target_identity(target, heads.token_ids)["projection_mean_abs"]
        if abs(mine - checksum) > CHECKSUM_RTOL * abs(checksum):
            raise CheckpointError(f"{where}: it was trained on {trained_on}; "
                                  f"{target.name} has the same shape but other LM-head weights "
                                  f"(mean |w| {mine:.6g}, expected {checksum:.6g})")


def read_tensors(weights: Path) -> dict[str, np.ndarray]:
    """Every tensor of a heads' or drafter's safetensors file; a CheckpointError naming it if
    it cannot be read."""
    try:
        with safe_open(weights, framework="numpy") as reader:
            return {name: reader.get_tensor(name) for name in reader.keys()}
    except (SafetensorError, OSError, ValueError, TypeError) as e:
        raise CheckpointError(f"{weights}: corrupt or unreadable safetensors file ({e})") from None


def is_heads_dir(path: Path) -> bool:
    try:
        return json.loads((path / "config.json").read_text()).get("model_type") == MODEL_TYPE
    except (OSError, ValueError, RecursionError, AttributeError):  # the model loader reports it
        return False


def save_heads(heads: Heads, directory: str | Path, extra: dict | None = None) -> Path:
    """Writes `heads` as a directory (`load_heads` reads it back exactly: float32)."""
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
    tensors = read_tensors(weights)
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
