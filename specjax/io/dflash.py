"""DFlash drafters on disk, in the layout their authors publish (z-lab/dflash) and the engines
that serve them read (`specjax.heads.dflash` has the math).

config.json: a Qwen3 config of the draft layers (hidden_size, num_hidden_layers, heads,
head_dim, intermediate_size, rms_norm_eps, rope_theta, vocab_size, ...), with
`architectures: ["DFlashDraftModel"]`, `block_size`, `num_target_layers` and
`dflash_config: {"mask_token_id", "target_layer_ids"}`. Optional keys that other engines' DFlash
configs carry are read where specjax runs them: `input_embedding_scale`, `output_multiplier`,
`final_logit_softcapping`, `is_causal`; `layer_types` may name only full attention (a sliding
window is refused, by name). specjax adds `specjax_target` (the identity of the target it was
trained on) when it writes one.

model.safetensors: `fc.weight` [D, n D], `hidden_norm.weight`, `norm.weight` and
`layers.{i}.` + the Qwen3 layer's names (input_layernorm, self_attn.{q,k,v,o}_proj, q_norm,
k_norm, post_attention_layernorm, mlp.{gate,up,down}_proj); a `model.` prefix on every name is
accepted. No embeddings or LM head: the drafter reads the target's.

Every error is a CheckpointError naming the file, and the field or tensor at fault. A drafter
that does not fit its target (width, vocabulary, taps past the target's layers) is refused when
the two meet (`check_target`), naming the field too.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from safetensors.numpy import save_file

from specjax.heads.dflash import BlockDrafter, DFlashConfig, param_shapes
from specjax.io.errors import CheckpointError
from specjax.io.sidecar import json_object, read_tensors
from specjax.model.config import ConfigError, ModelConfig
from specjax.model.transformer import Model

__all__ = ["check_target", "is_dflash_dir", "load_block_drafter", "save_block_drafter"]

ARCHITECTURE = "DFlashDraftModel"
# The draft layers' tensor names, by specjax's parameter path.
_LAYER = {("attn_norm", "scale"): "input_layernorm.weight",
          ("mlp_norm", "scale"): "post_attention_layernorm.weight",
          ("wq",): "self_attn.q_proj.weight", ("wk",): "self_attn.k_proj.weight",
          ("wv",): "self_attn.v_proj.weight", ("wo",): "self_attn.o_proj.weight",
          ("bq",): "self_attn.q_proj.bias", ("bk",): "self_attn.k_proj.bias",
          ("bv",): "self_attn.v_proj.bias", ("bo",): "self_attn.o_proj.bias",
          ("q_norm", "scale"): "self_attn.q_norm.weight",
          ("k_norm", "scale"): "self_attn.k_norm.weight",
          ("w_gate",): "mlp.gate_proj.weight", ("w_up",): "mlp.up_proj.weight",
          ("w_down",): "mlp.down_proj.weight"}
_TOP = {("fc",): "fc.weight", ("hidden_norm", "scale"): "hidden_norm.weight",
        ("final_norm", "scale"): "norm.weight"}


def is_dflash_dir(directory: Path) -> bool:
    """Whether `directory`'s config.json describes a DFlash drafter."""
    try:
        raw = json.loads((Path(directory) / "config.json").read_text())
    except (OSError, ValueError, RecursionError):
        return False
    if not isinstance(raw, dict):
        return False
    archs = raw.get("architectures") or []
    return "dflash_config" in raw or (isinstance(archs, list) and ARCHITECTURE in archs)


def _field(file: Path, raw: dict, name: str, check, what: str, default=..., within: str = ""):
    """raw[name], checked; `within`: the object it sits in ("dflash_config."), for the
    message."""
    if name not in raw:
        if default is ...:
            raise CheckpointError(f"{file}: missing {within}{name}")
        return default
    value = raw[name]
    if not check(value):
        raise CheckpointError(f"{file}: {within}{name} must be {what}, got {value!r:.80}")
    return value


def _integer(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) and v > 0


def _config(file: Path, raw: dict) -> DFlashConfig:
    dflash = _field(file, raw, "dflash_config", lambda v: isinstance(v, dict),
                    "an object")
    layers = _field(file, raw, "num_hidden_layers", lambda v: _integer(v) and v >= 1,
                    "a positive integer")
    block = _field(file, raw, "block_size", lambda v: _integer(v) and v >= 2,
                   "an integer >= 2")
    mask = _field(file, dflash, "mask_token_id", lambda v: _integer(v) and v >= 0,
                  "a token id", within="dflash_config.")
    ids = _field(file, dflash, "target_layer_ids",
                 lambda v: isinstance(v, list) and v and all(_integer(i) and i >= 0 for i in v)
                 and v == sorted(set(v)), "increasing layer ids >= 0",
                 within="dflash_config.")
    target_layers = _field(file, raw, "num_target_layers", lambda v: _integer(v) and v >= 1,
                           "a positive integer", 0)
    kinds = _field(file, raw, "layer_types", lambda v: isinstance(v, list), "a list", [])
    if any(kind != "full_attention" for kind in kinds) or raw.get("use_sliding_window"):
        raise CheckpointError(f"{file}: layer_types / use_sliding_window: sliding-window draft "
                              f"layers are not supported (only full_attention), got {kinds}")
    causal = _field(file, raw, "is_causal", lambda v: isinstance(v, bool), "true or false",
                    False)
    scale = _field(file, raw, "input_embedding_scale", _number, "a positive number", 1.0)
    multiplier = _field(file, raw, "output_multiplier", _number, "a positive number", 1.0)
    cap = _field(file, raw, "final_logit_softcapping", lambda v: v is None or _number(v),
                 "a positive number or null", None)
    # The draft layers are Qwen3 layers whatever the target (the reference code builds them
    # from Qwen3's modules), so the layer config is read as a Qwen3's.
    hf = dict(raw, model_type="qwen3", use_sliding_window=False)
    hf.setdefault("max_position_embeddings", 32768)
    try:
        layer = ModelConfig.from_hf(hf, source=str(file)).replace(n_layers=layers,
                                                                  bos_token_id=None,
                                                                  eos_token_ids=())
        return DFlashConfig(layer, block, mask, tuple(i + 1 for i in ids), target_layers,
                            causal, float(scale), float(multiplier),
                            None if cap is None else float(cap))
    except ConfigError as e:
        raise CheckpointError(str(e)) from None
    except (TypeError, ValueError, ArithmeticError) as e:
        raise CheckpointError(f"{file}: {e}") from None


def _names(config: DFlashConfig, target_width: int | None = None) -> dict[tuple, tuple]:
    """Tensor name -> (parameter path, shape)."""
    shapes = param_shapes(config, target_width)
    out = {name: (path, shapes[path[0]] if len(path) == 1 else shapes[path[0]][path[1]])
           for path, name in _TOP.items()}
    for i, layer in enumerate(shapes["layers"]):
        for path, name in _LAYER.items():
            shape = layer.get(path[0])
            if shape is None:
                continue
            shape = shape[path[1]] if len(path) == 2 else shape
            if path[0] in ("wq", "wk", "wv"):        # stored [heads * H, D]
                shape = (shape[0] * shape[1], shape[2])
            elif path[0] == "wo":                    # stored [D, N * H]
                shape = (shape[0], shape[1] * shape[2])
            elif path[0] in ("bq", "bk", "bv"):
                shape = (shape[0] * shape[1],)
            out[f"layers.{i}.{name}"] = (("layers", i, *path), shape)
    return out


def load_block_drafter(directory: str | Path) -> BlockDrafter:
    """Reads a DFlash directory (config.json, model.safetensors); every error names the file."""
    directory = Path(directory).expanduser()
    file = directory / "config.json"
    raw = json_object(file)
    config = _config(file, raw)
    weights = directory / "model.safetensors"
    if not weights.is_file():
        raise CheckpointError(f"{directory}: no model.safetensors")
    tensors = read_tensors(weights)
    if tensors and all(name.startswith("model.") for name in tensors):
        tensors = {name[len("model."):]: t for name, t in tensors.items()}
    # Each draft layer has 11 tensors: a damaged layer count must not build its name table.
    if config.layer.n_layers * 11 > len(tensors):
        raise CheckpointError(f"{file}: num_hidden_layers {config.layer.n_layers}, but "
                              f"{weights.name} holds {len(tensors)} tensors in all")
    fc = tensors.get("fc.weight")
    if fc is None or fc.ndim != 2:
        raise CheckpointError(f"{weights}: missing tensor 'fc.weight' (a [D, n D] matrix)")
    width, rest = divmod(fc.shape[1], len(config.taps))
    if rest or fc.shape[0] != config.hidden_size:
        raise CheckpointError(f"{weights}: tensor 'fc.weight' has shape {tuple(fc.shape)}, "
                              f"expected ({config.hidden_size}, {len(config.taps)} x the "
                              f"target's width) for target_layer_ids {config.target_layer_ids}")
    expected = _names(config, width)
    for name, (_, shape) in expected.items():
        if name not in tensors:
            raise CheckpointError(f"{weights}: missing tensor {name!r}")
        t = tensors[name]
        if tuple(t.shape) != tuple(shape):
            raise CheckpointError(f"{weights}: tensor {name!r} has shape {tuple(t.shape)}, "
                                  f"expected {tuple(shape)}")
        if t.dtype.kind != "f":
            raise CheckpointError(f"{weights}: tensor {name!r} has dtype {t.dtype}, "
                                  "expected a float")
        if not np.all(np.isfinite(t)):
            raise CheckpointError(f"{weights}: tensor {name!r} has non-finite values")
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise CheckpointError(f"{weights}: unexpected tensor(s) {extra[:5]}")
    shapes = param_shapes(config, width)
    params = {"layers": [{} for _ in shapes["layers"]]}
    for name, (path, _) in expected.items():
        value = jnp.asarray(np.asarray(tensors[name], np.float32))
        if path[0] == "layers":
            layer, path = params["layers"][path[1]], path[2:]
            stored = shapes["layers"][0][path[0]]
            if path[0] in ("wq", "wk", "wv", "wo", "bq", "bk", "bv"):
                value = value.reshape(stored)
        else:
            layer = params
        if len(path) == 2:
            layer.setdefault(path[0], {})[path[1]] = value
        else:
            layer[path[0]] = value
    target = raw.get("specjax_target")
    if target is not None and not isinstance(target, dict):
        raise CheckpointError(f"{file}: specjax_target must be an object")
    return BlockDrafter(config, params, target, directory, extra=raw)


def save_block_drafter(drafter: BlockDrafter, directory: str | Path) -> Path:
    """Writes `drafter` in the published layout (float32), which the DFlash reference code and
    the engines that serve DFlash drafters load."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    c = drafter.config
    width = drafter.params["fc"].shape[1] // len(c.taps)
    tensors = {}
    for name, (path, shape) in _names(c, width).items():
        value = drafter.params
        for key in path:
            value = value[key]
        tensors[name] = np.ascontiguousarray(np.asarray(value, np.float32).reshape(shape))
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    layer = c.layer.replace(dtype="float32").to_hf()
    for key in ("bos_token_id", "eos_token_id", "architectures", "torch_dtype"):
        layer.pop(key, None)
    config = {**{k: v for k, v in drafter.extra.items()
                 if k not in ("dflash_config", "specjax_target")},
              **layer, "architectures": [ARCHITECTURE], "model_type": "qwen3",
              "block_size": c.block_size, "num_target_layers": c.target_layers or None,
              "dflash_config": {"mask_token_id": c.mask_token_id,
                                "target_layer_ids": c.target_layer_ids},
              "layer_types": ["full_attention"] * c.layer.n_layers, "is_causal": c.causal,
              "input_embedding_scale": c.input_embedding_scale,
              "output_multiplier": c.output_multiplier,
              "final_logit_softcapping": c.final_logit_softcapping, "torch_dtype": "float32"}
    if drafter.target is not None:
        config["specjax_target"] = drafter.target
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory


def check_target(drafter: BlockDrafter, target: Model) -> None:
    """A drafter that does not fit `target` is a CheckpointError naming its file and field:
    the width (hidden_size), the vocabulary (vocab_size), the mask token, the taps
    (target_layer_ids past the target's layers), the family."""
    c, t = drafter.config, target.config
    where = (drafter.path / "config.json") if drafter.path else drafter.name
    if t.arch != "llama":
        raise CheckpointError(f"{where}: DFlash drafters serve Llama-family targets; "
                              f"{target.name} is {t.arch!r}")
    if c.hidden_size != t.d_model:
        raise CheckpointError(f"{where}: hidden_size {c.hidden_size} differs from "
                              f"{target.name}'s {t.d_model} (it reads the target's embeddings "
                              "and LM head)")
    width = drafter.params["fc"].shape[1] // len(c.taps)
    if width != t.d_model:
        raise CheckpointError(f"{where}: fc reads {len(c.taps)} x {width} features, but "
                              f"{target.name}'s states are {t.d_model} wide")
    if c.layer.vocab_size != t.vocab_size:
        raise CheckpointError(f"{where}: vocab_size {c.layer.vocab_size} differs from "
                              f"{target.name}'s {t.vocab_size}")
    if not 0 <= c.mask_token_id < t.vocab_size:
        raise CheckpointError(f"{where}: dflash_config.mask_token_id {c.mask_token_id} is "
                              f"outside {target.name}'s vocabulary of {t.vocab_size}")
    if max(c.taps) > t.n_layers:
        raise CheckpointError(f"{where}: dflash_config.target_layer_ids "
                              f"{c.target_layer_ids} reach past {target.name}'s "
                              f"{t.n_layers} layers")
    if drafter.target is not None:
        trained = drafter.target.get("config", {})
        for field, value in trained.items():
            if getattr(t, field, value) != value:
                raise CheckpointError(f"{where}: it was trained on {drafter.target.get('name')}"
                                      f" ({field} {value}); {target.name} has "
                                      f"{getattr(t, field)}")
