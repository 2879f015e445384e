"""Medusa heads on disk: specjax's directory, which `save_heads` (here) writes by default, and
FasterDecoding's (`specjax.io.published`), both read by `specjax.load`.

specjax's layout (config.json, model.safetensors, README.md) is described in
`specjax.heads.medusa`; heads with their own LM heads add `medusa_head.{k}.{blocks}.weight`
[V, D], as Medusa names them. The math lives there, the files here, and what EAGLE drafters'
files share with them (the loader, the tree as JSON, the target's identity check) in
`specjax.io.sidecar`.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from safetensors.numpy import save_file

from specjax.heads.medusa import MODEL_TYPE, Heads, HeadsConfig
from specjax.heads.shared import PROJECTION
from specjax.io.published import (HEADS_FORMATS, is_published_heads, load_published_heads,
                                  save_published_heads)
from specjax.io.sidecar import is_sidecar_dir, read_sidecar, tree_from_json, tree_to_json


def is_heads_dir(path: Path) -> bool:
    return is_sidecar_dir(path, MODEL_TYPE) or is_published_heads(path)


def save_heads(heads: Heads, directory: str | Path, extra: dict | None = None,
               format: str = "specjax") -> Path:
    """Writes `heads` as a directory, specjax's or (`format="medusa"`) FasterDecoding's;
    `load_heads` reads either back exactly (float32)."""
    if format not in HEADS_FORMATS:
        raise ValueError(f"format must be one of {HEADS_FORMATS}, got {format!r}")
    directory = Path(directory)
    if format == "medusa":
        if extra:
            raise ValueError("extra applies to format 'specjax'")
        return save_published_heads(heads, directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {"token_ids": np.ascontiguousarray(heads.token_ids, np.int32)}
    for k, blocks in enumerate(heads.params["blocks"]):
        for j, block in enumerate(blocks):
            name = f"medusa_head.{k}.{j}.linear"
            tensors[f"{name}.weight"] = np.ascontiguousarray(np.asarray(block["w"], np.float32).T)
            tensors[f"{name}.bias"] = np.asarray(block["b"], np.float32)
        if heads.config.head == "own":
            tensors[f"medusa_head.{k}.{heads.config.num_blocks}.weight"] = np.ascontiguousarray(
                np.asarray(heads.params["lm_heads"][k], np.float32))
    weights = directory / "model.safetensors"
    save_file(tensors, str(weights), metadata={"format": "pt"})
    weights.chmod(0o644)
    c = heads.config
    config = {"model_type": MODEL_TYPE, "num_heads": c.num_heads, "num_blocks": c.num_blocks,
              "hidden_size": c.hidden_size, "vocab_size": c.vocab_size,
              "projection": {"type": PROJECTION, "tokens": c.subset_size},
              **({"head": "own"} if c.head == "own" else {}),
              "target": heads.target,
              "tree": tree_to_json(heads.tree),
              **(extra or {})}
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory


def load_heads(path: str | Path) -> Heads:
    """Reads a heads directory; every error names the file."""
    path = Path(path).expanduser()
    if not is_sidecar_dir(path, MODEL_TYPE):
        return load_published_heads(path)

    def parse(raw):
        config = HeadsConfig(num_heads=raw["num_heads"], num_blocks=raw["num_blocks"],
                             hidden_size=raw["hidden_size"], vocab_size=raw["vocab_size"],
                             subset_size=raw["projection"]["tokens"],
                             head=raw.get("head", "subset"))
        tree = tree_from_json(raw.get("tree"))
        if tree is not None and tree.max_depth > config.num_heads:
            raise ValueError(f"its tree is {tree.max_depth} deep but there are only "
                             f"{config.num_heads} heads")
        return config, raw["target"], tree

    def expected(config, *_):
        d, shapes = config.hidden_size, {"token_ids": (config.subset_size,)}
        for k in range(config.num_heads):
            for j in range(config.num_blocks):
                shapes[f"medusa_head.{k}.{j}.linear.weight"] = (d, d)
                shapes[f"medusa_head.{k}.{j}.linear.bias"] = (d,)
            if config.head == "own":
                shapes[f"medusa_head.{k}.{config.num_blocks}.weight"] = (config.vocab_size, d)
        return shapes, config.vocab_size

    (config, target, tree), tensors = read_sidecar(path, parse, expected)
    blocks = [[{"w": jnp.asarray(tensors[f"medusa_head.{k}.{j}.linear.weight"].T, jnp.float32),
                "b": jnp.asarray(tensors[f"medusa_head.{k}.{j}.linear.bias"], jnp.float32)}
               for j in range(config.num_blocks)] for k in range(config.num_heads)]
    params = {"blocks": blocks}
    if config.head == "own":
        params["lm_heads"] = [jnp.asarray(tensors[f"medusa_head.{k}.{config.num_blocks}.weight"],
                                          jnp.float32) for k in range(config.num_heads)]
    return Heads(config, params, tensors["token_ids"].astype(np.int32), target, tree,
                 path)
