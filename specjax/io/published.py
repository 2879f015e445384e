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

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from safetensors.numpy import save_file

from specjax.heads.medusa import Heads, HeadsConfig
from specjax.io.errors import CheckpointError
from specjax.io.sidecar import json_object, read_tensors
from specjax.sampling.tree import Tree, TreeError

__all__ = ["DRAFTER_FORMATS", "HEADS_FORMATS", "is_published_drafter", "is_published_heads",
           "load_published_heads", "read_weights", "save_published_heads"]

DRAFTER_FORMATS = ("specjax", "eagle", "speculators")
HEADS_FORMATS = ("specjax", "medusa")
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


def read_config(directory: Path) -> dict:
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


# -- What both kinds check -------------------------------------------------------------------

def check_tensors(file: Path, tensors: dict, expected: dict, optional: dict) -> None:
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


def float_tensor(file, tensors, name):
    if tensors[name].dtype.kind != "f":
        raise CheckpointError(f"{file}: tensor {name!r} has dtype {tensors[name].dtype}, "
                              f"expected a float")
    return jnp.asarray(tensors[name], jnp.float32)


def identity(name, vocab: int, width: int) -> dict:
    """What a published checkpoint tells of its target: the vocabulary and the width (and the
    base model's name where it gives one); `io.sidecar.check_target` checks what is there."""
    return {"name": name, "config": {"vocab_size": vocab, "d_model": width}}


# -- Medusa-1 heads ---------------------------------------------------------------------------

def load_published_heads(directory: str | Path) -> Heads:
    """Reads Medusa-1 heads as FasterDecoding publishes them: each head ResBlocks then its own
    full-vocabulary LM head."""
    directory = Path(directory).expanduser()
    file = directory / "config.json"
    raw = read_config(directory)
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
    check_tensors(weights, tensors, expected, {})
    try:
        config = HeadsConfig(k, blocks, d, vocab, vocab, head="own")
    except ValueError as e:
        raise CheckpointError(f"{file}: {e}") from None
    tree = _medusa_choices(file, raw.get("medusa_choices"), k)
    params = {"blocks": [[{"w": float_tensor(weights, tensors, f"{i}.{j}.linear.weight").T,
                           "b": float_tensor(weights, tensors, f"{i}.{j}.linear.bias")}
                          for j in range(blocks)] for i in range(k)],
              "lm_heads": [float_tensor(weights, tensors, f"{i}.{blocks}.weight") for i in range(k)]}
    return Heads(config, params, np.arange(vocab, dtype=np.int32),
                 identity(raw.get("base_model_name_or_path"), vocab, d), tree, directory)


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
