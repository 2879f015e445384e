"""What the files of Medusa heads and EAGLE drafters share (`specjax.io.medusa`,
`specjax.io.eagle`): a directory of config.json and model.safetensors, read by one loader that
names the file in every error; the tree as JSON; and the check that a drafter meets the target
it was trained on (its identity: `specjax.heads.shared`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open

from specjax.heads.shared import PROJECTION, TARGET_FIELDS, target_identity, tokenizer_digest
from specjax.io.errors import CheckpointError
from specjax.model.config import ConfigError
from specjax.model.transformer import Model
from specjax.sampling.tree import DynamicTree, Tree, TreeError

__all__ = ["check_target", "is_sidecar_dir", "json_object", "read_sidecar", "read_tensors",
           "tree_from_json", "tree_to_json"]

CHECKSUM_RTOL = 1e-3     # float32 vs bfloat16 copies of one target agree to ~1e-5


def json_object(file: Path) -> dict:
    """A JSON object read from `file`; a CheckpointError naming it if it is not one."""
    try:
        contents = json.loads(file.read_text())
    except OSError as e:
        raise CheckpointError(f"{file}: cannot read ({e.strerror})") from None
    except (ValueError, RecursionError) as e:   # JSONDecodeError, UnicodeDecodeError, [[[[...
        raise CheckpointError(f"{file} is not valid JSON ({e})") from None
    if not isinstance(contents, dict):
        raise CheckpointError(f"{file} does not hold a JSON object")
    return contents


def is_sidecar_dir(path: Path, model_type: str) -> bool:
    """Whether `path` holds a config.json of `model_type` (an unreadable one is the model
    loader's to report)."""
    try:
        return json.loads((path / "config.json").read_text()).get("model_type") == model_type
    except (OSError, ValueError, RecursionError, AttributeError):
        return False


def tree_to_json(tree: Tree | DynamicTree | None):
    """A static tree as its paths, a dynamic one as {"dynamic": [depth, top_k, total_tokens]}."""
    if isinstance(tree, DynamicTree):
        return {"dynamic": [tree.depth, tree.top_k, tree.total_tokens]}
    return [list(p) for p in tree.paths] if tree is not None else None


def tree_from_json(value) -> Tree | DynamicTree | None:
    if not value:
        return None
    if isinstance(value, dict):
        return DynamicTree(*value["dynamic"])
    return Tree.from_paths(value)


def read_sidecar(path: Path, parse: Callable[[dict], tuple],
                 expected: Callable[..., tuple[dict, int]]) -> tuple[tuple, dict]:
    """The one loader of drafter directories. config.json goes to `parse(raw) -> (config, ...)`
    (any error it raises, or a projection other than the target's LM-head subset, becomes a
    CheckpointError naming the file); model.safetensors is then checked against
    `expected(*parsed) -> (shapes by tensor name, vocabulary size)` (`check_tensors`). Returns
    (what parse returned, the tensors as numpy arrays)."""
    file = path / "config.json"
    try:
        raw = json.loads(file.read_text())
        projection_kind = raw["projection"]["type"]
        parsed = parse(raw)
    except OSError as e:
        raise CheckpointError(f"{file}: cannot read ({e.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{file}: not valid JSON ({e})") from None
    except (KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{file}: missing or malformed field {e}") from None
    except (ValueError, ConfigError, TreeError, RecursionError) as e:
        raise CheckpointError(f"{file}: {e}") from None
    if projection_kind != PROJECTION:
        raise CheckpointError(f"{file}: projection type {projection_kind!r} is not supported "
                              f"(only {PROJECTION!r})")
    weights = path / "model.safetensors"
    tensors = read_tensors(weights)
    check_tensors(weights, tensors, *expected(*parsed))
    return parsed, tensors


def check_tensors(weights: Path, tensors: dict, expected: dict[str, tuple[int, ...]],
                  vocab_size: int) -> None:
    """The tensors of a drafter's model.safetensors against the shapes its config implies."""
    for name, shape in expected.items():
        if name not in tensors:
            raise CheckpointError(f"{weights}: missing tensor {name!r}")
        if tuple(tensors[name].shape) != tuple(shape):
            raise CheckpointError(f"{weights}: tensor {name!r} has shape "
                                  f"{tuple(tensors[name].shape)}, expected {tuple(shape)}")
        kind = "i" if name == "token_ids" else "f"
        if tensors[name].dtype.kind != kind:
            raise CheckpointError(f"{weights}: tensor {name!r} has dtype {tensors[name].dtype}")
        if kind == "f" and not np.all(np.isfinite(tensors[name])):
            raise CheckpointError(f"{weights}: tensor {name!r} has non-finite values")
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        raise CheckpointError(f"{weights}: unexpected tensor(s) {unexpected[:5]}")
    ids = tensors["token_ids"].astype(np.int64)
    if ids.min() < 0 or ids.max() >= vocab_size or len(np.unique(ids)) != len(ids):
        raise CheckpointError(f"{weights}: token_ids must be distinct ids in [0, {vocab_size})")


def check_target(heads, target: Model) -> None:
    """Raises CheckpointError (naming the heads' config.json) if `heads` (Medusa heads or an
    EAGLE drafter: both carry the same identity) were trained on a model other than
    `target`."""
    where = str(heads.path / "config.json") if heads.path else heads.name
    expected = heads.target
    trained_on = expected.get("name", "another model")
    config = {f: getattr(target.config, f) for f in TARGET_FIELDS}
    # A published checkpoint knows only some of the fields (`io.published`): check those.
    diff = [f for f in TARGET_FIELDS if f in expected["config"]
            and expected["config"][f] != config[f]]
    if diff:
        f = diff[0]
        raise CheckpointError(f"{where}: it was trained on {trained_on}, whose {f} is "
                              f"{expected['config'].get(f)!r}; {target.name} has {config[f]!r}")
    width = getattr(heads.config, "target_width", heads.config.hidden_size)
    if width != target.config.d_model:
        raise CheckpointError(f"{where}: it reads states {width} wide, but the target's d_model "
                              f"is {target.config.d_model}")
    own_embed = getattr(heads.config, "own_embeddings", False)
    if heads.config.hidden_size != target.config.d_model and not own_embed:
        raise CheckpointError(f"{where}: hidden_size {heads.config.hidden_size} != the target's "
                              f"d_model {target.config.d_model}, and it has no embeddings of "
                              f"its own")
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
    """Every tensor of a drafter's safetensors file; a CheckpointError naming it if it cannot
    be read."""
    try:
        try:
            with safe_open(weights, framework="numpy") as reader:
                return {name: reader.get_tensor(name) for name in reader.keys()}
        except (TypeError, ValueError) as e:
            if "bf16" not in str(e) and "bfloat16" not in str(e).lower():
                raise
            # numpy has no bfloat16 (published drafters often ship it): read through JAX,
            # upcast to float32.
            with safe_open(weights, framework="flax") as reader:
                return {name: np.asarray(reader.get_tensor(name), np.float32)
                        if reader.get_slice(name).get_dtype() == "BF16"
                        else np.asarray(reader.get_tensor(name)) for name in reader.keys()}
    except (SafetensorError, OSError, ValueError, TypeError) as e:
        raise CheckpointError(f"{weights}: corrupt or unreadable safetensors file ({e})") from None
