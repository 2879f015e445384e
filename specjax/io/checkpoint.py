"""Loading and saving Hugging Face checkpoint directories.

A checkpoint directory holds `config.json`, the weights (`model.safetensors`, or shards listed
in `model.safetensors.index.json`) and usually `tokenizer.json`. One explicit name table per
architecture (`specjax.io.hf_names`) maps each Hugging Face tensor to a leaf of specjax's parameter
tree, with the transform between the two layouts; every tensor's shape is checked against
`model.param_shapes` before it is used.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file
from tokenizers import Tokenizer

from specjax import mesh as meshes
from specjax.io.dflash import is_dflash_dir, load_block_drafter
from specjax.io.eagle import is_eagle_dir, load_drafter
from specjax.io.errors import CheckpointError
from specjax.io.fetch import cache_root
from specjax.io.gguf import convert_gguf, q8_0_matrices
from specjax.io.hf_names import IGNORED_SUFFIXES, canonical, name_table
from specjax.io.medusa import is_heads_dir, load_heads
from specjax.io.sidecar import json_object
from specjax.model.config import ConfigError, ModelConfig
from specjax.model.quant import EIGHT_BIT, Int8Weight, convert, dequantize
from specjax.model.params import Params, init_params, param_shapes, unstack_layers
from specjax.model.transformer import Model

# -- Loading ------------------------------------------------------------------------------------

def _weight_files(directory: Path) -> list[Path]:
    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    if single.exists():
        return [single]
    if index.exists():
        weight_map = json_object(index).get("weight_map")
        if not (isinstance(weight_map, dict) and all(isinstance(f, str) for f in weight_map.values())):
            raise CheckpointError(f"{index}: not a valid safetensors index (no weight_map of "
                                  f"tensor names to file names)")
        files = sorted(set(weight_map.values()))
        # Shards are files in this directory: a name with a path in it ("../x", "/dev/stdin")
        # would read elsewhere, or block.
        elsewhere = [f for f in files if f != Path(f).name or f in ("", ".", "..")]
        if elsewhere:
            raise CheckpointError(f"{index} lists shard files outside its directory: {elsewhere[:5]}")
        missing = [f for f in files if not (directory / f).is_file()]
        if missing:
            raise CheckpointError(f"{index} lists shard files that are missing: {missing}")
        return [directory / f for f in files]
    raise CheckpointError(f"{directory}: no model.safetensors or model.safetensors.index.json")


def _read_tensors(files: list[Path]) -> dict[str, tuple[np.ndarray, Path]]:

    tensors = {}
    for f in files:
        try:
            try:
                with safe_open(f, framework="numpy") as reader:
                    for name in reader.keys():
                        tensors[name] = (reader.get_tensor(name), f)
            except (TypeError, ValueError) as e:
                if "bf16" not in str(e) and "bfloat16" not in str(e).lower():
                    raise
                tensors.update(_read_bfloat16(f))
        except (SafetensorError, OSError, ValueError, TypeError) as e:
            raise CheckpointError(f"{f}: corrupt or unreadable safetensors file ({e})") from None
    return tensors


def _read_bfloat16(f: Path) -> dict[str, tuple[np.ndarray, Path]]:
    # numpy has no bfloat16; read through JAX, which does, and upcast to float32.

    with safe_open(f, framework="flax") as reader:
        return {name: (np.asarray(reader.get_tensor(name).astype(jnp.float32)), f)
                for name in reader.keys()}


def load_params(directory: Path, config: ModelConfig, mesh=None) -> Params:
    """Reads the weights of `directory` into specjax's parameter tree (float32 numpy -> jax),
    each array placed on one device, or with `mesh` straight from the host to its shards
    (`specjax.mesh.place`)."""
    tensors = {canonical(k, config): v for k, v in _read_tensors(_weight_files(directory)).items()}
    if config.n_layers > len(tensors):  # before anything is built per layer
        raise CheckpointError(f"{directory}: config.json has {config.n_layers} layers, but the "
                              f"weights hold {len(tensors)} tensors in all")
    shapes = param_shapes(config)
    table = name_table(config)
    leaves: dict[tuple, np.ndarray] = {}     # path in the tree (layer index included) -> array
    used = set()
    for entry in table:
        per_layer = "{i}" in entry.hf_name
        for i in range(config.n_layers if per_layer else 1):
            name = entry.hf_name.format(i=i)
            path = ("layers", i, *entry.path[1:]) if per_layer else entry.path
            if name not in tensors:
                raise CheckpointError(f"{directory}: missing tensor {name!r}")
            array, file = tensors[name]
            used.add(name)
            if not jnp.issubdtype(array.dtype, jnp.floating):
                raise CheckpointError(f"{file}: tensor {name!r} has dtype {array.dtype}, "
                                      f"not a floating-point type")
            try:
                piece = entry.to_specjax(array.astype(np.float32))
            except ValueError:
                piece = None
            want = tuple(_leaf(shapes, entry.path))[int(per_layer):]
            if piece is None or piece.shape != want:
                raise CheckpointError(f"{file}: tensor {name!r} has shape {tuple(array.shape)}, "
                                      f"which does not fit the config (expected {want} after "
                                      f"the layout change)")
            leaves[path] = piece

    unexpected = sorted(n for n in tensors if n not in used and not _ignorable(n, config))
    if unexpected:
        file = tensors[unexpected[0]][1]
        raise CheckpointError(f"{file}: unexpected tensor(s) {unexpected[:5]} "
                              f"for a {config.model_type or config.arch} model")
    # Each layer's tensors stacked along L on the host, as `forward` takes them.
    stacked: dict[tuple, np.ndarray] = {}
    for path, array in leaves.items():
        if path[0] != "layers":
            stacked[path] = array
        elif path[1] == 0:
            stacked[("layers", *path[2:])] = np.stack(
                [leaves[("layers", i, *path[2:])] for i in range(config.n_layers)])
    dtype = jnp.dtype(config.compute_dtype)
    shardings = meshes.param_shardings(config, mesh) if mesh is not None else None
    params: Params = {}
    for path, array in stacked.items():
        node = params
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = (jnp.asarray(array, dtype) if mesh is None
                          else meshes.place(array, _leaf(shardings, path), dtype))
    # 8-bit weights are quantised from the float32 ones here, as ggml's Q8_0 quantiser does
    # (a Q8_0 GGUF is read as it is instead: `load`).
    return convert(params, config.dtype) if config.dtype in EIGHT_BIT else params


def _ignorable(name: str, config: ModelConfig) -> bool:
    if name.endswith(IGNORED_SUFFIXES):
        return True
    # A tied model's checkpoint sometimes stores the (identical) head too; it is not used.
    return config.tie_embeddings and name == "lm_head.weight"


def _leaf(tree, path):
    for key in path:
        tree = tree[key]
    return tree


def load(path: str | Path, dtype: str = "float32", mesh=None):
    """Loads a Hugging Face checkpoint directory (or a GGUF file, converted first) as a `Model`,
    or a directory of Medusa heads (config.json's model_type "medusa") as `medusa.Heads`, an
    EAGLE drafter's as `eagle.Drafter`, a DFlash drafter's (`specjax.io.dflash`) as
    `dflash.BlockDrafter`.

    Args:
      path: a directory with config.json, safetensors weights and (optionally) tokenizer.json.
      dtype: "float32" (default) or "bfloat16" for parameters and compute, or "int8": every
        matrix in 8 bits (`specjax.model.quant`), quantised at load as ggml's Q8_0 does, or,
        from a GGUF file, its Q8_0 tensors as they are stored; activations in float32. "q8_0":
        the same matrices, and every product quantises its activations too (llama.cpp's
        Q8_0 x Q8_0, `specjax.model.linear`).
      mesh: a "data" x "model" device mesh (`specjax.mesh.make_mesh`): each weight goes from the
        host straight to its shards (`specjax.mesh`), never whole onto one device. Medusa heads
        ignore it (they are replicated when `generate` runs on a mesh).
    Raises:
      CheckpointError: for any missing, unreadable, corrupt or unsupported file, GGUF files
        included; the message names the file (or the directory) and, where one is at fault,
        the tensor.
    """
    path = Path(path).expanduser()
    gguf_file = None
    if path.is_file() and path.suffix == ".gguf":
        gguf_file, path = path, convert_gguf(path, cache_root() / "gguf" / path.stem)
    if not path.exists():
        raise CheckpointError(f"checkpoint directory {str(path)!r} does not exist")
    if not path.is_dir():
        raise CheckpointError(f"{str(path)!r} is not a checkpoint directory (or a .gguf file)")
    if is_heads_dir(path):
        return load_heads(path)
    if is_dflash_dir(path):          # before EAGLE's: its weights have fc and layers.0 too
        return load_block_drafter(path)
    if is_eagle_dir(path):
        return load_drafter(path)
    config = _model_config(path, dtype, mesh)
    params = load_params(path, config, mesh)
    if gguf_file is not None and dtype in EIGHT_BIT:
        params = _stored_q8_0(params, config, q8_0_matrices(gguf_file))
    tokenizer = load_tokenizer(path)
    if tokenizer is not None and tokenizer.get_vocab_size(with_added_tokens=True) > config.vocab_size:
        raise CheckpointError(f"{path}: tokenizer.json has {tokenizer.get_vocab_size()} tokens but "
                              f"the model's vocab_size is {config.vocab_size}")
    return Model(config, params, tokenizer, path, _chat_template(path))


def _model_config(path: Path, dtype: str, mesh) -> ModelConfig:
    """The directory's config.json as a `ModelConfig` in `dtype` (with generation_config.json's
    EOS ids), checked to run on `mesh`; a bad file or setting is a CheckpointError."""
    file = path / "config.json"
    if not file.exists():
        raise CheckpointError(f"missing {file}")
    hf = json_object(file)
    try:
        config = ModelConfig.from_hf(hf, source=str(file))
    except ConfigError as e:
        raise CheckpointError(str(e)) from None
    except (TypeError, ValueError, ArithmeticError) as e:   # "hidden_size": "32", 0 heads, ...
        raise CheckpointError(f"{file}: a value has the wrong type or range ({e})") from None
    config = _with_generation_eos(config, path)
    config = config.replace(dtype=dtype)
    if mesh is not None:
        if dtype in EIGHT_BIT:
            raise CheckpointError(f"{dtype} weights do not run on a device mesh: load them "
                                  "without one, or as float32 or bfloat16")
        try:
            meshes.check_mesh(mesh)
        except meshes.MeshError as e:
            raise CheckpointError(str(e)) from None
    return config


def _stored_q8_0(params: Params, config: ModelConfig, stored: dict) -> Params:
    """params with each matrix that a GGUF file stores as Q8_0 (`q8_0_matrices`, by Hugging
    Face name) taken as it is stored, instead of quantised again from its dequantised values."""
    for entry in name_table(config):
        per_layer = "{i}" in entry.hf_name
        names = [entry.hf_name.format(i=i) for i in range(config.n_layers if per_layer else 1)]
        if not any(name in stored for name in names):
            continue
        node = _leaf(params, entry.path[:-1])
        quantized = node[entry.path[-1]]
        values, scales = np.array(quantized.values), np.array(quantized.scales)
        for i, name in enumerate(names):
            if name in stored:
                at = (i,) if per_layer else ()
                values[at] = stored[name][0].reshape(values[at].shape)
                scales[at] = stored[name][1].reshape(scales[at].shape)
        node[entry.path[-1]] = type(quantized)(jnp.asarray(values), jnp.asarray(scales))
    return params


def _with_generation_eos(config: ModelConfig, path: Path) -> ModelConfig:
    gen = path / "generation_config.json"
    if not gen.exists():
        return config
    contents = json_object(gen)
    eos = contents.get("eos_token_id")
    if eos is None:
        return config
    eos = tuple(eos) if isinstance(eos, list) else (eos,)
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in eos):
        raise CheckpointError(f"{gen}: eos_token_id must be a token id or a list of them, "
                              f"got {contents['eos_token_id']!r}")
    return config.replace(eos_token_ids=tuple(dict.fromkeys(config.eos_token_ids + eos)))


def load_tokenizer(path: Path):
    file = path / "tokenizer.json"
    if not file.exists():
        return None

    try:
        return Tokenizer.from_file(str(file))
    except Exception as e:  # tokenizers raises a bare Exception for malformed files
        raise CheckpointError(f"{file}: cannot read tokenizer ({e})") from None


def _chat_template(path: Path) -> str | None:
    file = path / "tokenizer_config.json"
    if not file.exists():
        return None
    template = json_object(file).get("chat_template")
    return template if isinstance(template, str) else None


# -- Random models and saving -------------------------------------------------------------------

def random_model(config: ModelConfig, seed: int = 0, std: float = 0.02, tokenizer=None) -> Model:
    """A model with random weights: tiny models for tests and statistical checks."""
    return Model(config, init_params(config, jax.random.key(seed), std), tokenizer)


def save(model: Model, directory: str | Path, dtype: str = "float32") -> Path:
    """Writes `model` as a Hugging Face checkpoint directory that transformers can load.

    Args:
      dtype: storage dtype of the weights, "float32", "float16" or "bfloat16" (loading upcasts).
    """

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = model.config
    # 8-bit matrices are written as the float32 numbers they stand for (and the config says
    # float32): Hugging Face's layout has no Q8_0.
    params = jax.tree.map(lambda a: np.asarray(dequantize(a) if isinstance(a, Int8Weight) else a,
                                               np.float32),
                          model.params, is_leaf=lambda a: isinstance(a, Int8Weight))
    params["layers"] = unstack_layers(params["layers"])
    tensors: dict[str, np.ndarray] = {}
    for entry in name_table(config):
        if entry.to_hf is None:
            continue
        if "{i}" in entry.hf_name:
            for i in range(config.n_layers):
                array = _leaf(params, ("layers", i, *entry.path[1:]))
                tensors[entry.hf_name.format(i=i)] = entry.to_hf(array)
        else:
            tensors[entry.hf_name] = entry.to_hf(_leaf(params, entry.path))
    if config.arch == "gpt2":
        _gpt2_c_attn(params, config, tensors)
        tensors = {"transformer." + k if not k.startswith("lm_head") else k: v
                   for k, v in tensors.items()}
    if dtype == "bfloat16":
        store = {k: np.ascontiguousarray(v).astype(ml_dtypes.bfloat16) for k, v in tensors.items()}
    else:
        store = {k: np.ascontiguousarray(v.astype(np.dtype(dtype))) for k, v in tensors.items()}
    weights = directory / "model.safetensors"
    save_file(store, str(weights), metadata={"format": "pt"})
    weights.chmod(0o644)    # save_file creates the file readable by its owner only
    # The stored dtype is only a compact encoding: both specjax and transformers (which loads
    # in config.json's torch_dtype) should compute in float32 by default.
    hf = config.to_hf()
    (directory / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    if model.tokenizer is not None:
        model.tokenizer.save(str(directory / "tokenizer.json"))
    return directory


def _gpt2_c_attn(params: Params, config: ModelConfig, tensors: dict[str, np.ndarray]) -> None:
    D = config.d_model
    layers = params["layers"]
    for i in range(config.n_layers):
        w = [layers[i][n].reshape(D, D).T for n in ("wq", "wk", "wv")]      # [in, out]
        b = [layers[i][n].reshape(D) for n in ("bq", "bk", "bv")]
        tensors[f"h.{i}.attn.c_attn.weight"] = np.concatenate(w, axis=-1)
        tensors[f"h.{i}.attn.c_attn.bias"] = np.concatenate(b, axis=-1)
