"""EAGLE drafters on disk: the directory `specjax.save_drafter` writes and `specjax.load` reads.

The layout is described in `specjax.heads.eagle`; the math lives there, the files here, read by
the loader Medusa heads' files share (`specjax.io.sidecar`). The target's identity is the one
Medusa heads carry and is checked the same way (`io.sidecar.check_target`): a drafter trained
for another model is an error naming its file.
Weights are stored as float16 or float32 and always load as float32.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from safetensors.numpy import save_file

from specjax.heads.eagle import MODEL_TYPE, Drafter, DrafterConfig, layer_config
from specjax.heads.shared import PROJECTION
from specjax.io.sidecar import is_sidecar_dir, read_sidecar, tree_from_json, tree_to_json
from specjax.model.config import ModelConfig
from specjax.model.transformer import param_shapes

STORAGE = ("float16", "float32")


def is_eagle_dir(path: Path) -> bool:
    return is_sidecar_dir(path, MODEL_TYPE)


def _expected_shapes(config: DrafterConfig) -> dict[str, tuple[int, ...]]:
    d = config.hidden_size
    shapes = {"fc.weight": (d, 2 * d), "fc.bias": (d,), "norm.weight": (d,),
              "token_ids": (config.subset_size,)}
    if config.fused_layers:
        shapes["reduce.weight"] = (d, len(config.fused_layers) * d)
    layer = param_shapes(config.layer)["layers"][0]
    for name, shape in layer.items():
        if isinstance(shape, dict):            # a norm: {"scale": (D,)}
            for part, s in shape.items():
                shapes[f"layers.0.{name}.{part}"] = s
        else:
            shapes[f"layers.0.{name}"] = shape
    return shapes


def _tensors(drafter: Drafter) -> dict[str, np.ndarray]:
    p = drafter.params
    out = {"fc.weight": p["fc"]["w"], "fc.bias": p["fc"]["b"],
           "norm.weight": p["final_norm"]["scale"]}
    if "reduce" in p:
        out["reduce.weight"] = p["reduce"]["w"]
    for name, value in p["layers"][0].items():
        if isinstance(value, dict):
            for part, v in value.items():
                out[f"layers.0.{name}.{part}"] = v
        else:
            out[f"layers.0.{name}"] = value
    return {k: np.asarray(v, np.float32) for k, v in out.items()}


def save_drafter(drafter: Drafter, directory: str | Path, storage: str = "float32",
                 extra: dict | None = None) -> Path:
    """Writes `drafter` as a directory; `storage` "float16" halves the file (the weights load
    back as float32, rounded)."""
    if storage not in STORAGE:
        raise ValueError(f"storage must be one of {STORAGE}, got {storage!r}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: np.ascontiguousarray(v.astype(storage)) for k, v in _tensors(drafter).items()}
    tensors["token_ids"] = np.ascontiguousarray(drafter.token_ids, np.int32)
    weights = directory / "model.safetensors"
    save_file(tensors, str(weights), metadata={"format": "pt"})
    weights.chmod(0o644)
    c = drafter.config
    config = {"model_type": MODEL_TYPE, "hidden_size": c.hidden_size,
              "vocab_size": c.layer.vocab_size,
              "projection": {"type": PROJECTION, "tokens": c.subset_size},
              "layer": c.layer.to_hf(), "storage": storage, "target": drafter.target,
              "tree": tree_to_json(drafter.tree),
              **({"sampled_tree": tree_to_json(drafter.sampled_tree)}
                 if drafter.sampled_tree is not None else {}),
              **({"fused_layers": list(c.fused_layers)} if c.fused_layers else {}),
              **(extra or {})}
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory


def load_drafter(path: str | Path) -> Drafter:
    """Reads an EAGLE directory; every error names the file."""
    path = Path(path).expanduser()

    def parse(raw):
        layer = layer_config(ModelConfig.from_hf(raw["layer"], source=str(path / "config.json")))
        fused = raw.get("fused_layers", [])
        if not isinstance(fused, list):
            raise ValueError(f"fused_layers must be a list of layer counts, got {fused!r}")
        config = DrafterConfig(layer, raw["projection"]["tokens"], tuple(fused))
        if config.hidden_size != raw["hidden_size"] or config.layer.vocab_size != raw["vocab_size"]:
            raise ValueError("hidden_size or vocab_size disagrees with the layer's shape")
        target = raw["target"]
        if not isinstance(target, dict):
            raise TypeError("'target'")
        return config, target, (tree_from_json(raw.get("tree")),
                                tree_from_json(raw.get("sampled_tree")))

    (config, target, (tree, sampled_tree)), tensors = read_sidecar(
        path, parse, lambda config, *_: (_expected_shapes(config), config.layer.vocab_size))

    def get(name):
        return jnp.asarray(tensors[name], jnp.float32)

    layer = {}
    for name in _expected_shapes(config):
        if name.startswith("layers.0."):
            parts = name[len("layers.0."):].split(".")
            if len(parts) == 2:
                layer.setdefault(parts[0], {})[parts[1]] = get(name)
            else:
                layer[parts[0]] = get(name)
    params = {"fc": {"w": get("fc.weight"), "b": get("fc.bias")}, "layers": [layer],
              "final_norm": {"scale": get("norm.weight")}}
    if config.fused_layers:
        params["reduce"] = {"w": get("reduce.weight")}
    return Drafter(config, params, tensors["token_ids"].astype(np.int32), target, tree, path,
                   sampled_tree=sampled_tree)
