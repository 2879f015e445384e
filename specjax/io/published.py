"""The field's drafter layouts on disk: EAGLE-1/2, EAGLE-3 and Medusa-1 as their authors'
code and the engines that load them (vLLM, SGLang, TensorRT-LLM, llama.cpp) read them.

| layout                         | config.json                            | weights                       |
|--------------------------------|----------------------------------------|-------------------------------|
| EAGLE-3, the EAGLE repo and    | a Llama config, num_hidden_layers 1,   | model.safetensors or          |
| SpecForge ("eagle")            | draft_vocab_size (+ target_hidden_size)| pytorch_model.bin: midlayer.*,|
|                                |                                        | fc, norm, lm_head, d2t, t2d   |
| EAGLE-3, vllm-project/         | speculators_model_type "eagle3",       | model.safetensors: layers.0.* |
| speculators ("speculators")    | transformer_layer_config, ...          | and the same others           |
| EAGLE-1/2 ("eagle")            | a Llama config, num_hidden_layers 1    | fc (+ bias), layers.0.* (no   |
|                                |                                        | input_layernorm)              |
| Medusa-1 ("medusa")            | medusa_num_heads, medusa_num_layers    | medusa_lm_head.safetensors or |
|                                | (+ medusa_choices: the tree, optional) | .pt: {k}.{j}.linear, {k}.{L}  |

`d2t` is an offset (draft id i is target id i + d2t[i]); `t2d` marks the target ids the draft
vocabulary covers. The tree a drafter was tuned with travels in config.json's optional `eagle_tree`
(and the one for sampled rows, where it has its own, in `eagle_sampled_tree`), specjax's keys (the
EAGLE repo passes the same numbers to `EaModel` as arguments, and the engines take them as serving
options): EAGLE-2's dynamic tree as {"depth", "top_k", "total_token"}, a static tree as its paths,
like Medusa's `medusa_choices`. The speculators layout also states a chain of the tree's depth as
its greedy proposal (`speculative_tokens`), which is what vLLM reads. `embed_tokens.weight` is
optional: without it the drafter reads tokens through the target's embeddings. EAGLE-3's taps come
from `eagle_aux_hidden_state_layer_ids` (top level or under `eagle_config`); a checkpoint without
them gets the EAGLE repo's default (`heads.eagle.default_taps`) once it meets its target.

A torch pickle (`.bin`, `.pt`) is read only through `torch.load(weights_only=True)`, which
refuses anything but tensors; without torch it is refused with a message that says how to
convert it. Nothing here unpickles arbitrary objects.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from safetensors.numpy import save_file

from specjax.heads.eagle import Drafter, DrafterConfig, layer_config
from specjax.heads.medusa import Heads, HeadsConfig
from specjax.io.errors import CheckpointError
from specjax.io.sidecar import json_object, read_tensors
from specjax.model.config import ConfigError, ModelConfig
from specjax.sampling.tree import DynamicTree, Tree, TreeError

__all__ = ["DRAFTER_FORMATS", "HEADS_FORMATS", "is_published_drafter", "is_published_heads",
           "load_published_drafter", "load_published_heads", "read_weights",
           "save_published_drafter", "save_published_heads"]

DRAFTER_FORMATS = ("specjax", "eagle", "speculators")
HEADS_FORMATS = ("specjax", "medusa")
_SPECULATORS_OFF = ("norm_before_fc", "fc_norm", "norm_output")   # options not implemented
_DEFAULT_CHAIN = 4      # the chain a drafter without a tree drafts (`generate`'s k)
# Tensors of speculators' training checkpoints that inference does not read.
_TRAINING_ONLY = ("verifier_norm.weight", "verifier_lm_head.weight")


# -- Reading files ---------------------------------------------------------------------------

def read_weights(directory: Path, stems: tuple[str, ...]) -> tuple[Path, dict[str, np.ndarray]]:
    """The first of `stem`.safetensors, then `stem`.bin / `stem`.pt, that exists, read to numpy
    (floating tensors as float32). A pickle goes through torch's weights_only loader only."""
    for stem in stems:
        file = directory / f"{stem}.safetensors"
        if file.exists():
            return file, read_tensors(file)
    for stem in stems:
        for suffix in (".bin", ".pt"):
            file = directory / f"{stem}{suffix}"
            if file.exists():
                return file, _read_pickle(file)
    names = ", ".join(f"{s}.safetensors" for s in stems)
    raise CheckpointError(f"{directory}: no weights ({names}, or a .bin/.pt torch file)")


def _read_pickle(file: Path) -> dict[str, np.ndarray]:
    how = (f"convert it once where torch is installed: python -c \"import torch; "
           f"from safetensors.torch import save_file; "
           f"save_file(torch.load('{file.name}', weights_only=True), "
           f"'{file.stem}.safetensors')\"")
    try:
        import torch   # lazy: torch is optional, needed only for the pickled (.bin/.pt) layouts
    except ImportError:
        raise CheckpointError(f"{file}: a torch pickle, which specjax never unpickles without "
                              f"torch's weights_only loader (torch is not installed); {how}") \
            from None
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:   # noqa: BLE001 - torch raises many kinds for a hostile file
        raise CheckpointError(f"{file}: not a plain tensor file for torch's weights_only "
                              f"loader ({type(e).__name__}: {str(e)[:200]}); {how}") from None
    if not isinstance(state, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise CheckpointError(f"{file}: expected a dict of tensors")
    return {k: (v.float() if v.is_floating_point() else v).numpy() for k, v in state.items()}


def _config(directory: Path) -> dict:
    return json_object(directory / "config.json")


def _weight_names(directory: Path) -> set[str]:
    """The tensor names of model.safetensors (its header only), for telling layouts apart."""
    file = directory / "model.safetensors"
    try:
        with file.open("rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 0 < size < 100_000_000:
                return set()
            header = json.loads(f.read(size))
            return set(header) - {"__metadata__"} if isinstance(header, dict) else set()
    except (OSError, ValueError, RecursionError):
        return set()


# -- Telling the layouts apart ----------------------------------------------------------------

def is_published_drafter(directory: Path) -> bool:
    """Whether `directory` holds an EAGLE-1/2 or EAGLE-3 drafter in a published layout."""
    try:
        raw = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError, RecursionError):
        return False
    if not isinstance(raw, dict):
        return False
    if raw.get("speculators_model_type") is not None or "draft_vocab_size" in raw:
        return True
    archs = raw.get("architectures") or []
    if isinstance(archs, list) and any("eagle" in str(a).lower() for a in archs):
        return True
    names = _weight_names(directory)
    if (directory / "pytorch_model.bin").exists() and raw.get("num_hidden_layers") == 1 \
            and "model_type" in raw and not (directory / "tokenizer.json").exists():
        return True        # EAGLE-1 heads ship as a pickle beside a one-layer Llama config
    return "fc.weight" in names and ("midlayer.self_attn.q_proj.weight" in names
                                     or "layers.0.self_attn.q_proj.weight" in names)


def is_published_heads(directory: Path) -> bool:
    try:
        raw = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(raw, dict) and "medusa_num_heads" in raw


# -- EAGLE drafters ---------------------------------------------------------------------------

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


def _check(file: Path, tensors: dict, expected: dict, optional: dict) -> None:
    for name, shape in {**expected, **{k: v for k, v in optional.items() if k in tensors}}.items():
        if name not in tensors:
            raise CheckpointError(f"{file}: missing tensor {name!r}")
        if tuple(tensors[name].shape) != tuple(shape):
            raise CheckpointError(f"{file}: tensor {name!r} has shape "
                                  f"{tuple(tensors[name].shape)}, expected {tuple(shape)}")
        if tensors[name].dtype.kind == "f" and not np.all(np.isfinite(tensors[name])):
            raise CheckpointError(f"{file}: tensor {name!r} has non-finite values")
    extra = sorted(set(tensors) - set(expected) - set(optional) - set(_TRAINING_ONLY))
    if extra:
        raise CheckpointError(f"{file}: unexpected tensor(s) {extra[:5]}")


def _float(file, tensors, name):
    if tensors[name].dtype.kind != "f":
        raise CheckpointError(f"{file}: tensor {name!r} has dtype {tensors[name].dtype}, "
                              f"expected a float")
    return jnp.asarray(tensors[name], jnp.float32)


def _identity(name, vocab: int, width: int) -> dict:
    """What a published checkpoint tells of its target: the vocabulary and the width (and the
    base model's name where it gives one); `io.sidecar.check_target` checks what is there."""
    return {"name": name, "config": {"vocab_size": vocab, "d_model": width}}


MAX_VOCAB = 2**24      # more ids than any tokenizer has (the largest are about 2**18)


def load_published_drafter(directory: str | Path) -> Drafter:
    """Reads an EAGLE-1/2 or EAGLE-3 drafter in a published layout (module docstring); every
    error is a CheckpointError naming the file and, where one is at fault, the tensor."""
    directory = Path(directory).expanduser()
    file = directory / "config.json"
    raw = _config(directory)
    speculators = raw.get("speculators_model_type")
    if speculators is not None and speculators != "eagle3":
        raise CheckpointError(f"{file}: speculators_model_type {speculators!r} is not supported "
                              f"(only 'eagle3')")
    for option in _SPECULATORS_OFF:
        if raw.get(option):
            raise CheckpointError(f"{file}: {option}: true is not supported")
    eagle3 = speculators is not None or "draft_vocab_size" in raw
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
    _check(weights, tensors, expected, optional)
    ids = _draft_ids(weights, tensors, config.subset_size, vocab)

    layer_params = {}
    for name, (key, to_specjax, _) in _layer_names(prefix, eagle3, eagle3).items():
        value = _float(weights, tensors, name)
        if to_specjax is not None:
            heads = layer.n_heads if key in ("wq", "wo") else layer.n_kv_heads
            value = to_specjax(value, heads)
        layer_params[key] = {"scale": value} if key.endswith("norm") else value
    params = {"layers": [layer_params], "fc": {"w": _float(weights, tensors, "fc.weight")}}
    if "fc.bias" in expected:
        params["fc"]["b"] = _float(weights, tensors, "fc.bias")
    elif not eagle3:
        params["fc"]["b"] = jnp.zeros((d,), jnp.float32)
    if eagle3:
        params["final_norm"] = {"scale": _float(weights, tensors, "norm.weight")}
        params["lm_head"] = _float(weights, tensors, "lm_head.weight")
    if "embed_tokens.weight" in tensors:
        params["embed"] = _float(weights, tensors, "embed_tokens.weight")
        config = dataclasses.replace(config, own_embeddings=True)
    verifier = raw.get("speculators_config")
    verifier = verifier.get("verifier") if isinstance(verifier, dict) else None
    name = raw.get("base_model_name_or_path") or (
        verifier.get("name_or_path") if isinstance(verifier, dict) else None)
    return Drafter(config, params, ids, _identity(name, vocab, width),
                   _eagle_tree(file, raw, "eagle_tree"), directory,
                   sampled_tree=_eagle_tree(file, raw, "eagle_sampled_tree"))


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
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
              str(directory / "model.safetensors"), metadata={"format": "pt"})
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
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory


# -- Medusa-1 heads ---------------------------------------------------------------------------

def load_published_heads(directory: str | Path) -> Heads:
    """Reads Medusa-1 heads as FasterDecoding publishes them: each head ResBlocks then its own
    full-vocabulary LM head."""
    directory = Path(directory).expanduser()
    file = directory / "config.json"
    raw = _config(directory)
    k, blocks = raw.get("medusa_num_heads"), raw.get("medusa_num_layers", 1)
    for name, value in (("medusa_num_heads", k), ("medusa_num_layers", blocks)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"{file}: {name} must be a positive integer, got {value!r}")
    weights, tensors = read_weights(directory, ("medusa_lm_head", "model"))
    if tensors and all(n.startswith("medusa_head.") for n in tensors):
        tensors = {n[len("medusa_head."):]: v for n, v in tensors.items()}
    head = tensors.get(f"0.{blocks}.weight")
    if head is None or head.ndim != 2:
        raise CheckpointError(f"{weights}: missing tensor '0.{blocks}.weight' (head 0's LM head "
                              f"after its {blocks} block(s))")
    vocab, d = head.shape
    if k * (2 * blocks + 1) != len(tensors):       # before listing what k heads would need
        raise CheckpointError(f"{weights}: holds {len(tensors)} tensors, but {file.name} "
                              f"says {k} head(s) of {blocks} block(s): {k * (2 * blocks + 1)}")
    for name, value in (("hidden_size", d), ("vocab_size", vocab)):
        if raw.get(name) not in (None, value):
            raise CheckpointError(f"{file}: {name} {raw[name]} disagrees with the weights' "
                                  f"{value}")
    expected = {}
    for i in range(k):
        for j in range(blocks):
            expected[f"{i}.{j}.linear.weight"] = (d, d)
            expected[f"{i}.{j}.linear.bias"] = (d,)
        expected[f"{i}.{blocks}.weight"] = (vocab, d)
    _check(weights, tensors, expected, {})
    try:
        config = HeadsConfig(k, blocks, d, vocab, vocab, head="own")
    except ValueError as e:
        raise CheckpointError(f"{file}: {e}") from None
    tree = _medusa_choices(file, raw.get("medusa_choices"), k)
    params = {"blocks": [[{"w": _float(weights, tensors, f"{i}.{j}.linear.weight").T,
                           "b": _float(weights, tensors, f"{i}.{j}.linear.bias")}
                          for j in range(blocks)] for i in range(k)],
              "lm_heads": [_float(weights, tensors, f"{i}.{blocks}.weight") for i in range(k)]}
    return Heads(config, params, np.arange(vocab, dtype=np.int32),
                 _identity(raw.get("base_model_name_or_path"), vocab, d), tree, directory)


def _medusa_choices(file: Path, value, heads: int) -> Tree | None:
    """The tree in config.json's optional `medusa_choices`: FasterDecoding's name for it (its
    decoding takes the paths of child ranks as an argument of that name; specjax writes them
    here so that the heads and their tree travel together). Absent: None."""
    if value is None:
        return None
    try:
        tree = Tree.from_paths(value)
    except TreeError as e:
        raise CheckpointError(f"{file}: medusa_choices: {e}") from None
    if tree.max_depth > heads:
        raise CheckpointError(f"{file}: medusa_choices is {tree.max_depth} deep but there are "
                              f"only {heads} heads")
    return tree


def save_published_heads(heads: Heads, directory: Path) -> Path:
    """Writes Medusa-1 heads as FasterDecoding's (config.json, medusa_lm_head.safetensors)."""
    c = heads.config
    if c.head != "own":
        raise ValueError(f"{heads.name} predicts through the target's LM-head rows for a "
                         f"subset (specjax's variant), which Medusa's layout cannot hold: save "
                         f"it with format='specjax'")
    tensors = {}
    for i, blocks in enumerate(heads.params["blocks"]):
        for j, block in enumerate(blocks):
            tensors[f"{i}.{j}.linear.weight"] = np.asarray(block["w"], np.float32).T
            tensors[f"{i}.{j}.linear.bias"] = np.asarray(block["b"], np.float32)
        tensors[f"{i}.{c.num_blocks}.weight"] = np.asarray(heads.params["lm_heads"][i],
                                                           np.float32)
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
              str(directory / "medusa_lm_head.safetensors"), metadata={"format": "pt"})
    config = {"medusa_num_heads": c.num_heads, "medusa_num_layers": c.num_blocks,
              "base_model_name_or_path": heads.target.get("name"),
              "hidden_size": c.hidden_size, "vocab_size": c.vocab_size,
              **({"medusa_choices": [list(p) for p in heads.tree.paths]}
                 if isinstance(heads.tree, Tree) else {})}
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory
