"""EAGLE drafters on disk: specjax's directory, which `save_drafter` (here) writes by default,
and the published layouts (`specjax.io.published`), all read by `specjax.load`.

The math lives in `specjax.heads.eagle`, the files here, read by the loader Medusa heads' files
share (`specjax.io.sidecar`). The target's identity is the one Medusa heads carry and is checked
the same way (`io.sidecar.check_target`): a drafter trained for another model is an error naming
its file. Weights are stored as float16 or float32 and always load as float32.

specjax's directory: config.json (model_type "eagle", kind, head, style, taps, the layer's
shape, the target's identity, the default trees) and model.safetensors, whose tensors are the
drafter's parameters by the names of the published layouts where they have one (fc.weight,
fc.bias, norm.weight, lm_head.weight, embed_tokens.weight) and `layers.0.{name}[.{part}]` in
specjax's own names for the layer, plus token_ids [S], the target id of each logit. A
config.json without "style" is the specjax style with the subset head (the shipped drafters).
"""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from safetensors.numpy import save_file

from specjax.heads.eagle import MODEL_TYPE, Drafter, DrafterConfig, layer_config, param_shapes
from specjax.heads.shared import PROJECTION
from specjax.io.published import DRAFTER_FORMATS, is_published_drafter
from specjax.io.published_eagle import load_published_drafter, save_published_drafter
from specjax.io.sidecar import is_sidecar_dir, read_sidecar, tree_from_json, tree_to_json
from specjax.model.config import ModelConfig

STORAGE = ("float16", "float32")
_TOP = {"fc": "fc", "final_norm": "norm", "lm_head": "lm_head", "embed": "embed_tokens"}


def is_eagle_dir(path: Path) -> bool:
    return is_sidecar_dir(path, MODEL_TYPE) or is_published_drafter(path)


def _flat(tree: dict) -> dict:
    """The drafter's parameter tree (or its shapes) by tensor name."""
    out = {}
    for key, value in tree.items():
        if key == "layers":
            for name, part in value[0].items():
                if isinstance(part, dict):
                    out.update({f"layers.0.{name}.{k}": v for k, v in part.items()})
                else:
                    out[f"layers.0.{name}"] = part
        elif isinstance(value, dict):
            out.update({f"{_TOP[key]}.{'weight' if k in ('w', 'scale') else 'bias'}": v
                        for k, v in value.items()})
        else:
            out[f"{_TOP[key]}.weight"] = value
    return out


def _unflat(tensors: dict, shapes: dict) -> dict:
    """`_flat`'s inverse, over the names `shapes` has."""
    params = {}
    for key, value in shapes.items():
        if key == "layers":
            layer = {}
            for name, part in value[0].items():
                if isinstance(part, dict):
                    layer[name] = {k: tensors[f"layers.0.{name}.{k}"] for k in part}
                else:
                    layer[name] = tensors[f"layers.0.{name}"]
            params["layers"] = [layer]
        elif isinstance(value, dict):
            params[key] = {k: tensors[f"{_TOP[key]}.{'weight' if k in ('w', 'scale') else 'bias'}"]
                           for k in value}
        else:
            params[key] = tensors[f"{_TOP[key]}.weight"]
    return params


def save_drafter(drafter: Drafter, directory: str | Path, storage: str = "float32",
                 extra: dict | None = None, format: str = "specjax") -> Path:
    """Writes `drafter` as a directory: specjax's (default; `storage` "float16" halves the
    file, the weights loading back as float32, rounded), or with `format` "eagle" / "speculators"
    in the layout the EAGLE repo and SpecForge, or vllm-project/speculators, write (float32),
    which the engines that serve those drafters load (`specjax.io.published`)."""
    if format not in DRAFTER_FORMATS:
        raise ValueError(f"format must be one of {DRAFTER_FORMATS}, got {format!r}")
    if storage not in STORAGE:
        raise ValueError(f"storage must be one of {STORAGE}, got {storage!r}")
    directory = Path(directory)
    if format != "specjax":
        if storage != "float32" or extra:
            raise ValueError("storage and extra apply to format 'specjax'")
        return save_published_drafter(drafter, directory, format)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: np.ascontiguousarray(np.asarray(v, np.float32).astype(storage))
               for k, v in _flat(drafter.params).items()}
    tensors["token_ids"] = np.ascontiguousarray(drafter.token_ids, np.int32)
    weights = directory / "model.safetensors"
    save_file(tensors, str(weights), metadata={"format": "pt"})
    weights.chmod(0o644)
    c = drafter.config
    config = {"model_type": MODEL_TYPE, "hidden_size": c.hidden_size,
              "vocab_size": c.layer.vocab_size,
              "projection": {"type": PROJECTION, "tokens": c.subset_size},
              "kind": c.kind, "head": c.head, "style": c.style,
              **({"taps": list(c.taps)} if c.taps else {}),
              **({"defer_taps": True} if c.defer_taps else {}),
              **({"feature_size": c.feature_size} if c.feature_size else {}),
              **({"norm_before_residual": True} if c.norm_before_residual else {}),
              **({"own_embeddings": True} if c.own_embeddings else {}),
              "layer": c.layer.to_hf(), "storage": storage, "target": drafter.target,
              "tree": tree_to_json(drafter.tree),
              **({"sampled_tree": tree_to_json(drafter.sampled_tree)}
                 if drafter.sampled_tree is not None else {}),
              **(extra or {})}
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory


def load_drafter(path: str | Path) -> Drafter:
    """Reads an EAGLE directory, specjax's or a published layout; every error names the file."""
    path = Path(path).expanduser()
    if not is_sidecar_dir(path, MODEL_TYPE):
        return load_published_drafter(path)

    def parse(raw):
        layer = layer_config(ModelConfig.from_hf(raw["layer"], source=str(path / "config.json")))
        if "fused_layers" in raw:
            raise ValueError("fused_layers was specjax's earlier EAGLE-3 variant, no longer "
                             "read; EAGLE-3 is the published architecture (kind 'eagle3')")
        taps = raw.get("taps", [])
        if not isinstance(taps, list):
            raise ValueError(f"taps must be a list of layer counts, got {taps!r}")
        style = raw.get("style", "specjax")
        config = DrafterConfig(layer, raw["projection"]["tokens"], raw.get("kind", "eagle1"),
                               raw.get("head", "subset"), style, tuple(taps),
                               raw.get("feature_size", 0),
                               raw.get("norm_before_residual", False),
                               raw.get("own_embeddings", False), raw.get("defer_taps", False))
        if config.hidden_size != raw["hidden_size"] or config.layer.vocab_size != raw["vocab_size"]:
            raise ValueError("hidden_size or vocab_size disagrees with the layer's shape")
        target = raw["target"]
        if not isinstance(target, dict):
            raise TypeError("'target'")
        return config, target, (tree_from_json(raw.get("tree")),
                                tree_from_json(raw.get("sampled_tree")))

    def expected(config, *_):
        shapes = _flat(param_shapes(config))
        return dict(shapes, token_ids=(config.subset_size,)), config.layer.vocab_size

    (config, target, (tree, sampled_tree)), tensors = read_sidecar(path, parse, expected)
    params = _unflat({k: jnp.asarray(v, jnp.float32) for k, v in tensors.items()
                      if k != "token_ids"}, param_shapes(config))
    return Drafter(config, params, tensors["token_ids"].astype(np.int32), target, tree, path,
                   sampled_tree=sampled_tree)
