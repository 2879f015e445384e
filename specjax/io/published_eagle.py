"""EAGLE-1/2 and EAGLE-3 drafters in their published layouts (the table in
`specjax.io.published`): the EAGLE repo's and SpecForge's ("eagle") and vllm-project/speculators'
("speculators"), read into a `Drafter` and written back, with the trees they were tuned with."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from safetensors.numpy import save_file

from specjax.heads.eagle import Drafter, DrafterConfig, layer_config
from specjax.io.errors import CheckpointError
from specjax.io.published import check_tensors, float_tensor, identity, read_config, read_weights
from specjax.model.config import ConfigError, ModelConfig
from specjax.sampling.tree import DynamicTree, Tree, TreeError

_SPECULATORS_OFF = ("norm_before_fc", "fc_norm", "norm_output")   # options not implemented
_DEFAULT_CHAIN = 4      # the chain a drafter without a tree drafts (`generate`'s k)


def _layer_names(prefix: str, eagle3: bool, input_norm: bool) -> dict[str, tuple]:
    """HF tensor name -> (the layer's param, to specjax, to HF) for one decoder layer."""
    def heads_in(key):
        return (key, lambda w, n: w.reshape(n, -1, w.shape[-1]),
                lambda w: w.reshape(-1, w.shape[-1]))
    names = {
        "self_attn.q_proj.weight": heads_in("wq"),
        "self_attn.k_proj.weight": heads_in("wk"),
        "self_attn.v_proj.weight": heads_in("wv"),
        "self_attn.o_proj.weight": ("wo", lambda w, n: w.reshape(w.shape[0], n, -1),
                                    lambda w: w.reshape(w.shape[0], -1)),
        "mlp.gate_proj.weight": ("w_gate", None, None),
        "mlp.up_proj.weight": ("w_up", None, None),
        "mlp.down_proj.weight": ("w_down", None, None),
        "post_attention_layernorm.weight": ("mlp_norm", None, None),
    }
    if input_norm:
        names["input_layernorm.weight"] = ("attn_norm", None, None)
    if eagle3:
        names["hidden_norm.weight"] = ("hidden_norm", None, None)
    return {prefix + k: v for k, v in names.items()}


def _layer_shapes(c: ModelConfig, eagle3: bool, input_norm: bool, prefix: str) -> dict:
    d, n, k, h, f = c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.d_ff
    e = 2 * d if eagle3 else d
    shapes = {"self_attn.q_proj.weight": (n * h, e), "self_attn.k_proj.weight": (k * h, e),
              "self_attn.v_proj.weight": (k * h, e), "self_attn.o_proj.weight": (d, n * h),
              "mlp.gate_proj.weight": (f, d), "mlp.up_proj.weight": (f, d),
              "mlp.down_proj.weight": (d, f), "post_attention_layernorm.weight": (d,)}
    if input_norm:
        shapes["input_layernorm.weight"] = (d,)
    if eagle3:
        shapes["hidden_norm.weight"] = (d,)
    return {prefix + name: s for name, s in shapes.items()}


MAX_VOCAB = 2**24      # more ids than any tokenizer has (the largest are about 2**18)


def load_published_drafter(directory: str | Path) -> Drafter:
    """Reads an EAGLE-1/2 or EAGLE-3 drafter in a published layout (module docstring); every
    error is a CheckpointError naming the file and, where one is at fault, the tensor."""
    directory = Path(directory).expanduser()
    file = directory / "config.json"
    raw = read_config(directory)
    speculators = raw.get("speculators_model_type")
    if speculators is not None and speculators != "eagle3":
        raise CheckpointError(f"{file}: speculators_model_type {speculators!r} is not supported "
                              f"(only 'eagle3')")
    for option in _SPECULATORS_OFF:
        if raw.get(option):
            raise CheckpointError(f"{file}: {option}: true is not supported")
    eagle3 = speculators is not None or "draft_vocab_size" in raw
    config, vocab, width = _drafter_config(file, raw, speculators, eagle3)
    layer = config.layer
    weights, tensors = read_weights(directory, ("model", "pytorch_model"))
    d = layer.d_model
    if eagle3:
        prefix = "layers.0." if speculators or any(k.startswith("layers.0.") for k in tensors) \
            else "midlayer."
        n_taps = len(config.taps) if config.taps else 3
        expected = {"fc.weight": (d, n_taps * width), "norm.weight": (d,),
                    "lm_head.weight": (config.subset_size, d),
                    **_layer_shapes(layer, True, True, prefix)}
        optional = {"d2t": (config.subset_size,), "t2d": (vocab,), "embed_tokens.weight": (vocab, d)}
        if config.subset_size != vocab:
            expected["d2t"] = optional.pop("d2t")
    else:
        prefix = "layers.0."
        expected = {"fc.weight": (d, 2 * d), **_layer_shapes(layer, False, False, prefix)}
        if raw.get("bias", True):
            expected["fc.bias"] = (d,)
        optional = {"embed_tokens.weight": (vocab, d)}
    if config.own_embeddings is False and "embed_tokens.weight" not in tensors and width != d:
        raise CheckpointError(f"{weights}: missing tensor 'embed_tokens.weight' (its width {d} "
                              f"is not the target's {width}, so it cannot read the target's)")
    check_tensors(weights, tensors, expected, optional)
    ids = _draft_ids(weights, tensors, config.subset_size, vocab)

    params, config = _drafter_params(weights, tensors, config, prefix, expected)
    verifier = raw.get("speculators_config")
    verifier = verifier.get("verifier") if isinstance(verifier, dict) else None
    name = raw.get("base_model_name_or_path") or (
        verifier.get("name_or_path") if isinstance(verifier, dict) else None)
    return Drafter(config, params, ids, identity(name, vocab, width),
                   _eagle_tree(file, raw, "eagle_tree"), directory,
                   sampled_tree=_eagle_tree(file, raw, "eagle_sampled_tree"))


def _drafter_config(file: Path, raw: dict, speculators, eagle3: bool):
    """(the drafter's config, the target's vocabulary, the target's width) from config.json's
    `raw`, each value checked; a bad one is a CheckpointError naming the file."""
    layer_raw = raw.get("transformer_layer_config") if speculators else raw
    try:
        if not isinstance(layer_raw, dict):
            raise ConfigError("transformer_layer_config must be an object")
        if layer_raw.get("num_hidden_layers", 1) != 1:
            raise ConfigError(f"num_hidden_layers is {layer_raw['num_hidden_layers']!r}; "
                              f"published EAGLE drafters have one layer")
        hf = dict(layer_raw, num_hidden_layers=1)
        hf.setdefault("model_type", "llama")
        layer = layer_config(ModelConfig.from_hf(hf, source=str(file)))
        vocab = layer.vocab_size
        width = raw.get("target_hidden_size") or layer.d_model
        taps = raw.get("eagle_aux_hidden_state_layer_ids")
        if taps is None and isinstance(raw.get("eagle_config"), dict):
            taps = raw["eagle_config"].get("eagle_aux_hidden_state_layer_ids")
        if taps is not None and (not isinstance(taps, list) or not taps):
            raise ConfigError(f"eagle_aux_hidden_state_layer_ids must be a list of layer ids, "
                              f"got {taps!r}")
        draft_vocab = raw.get("draft_vocab_size", vocab) if eagle3 else vocab
        for key, value in (("vocab_size", vocab), ("draft_vocab_size", draft_vocab)):
            # An EAGLE-1 drafter's vocabulary is read from no tensor before it meets its
            # target: bound it here, not by allocating its ids.
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_VOCAB:
                raise ConfigError(f"{key} must be an integer in [1, {MAX_VOCAB}], got {value!r}")
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ConfigError(f"target_hidden_size must be a positive integer, got {width!r}")
        config = DrafterConfig(
            layer, int(draft_vocab), kind="eagle3" if eagle3 else "eagle1",
            head="own" if eagle3 else "target", taps=tuple(taps or ()),
            feature_size=width if eagle3 and width != layer.d_model else 0,
            norm_before_residual=bool(raw.get("norm_before_residual", False)),
            defer_taps=eagle3 and taps is None)
    except (ConfigError, ValueError, TypeError) as e:
        raise CheckpointError(f"{file}: {e}") from None
    return config, vocab, width


def _drafter_params(weights: Path, tensors: dict, config: DrafterConfig, prefix: str,
                    expected: dict):
    """(the drafter's parameters, in specjax's layout, float32; its config, marked as owning
    embeddings where the file holds them) from the checked `tensors`."""
    layer, eagle3, d = config.layer, config.kind == "eagle3", config.layer.d_model
    layer_params = {}
    for name, (key, to_specjax, _) in _layer_names(prefix, eagle3, eagle3).items():
        value = float_tensor(weights, tensors, name)
        if to_specjax is not None:
            heads = layer.n_heads if key in ("wq", "wo") else layer.n_kv_heads
            value = to_specjax(value, heads)
        layer_params[key] = {"scale": value} if key.endswith("norm") else value
    params = {"layers": [layer_params], "fc": {"w": float_tensor(weights, tensors, "fc.weight")}}
    if "fc.bias" in expected:
        params["fc"]["b"] = float_tensor(weights, tensors, "fc.bias")
    elif not eagle3:
        params["fc"]["b"] = jnp.zeros((d,), jnp.float32)
    if eagle3:
        params["final_norm"] = {"scale": float_tensor(weights, tensors, "norm.weight")}
        params["lm_head"] = float_tensor(weights, tensors, "lm_head.weight")
    if "embed_tokens.weight" in tensors:
        params["embed"] = float_tensor(weights, tensors, "embed_tokens.weight")
        config = dataclasses.replace(config, own_embeddings=True)
    return params, config


def _eagle_tree(file: Path, raw: dict, key: str) -> Tree | DynamicTree | None:
    """The tree in config.json's optional `eagle_tree` or `eagle_sampled_tree` (module
    docstring). Absent: None."""
    value = raw.get(key)
    if value is None:
        return None
    try:
        if isinstance(value, dict):
            if set(value) != {"depth", "top_k", "total_token"}:
                raise TreeError(f"a dynamic tree is {{depth, top_k, total_token}}, got "
                                f"{sorted(value)}")
            return DynamicTree(value["depth"], value["top_k"], value["total_token"])
        return Tree.from_paths(value)
    except (TreeError, TypeError, ValueError) as e:
        raise CheckpointError(f"{file}: {key}: {e}") from None


def _eagle_tree_json(tree: Tree | DynamicTree | None):
    if isinstance(tree, DynamicTree):
        return {"depth": tree.depth, "top_k": tree.top_k, "total_token": tree.total_tokens}
    return [list(p) for p in tree.paths] if tree is not None else None


def _draft_ids(weights: Path, tensors: dict, size: int, vocab: int) -> np.ndarray:
    """The target id of each draft id: i + d2t[i], checked to be distinct ids in range and to
    agree with t2d where it is given."""
    if "d2t" not in tensors:
        ids = np.arange(size, dtype=np.int64)
    else:
        d2t = tensors["d2t"]
        if d2t.dtype.kind not in "iu":
            raise CheckpointError(f"{weights}: tensor 'd2t' has dtype {d2t.dtype}, expected ints")
        ids = np.arange(size, dtype=np.int64) + d2t.astype(np.int64)
    if ids.min() < 0 or ids.max() >= vocab or len(np.unique(ids)) != size:
        raise CheckpointError(f"{weights}: tensor 'd2t' maps draft ids outside [0, {vocab}) or "
                              f"two draft ids to one target id")
    if "t2d" in tensors:
        t2d = tensors["t2d"]
        if t2d.dtype.kind not in "biu" or int(np.count_nonzero(t2d)) != size or \
                not np.all(t2d.astype(bool)[ids]):
            raise CheckpointError(f"{weights}: tensor 't2d' disagrees with 'd2t' (it must mark "
                                  f"exactly the {size} target ids the draft vocabulary covers)")
    return ids.astype(np.int32)


def save_published_drafter(drafter: Drafter, directory: Path, layout: str) -> Path:
    """Writes `drafter` in a published layout ("eagle": the EAGLE repo's and SpecForge's;
    "speculators": EAGLE-3 only), float32, model.safetensors."""
    c = drafter.config
    if c.style != "published" or c.head == "subset":
        raise ValueError(f"{drafter.name} is specjax's variant (style {c.style!r}, head "
                         f"{c.head!r}), which no published layout describes: save it with "
                         f"format='specjax'")
    if layout == "speculators" and c.kind != "eagle3":
        raise ValueError("the speculators layout is written for EAGLE-3 drafters only")
    if c.defer_taps:
        raise ValueError(f"{drafter.name}'s taps are not resolved yet (they default from its "
                         f"target): pass it through eagle.resolve_taps first")
    eagle3 = c.kind == "eagle3"
    prefix = "layers.0." if layout == "speculators" or not eagle3 else "midlayer."
    tensors = _drafter_tensors(drafter, prefix, eagle3)
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
              str(directory / "model.safetensors"), metadata={"format": "pt"})
    config = _drafter_config_json(drafter, layout, eagle3)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory


def _drafter_tensors(drafter: Drafter, prefix: str, eagle3: bool) -> dict[str, np.ndarray]:
    """The drafter's weights under the layout's names (layer names under `prefix`), float32,
    with EAGLE-3's d2t and t2d."""
    c = drafter.config
    p = drafter.params
    tensors = {}
    for name, (key, _, to_hf) in _layer_names(prefix, eagle3, eagle3).items():
        value = np.asarray(p["layers"][0][key]["scale"] if key.endswith("norm")
                           else p["layers"][0][key], np.float32)
        tensors[name] = to_hf(value) if to_hf is not None else value
    tensors["fc.weight"] = np.asarray(p["fc"]["w"], np.float32)
    if not eagle3:
        tensors["fc.bias"] = np.asarray(p["fc"]["b"], np.float32)
    else:
        tensors["norm.weight"] = np.asarray(p["final_norm"]["scale"], np.float32)
        tensors["lm_head.weight"] = np.asarray(p["lm_head"], np.float32)
        ids = drafter.token_ids.astype(np.int64)
        tensors["d2t"] = ids - np.arange(len(ids), dtype=np.int64)
        t2d = np.zeros(c.layer.vocab_size, bool)
        t2d[ids] = True
        tensors["t2d"] = t2d
    if "embed" in p:
        tensors["embed_tokens.weight"] = np.asarray(p["embed"], np.float32)
    return tensors


def _drafter_config_json(drafter: Drafter, layout: str, eagle3: bool) -> dict:
    """config.json in `layout`: the layer's Llama config and the layout's own keys, with the
    drafter's target and trees."""
    c = drafter.config
    layer = {k: v for k, v in c.layer.to_hf().items() if k not in ("architectures",)}
    layer.update(num_hidden_layers=1, tie_word_embeddings=False, torch_dtype="float32")
    base = drafter.target.get("name")
    if layout == "speculators":
        config = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
                  "transformer_layer_config": layer, "draft_vocab_size": c.subset_size,
                  "norm_before_residual": c.norm_before_residual,
                  "target_hidden_size": c.target_width,
                  "eagle_aux_hidden_state_layer_ids": list(c.taps),
                  "speculators_config": {
                      "algorithm": "eagle3", "default_proposal_method": "greedy",
                      "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens":
                                            drafter.tree.max_depth if drafter.tree else
                                            _DEFAULT_CHAIN}],
                      "verifier": {"name_or_path": base}}}
    elif eagle3:
        config = dict(layer, architectures=["LlamaForCausalLMEagle3"],
                      draft_vocab_size=c.subset_size,
                      eagle_config={"eagle_aux_hidden_state_layer_ids": list(c.taps)},
                      **({"target_hidden_size": c.feature_size} if c.feature_size else {}),
                      **({"norm_before_residual": True} if c.norm_before_residual else {}))
    else:
        config = dict(layer, architectures=["LlamaForCausalLM"], bias=True)
    if base and layout != "speculators":
        config["base_model_name_or_path"] = base
    for key, tree in (("eagle_tree", drafter.tree), ("eagle_sampled_tree", drafter.sampled_tree)):
        if tree is not None:
            config[key] = _eagle_tree_json(tree)
    return config
