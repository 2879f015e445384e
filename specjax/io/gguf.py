"""Convert a llama- or qwen3-architecture GGUF file into a Hugging Face checkpoint directory.

GGUF is llama.cpp's single-file format: hyperparameters, the tokenizer and (often quantized)
tensors in one file. specjax itself only reads Hugging Face layout (config.json +
*.safetensors + tokenizer.json), so a GGUF is converted once, offline:

    convert_gguf("SmolLM2-135M-Instruct.Q4_1.gguf", "out/")  ->  out/config.json,
        model.safetensors (float32), generation_config.json, tokenizer.json,
        tokenizer_config.json (with the chat template), special_tokens_map.json

Every tensor is dequantized to float32, so the result is exactly the model llama.cpp runs
from that file, not the unquantized original. Below the conversion, what it reads, in two parts:
the file (opened with bounded reads, its metadata checked as it is read, the hyperparameters,
every tensor dequantized under its Hugging Face name with q and k rows un-permuted where
llama.cpp permuted them, and the Q8_0 matrices as they are stored, `q8_0_matrices`), then the
tokenizer the metadata holds, rebuilt as a Hugging Face `tokenizers.Tokenizer`. The `gguf`
package (pip install specjax[gguf]) does the parsing and the dequantization. Writing GGUF
files is `specjax.io.gguf_write`.

Shape letters as in STYLE.md: V vocab, D width, F MLP width, N query heads, K KV heads,
H head size, L layers.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from specjax.io.errors import CheckpointError
from specjax.model.config import ConfigError, ModelConfig


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# Written beside the converted checkpoint: which GGUF file it came from (`io.fetch.source_gguf`).
SOURCE_FILE = "gguf_source.json"


def convert_gguf(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """Convert a llama- or qwen3-architecture GGUF file into a Hugging Face checkpoint
    directory.

    Args:
        gguf_path: the .gguf file (any tensor type the gguf package dequantizes).
        out_dir: created if needed; config.json, model.safetensors (float32),
            generation_config.json, tokenizer.json, tokenizer_config.json,
            special_tokens_map.json and gguf_source.json (the GGUF file's absolute path) are
            (over)written there.
    Returns:
        out_dir as a Path, loadable by transformers' LlamaForCausalLM (Qwen3ForCausalLM for
        qwen3) and by specjax.
    Raises:
        FileNotFoundError: no such file.
        CheckpointError: a corrupt or truncated file, another architecture, an unknown or
            missing tensor, a wrong shape, or an unsupported tokenizer; the message names the file.
    """

    path = Path(gguf_path)
    reader = open_reader(path)
    meta = read_metadata(reader, path)
    hp = read_hparams(meta, path)
    tensors = read_tensors(reader, hp, path)
    tokens = metadata_value(meta, "tokenizer.ggml.tokens", path, kind="a list of strings")
    special_ids = read_special_ids(meta, len(tokens), path)
    tokenizer = build_tokenizer(meta, special_ids, path)
    if tokenizer.get_vocab_size() != hp.V:
        raise CheckpointError(f"{path}: the tokenizer has {tokenizer.get_vocab_size()} tokens, the model {hp.V}")

    # bos/eos/pad ids go into config.json and generation_config.json; unk has no place there.
    token_ids = {f"{k}_token_id": i for k, i in special_ids.items() if k != "unk"}
    # No output.weight in the file means the output layer reuses the token embeddings.
    config = _hf_config(hp, token_ids, tied="lm_head.weight" not in tensors)
    try:  # what specjax.load checks in config.json, checked here to name the GGUF file instead
        ModelConfig.from_hf(config, source=str(path))
    except ConfigError as e:
        raise CheckpointError(str(e)) from None
    specials = {f"{k}_token": tokens[i] for k, i in special_ids.items()}
    named = set(specials.values())
    additional = [
        t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special and t.content not in named
    ]
    tokenizer_config = _tokenizer_config(meta, hp, specials, path)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", token_ids)
    # "format": "pt" tells transformers these tensors are in PyTorch layout.
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt", "source": path.name})
    tokenizer.save(str(out / "tokenizer.json"))
    _write_json(out / "tokenizer_config.json", tokenizer_config)
    _write_json(out / "special_tokens_map.json", {**specials, "additional_special_tokens": additional})
    _write_json(out / SOURCE_FILE, {"gguf": str(path.resolve())})
    return out


def _hf_config(hp: Hparams, token_ids: dict[str, int], tied: bool) -> dict[str, Any]:
    """config.json for the file's hyperparameters, its special token ids, and whether the output
    layer is `tied` to the token embeddings."""
    model_type = ARCHES[hp.arch]
    config = {
        "architectures": ["Qwen3ForCausalLM" if model_type == "qwen3" else "LlamaForCausalLM"],
        "model_type": model_type,
        "vocab_size": hp.V,
        "hidden_size": hp.D,
        "intermediate_size": hp.F,
        "num_hidden_layers": hp.L,
        "num_attention_heads": hp.N,
        "num_key_value_heads": hp.K,
        "head_dim": hp.H,
        "hidden_act": "silu",
        "max_position_embeddings": hp.context_length,
        "rms_norm_eps": hp.rms_norm_eps,
        "rope_theta": hp.rope_theta,
        "rope_scaling": hp.rope_scaling,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": tied,
        **token_ids,
        "torch_dtype": "float32",
    }
    return config


def _tokenizer_config(meta: dict[str, Any], hp: Hparams, specials: dict[str, str],
                      path: Path) -> dict[str, Any]:
    """tokenizer_config.json: the special tokens, BOS/EOS flags, context and chat template."""
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **specials,
        # Whether encode() prepends BOS lives in tokenizer.json's post-processor; these flags
        # only repeat it for readers of this file (SmolLM2: false, the chat template has none).
        "add_bos_token": bool(metadata_value(meta, "tokenizer.ggml.add_bos_token", path, False)),
        "add_eos_token": bool(metadata_value(meta, "tokenizer.ggml.add_eos_token", path, False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": hp.context_length,
    }
    if "tokenizer.chat_template" in meta:
        tokenizer_config["chat_template"] = metadata_value(meta, "tokenizer.chat_template", path, kind="a string")

    return tokenizer_config


# -- The file -------------------------------------------------------------------------------------

# The GGUF architectures that convert, and the Hugging Face model_type each becomes. llama.cpp's
# converter permutes Llama's q and k rows for its interleaved RoPE (`unpermute_rope_rows`);
# Qwen3 runs llama.cpp's NEOX RoPE, on rows stored as Hugging Face stores them, and adds a norm
# per head of q and k (attn_q_norm, attn_k_norm).
ARCHES = {"llama": "llama", "qwen3": "qwen3"}
_PERMUTED = ("llama",)
_MISSING = object()


@dataclass(frozen=True)
class Hparams:
    arch: str
    L: int
    V: int
    D: int
    F: int
    N: int
    K: int
    H: int
    context_length: int
    rope_theta: float
    rms_norm_eps: float
    rope_scaling: dict[str, Any] | None


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation: GGUF order -> Hugging Face order.

    Hugging Face Llama rotates the pair (j, j + H/2) of each head (`rotate_half`); llama.cpp
    rotates adjacent rows (2j, 2j + 1), Meta's original interleaved layout. convert_hf_to_gguf.py
    therefore stores q_proj/k_proj rows permuted per head:

        permute(w, n_head, n_head_kv) = w.reshape(n, 2, H/2, D).swapaxes(1, 2).reshape(w.shape)

    with n = n_head for q and n = n_head_kv for k, so GGUF row 2j + s of a head is Hugging
    Face row s * H/2 + j. The inverse reads the rows as (n, H/2, 2) and swaps back.

    Args:
        w: [n_heads * H, D] rows of attn_q (n_heads = N) or attn_k (n_heads = K), GGUF order.
        n_heads: the number of heads those rows belong to.
    Returns:
        [n_heads * H, D], the same rows in Hugging Face order.
    """
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(f"cannot split {rows} rows into {n_heads} heads of even size")
    # [n*H, D] -> [n, H/2, 2, D] -> [n, 2, H/2, D] -> [n*H, D]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _name_table(hp: Hparams) -> dict[str, tuple[str, tuple[int, ...]]]:
    """GGUF tensor name -> (Hugging Face LlamaForCausalLM name, shape in PyTorch order)."""
    V, D, F, N, K, H = hp.V, hp.D, hp.F, hp.N, hp.K, hp.H
    table = {
        "token_embd.weight": ("model.embed_tokens.weight", (V, D)),
        "output_norm.weight": ("model.norm.weight", (D,)),
        # Absent when the embeddings are tied (then lm_head reuses model.embed_tokens).
        "output.weight": ("lm_head.weight", (V, D)),
    }
    for i in range(hp.L):
        g, h = f"blk.{i}.", f"model.layers.{i}."
        table |= {
            g + "attn_norm.weight": (h + "input_layernorm.weight", (D,)),
            g + "attn_q.weight": (h + "self_attn.q_proj.weight", (N * H, D)),
            g + "attn_k.weight": (h + "self_attn.k_proj.weight", (K * H, D)),
            g + "attn_v.weight": (h + "self_attn.v_proj.weight", (K * H, D)),
            g + "attn_output.weight": (h + "self_attn.o_proj.weight", (D, N * H)),
            g + "ffn_norm.weight": (h + "post_attention_layernorm.weight", (D,)),
            g + "ffn_gate.weight": (h + "mlp.gate_proj.weight", (F, D)),
            g + "ffn_up.weight": (h + "mlp.up_proj.weight", (F, D)),
            g + "ffn_down.weight": (h + "mlp.down_proj.weight", (D, F)),
        }
        if hp.arch == "qwen3":
            table |= {g + "attn_q_norm.weight": (h + "self_attn.q_norm.weight", (H,)),
                      g + "attn_k_norm.weight": (h + "self_attn.k_norm.weight", (H,))}
    return table


def _import_gguf():
    try:   # optional: pip install specjax[gguf]
        import gguf
    except ImportError as e:
        raise ImportError("reading GGUF files needs the gguf package: pip install specjax[gguf]") from e
    return gguf


@functools.cache
def _bounded_reader(gguf):
    class BoundedReader(gguf.GGUFReader):
        """gguf.GGUFReader refusing a count or a length that the file cannot hold.

        The upstream reader (gguf 0.19) slices its memmap without looking at the end of the
        file: a huge string length reads short and goes unnoticed, and an array of 2^64 one-byte
        items, once past the end, loops forever appending empty reads to a list. `_get` and
        `_get_field_parts` are its internal helpers; tests/io/test_loader_fuzz.py notices if they
        stop being called.
        """

        def _get(self, offset, dtype, count=1, override_order=None):
            array = super()._get(offset, dtype, count, override_order)
            if array.size != int(count):
                raise ValueError(f"{int(count)} x {np.dtype(dtype).name} at byte {offset} "
                                 "run past the end of the file")
            return array

        def _get_field_parts(self, orig_offs, raw_type):
            if raw_type == gguf.GGUFValueType.ARRAY:  # [item type: u32][count: u64][items]
                count = int(self._get(orig_offs + 4, np.uint64)[0])
                if count > len(self.data) - orig_offs:  # every item takes at least one byte
                    raise ValueError(f"an array of {count} items at byte {orig_offs} is longer "
                                     "than the file")
            return super()._get_field_parts(orig_offs, raw_type)

    return BoundedReader


def open_reader(path: Path):
    gguf = _import_gguf()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such GGUF file")
    try:
        reader = _bounded_reader(gguf)(path)
    except Exception as e:  # the reader parses untrusted bytes; any failure means a bad file
        raise CheckpointError(f"{path}: not a valid GGUF file (corrupt or truncated?): {e}") from e
    # llama.cpp (gguf.cpp) refuses a file whose tensors are not stored back to back in the order
    # of the tensor infos, each padded to the alignment; the Python reader does not check, so a
    # damaged offset would read another tensor's bytes (or, wrapping around 2^64, the header's).
    # Bytes after the last tensor mean that the data no longer sits where the header says (a
    # byte inserted before it, or a tensor type that shrank the last tensor): refused too.
    expected = 0
    for t in reader.tensors:
        if t.data_offset - reader.data_offset != expected:
            raise CheckpointError(f"{path}: tensor {t.name!r} has offset "
                                  f"{t.data_offset - reader.data_offset}, expected {expected}")
        expected += -(-t.n_bytes // int(reader.alignment)) * int(reader.alignment)
    extra = len(reader.data) - reader.data_offset - expected
    if reader.tensors and extra > 0:
        raise CheckpointError(f"{path}: {extra} bytes after the last tensor (corrupt?)")
    return reader


def read_metadata(reader, path: Path) -> dict[str, Any]:
    meta = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):  # the header, not key/value metadata
            continue
        try:
            meta[key] = field.contents()
        except Exception as e:  # same as open_reader: a corrupt value is a bad file
            raise CheckpointError(f"{path}: unreadable metadata {key!r}: {e}") from e
    return meta


# The type a metadata value must have, by the name used in the error message.
_KINDS = {
    "an integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "a positive integer": lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
    "a number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "a string": lambda v: isinstance(v, str),
    "a list of strings": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "a list of integers": lambda v: isinstance(v, list) and all(_KINDS["an integer"](x) for x in v),
}


def metadata_value(
    meta: dict[str, Any], key: str, path: Path, default: Any = _MISSING, kind: str | None = None
) -> Any:
    if key not in meta:
        if default is _MISSING:
            raise CheckpointError(f"{path}: missing metadata {key!r}")
        return default
    value = meta[key]
    if kind is not None and not _KINDS[kind](value):
        raise CheckpointError(f"{path}: metadata {key!r} is {value!r:.60}, not {kind}")
    return value


def _f32(x: float) -> float:
    # GGUF stores floats as float32; the shortest decimal that round-trips in float32 gives back
    # the value the model was published with (1e-05, not 9.999999747378752e-06).
    return float(str(np.float32(x)))


def read_hparams(meta: dict[str, Any], path: Path) -> Hparams:
    arch = metadata_value(meta, "general.architecture", path)
    if arch not in ARCHES:
        raise CheckpointError(f"{path}: unsupported architecture {arch!r} (only "
                              f"{', '.join(map(repr, ARCHES))} GGUF files convert)")

    def get(key, default=_MISSING, kind="a positive integer"):
        return metadata_value(meta, f"{arch}.{key}", path, default, kind)

    D, N = get("embedding_length"), get("attention.head_count")
    vocab_size = get("vocab_size", None)
    if vocab_size is None:
        vocab_size = len(metadata_value(meta, "tokenizer.ggml.tokens", path, kind="a list of strings"))

    scaling = get("rope.scaling.type", "none", kind=None)
    if scaling == "none":
        rope_scaling = None
    elif scaling == "linear":
        rope_scaling = {"rope_type": "linear", "factor": _f32(get("rope.scaling.factor", kind="a number"))}
    else:
        raise CheckpointError(f"{path}: unsupported rope scaling {scaling!r}")

    return Hparams(
        arch=arch,
        L=get("block_count"),
        V=vocab_size,
        D=D,
        F=get("feed_forward_length"),
        N=N,
        K=get("attention.head_count_kv", N),
        # The rotary size equals the head size for Llama; key_length is the explicit field.
        H=get("attention.key_length", get("rope.dimension_count", D // N)),
        context_length=get("context_length"),
        rope_theta=_f32(get("rope.freq_base", 10000.0, kind="a number")),
        rms_norm_eps=_f32(get("attention.layer_norm_rms_epsilon", kind="a number")),
        rope_scaling=rope_scaling,
    )


def read_tensors(reader, hp: Hparams, path: Path) -> dict[str, np.ndarray]:
    """All tensors, dequantized to float32, under Hugging Face names."""
    gguf = _import_gguf()
    n_tensors = len(reader.tensors)
    if hp.L > n_tensors:  # checked before a name table of 9 entries per block is built
        raise CheckpointError(f"{path}: block_count={hp.L}, but the file holds {n_tensors} tensors in all")
    table = _name_table(hp)
    out = {}
    for t in reader.tensors:
        if t.name not in table:
            raise CheckpointError(f"{path}: unknown tensor {t.name!r}")
        hf_name, shape = table[t.name]
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError as e:
            raise CheckpointError(f"{path}: tensor {t.name!r} has unsupported type {t.tensor_type.name}") from e
        except Exception as e:  # as in open_reader: the dequantizer reads untrusted bytes
            raise CheckpointError(f"{path}: tensor {t.name!r} cannot be dequantized: {e}") from e
        # GGUF lists dimensions in ggml's ne order, fastest-varying first: the reverse of numpy/
        # PyTorch order. So `ne = [D, V]` is a row-major [V, D] array, the layout Hugging Face
        # uses, and no transpose is needed; the reader already hands us that numpy order.
        if w.shape != tuple(int(n) for n in reversed(t.shape)):
            raise CheckpointError(f"{path}: tensor {t.name!r} holds {w.shape}, header says ne={list(t.shape)}")
        if w.shape != shape:
            raise CheckpointError(
                f"{path}: tensor {t.name!r} has shape {w.shape}, expected {shape} for {hf_name}"
            )
        w = np.array(w, dtype=np.float32)  # own the memory: the reader's arrays are a memmap
        try:
            if t.name.endswith("attn_q.weight") and hp.arch in _PERMUTED:
                w = unpermute_rope_rows(w, hp.N)
            elif t.name.endswith("attn_k.weight") and hp.arch in _PERMUTED:
                w = unpermute_rope_rows(w, hp.K)
        except ValueError as e:  # an odd head size
            raise CheckpointError(f"{path}: tensor {t.name!r}: {e}") from None
        out[hf_name] = w

    missing = [g for g in table if g != "output.weight" and table[g][0] not in out]
    if missing:
        raise CheckpointError(f"{path}: missing tensor {missing[0]!r} ({len(missing)} missing in all)")
    return out


def q8_0_matrices(gguf_path: str | Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The file's Q8_0 tensors as they are stored, nothing dequantised, under Hugging Face
    names: int8 values [O, I] and float16 scales [O, I / 32] (`specjax.model.quant`'s layout;
    q and k rows in Hugging Face order, `unpermute_rope_rows`). Other tensor types are left
    out. Raises CheckpointError as `convert_gguf` does."""
    gguf = _import_gguf()
    path = Path(gguf_path)
    reader = open_reader(path)
    hp = read_hparams(read_metadata(reader, path), path)
    table = _name_table(hp)
    out = {}
    for t in reader.tensors:
        if t.tensor_type != gguf.GGMLQuantizationType.Q8_0:
            continue
        if t.name not in table:
            raise CheckpointError(f"{path}: unknown tensor {t.name!r}")
        hf_name, shape = table[t.name]
        if len(shape) != 2 or shape[1] % 32:
            raise CheckpointError(f"{path}: tensor {t.name!r} cannot be Q8_0 with shape {shape}")
        rows, blocks = shape[0], shape[1] // 32
        raw = np.asarray(t.data)
        if raw.dtype != np.uint8 or raw.size != rows * blocks * 34:
            raise CheckpointError(f"{path}: tensor {t.name!r} holds {raw.size} bytes, expected "
                                  f"{rows * blocks * 34} for Q8_0 {shape}")
        # A Q8_0 block is 34 bytes: its float16 scale, then 32 int8 values.
        raw = raw.reshape(rows, blocks, 34)
        scales = np.ascontiguousarray(raw[..., :2]).view(np.float16).reshape(rows, blocks)
        values = np.ascontiguousarray(raw[..., 2:]).view(np.int8).reshape(rows, blocks * 32)
        heads = {"attn_q.weight": hp.N, "attn_k.weight": hp.K}.get(t.name.split(".", 2)[-1])
        if heads is not None and hp.arch in _PERMUTED:
            values, scales = unpermute_rope_rows(values, heads), unpermute_rope_rows(scales, heads)
        out[hf_name] = (values, scales)
    return out


# -- The tokenizer --------------------------------------------------------------------------------

def _pre_tokenizer(pre: str, path: Path):

    # GPT-2's regex split plus the byte -> printable-unicode mapping that every byte-level BPE
    # vocabulary is written in ("Ġ" for a space).
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "gpt-2":
        return byte_level
    if pre == "smollm":
        # llama.cpp (llama-vocab.cpp) splits every digit into its own piece ("\p{N}") before
        # GPT-2's regex, as SmolLM's own tokenizer.json does with Digits(individual_digits).
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre == "qwen2":
        # Qwen2's and Qwen3's split (llama-vocab.cpp's QWEN2 pre-type, the Split of their
        # tokenizer.json): one digit a piece, letters with at most one leading non-letter; then
        # the byte mapping without GPT-2's own regex. (tokenizer.json also NFC-normalises;
        # llama.cpp does not, and this follows the file's engine.)
        split = pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated", invert=False)
        return pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(
            add_prefix_space=False, trim_offsets=False, use_regex=False)])
    raise CheckpointError(f"{path}: unsupported tokenizer.ggml.pre {pre!r} (supported: 'gpt-2', "
                          "'smollm', 'qwen2')")


_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


# llama.cpp's token types (tokenizer.ggml.token_type).
_CONTROL, _USER_DEFINED = 3, 4
# Hugging Face's name for a special token -> llama.cpp's tokenizer.ggml.<key>_token_id.
_SPECIAL_KEYS = {"bos": "bos", "eos": "eos", "unk": "unknown", "pad": "padding"}


def read_special_ids(meta: dict[str, Any], n_tokens: int, path: Path) -> dict[str, int]:
    """{'bos': 1, 'eos': 2, ...} for the special tokens the file names."""
    ids = {}
    for name, key in _SPECIAL_KEYS.items():
        i = metadata_value(meta, f"tokenizer.ggml.{key}_token_id", path, None, kind="an integer")
        if i is None:
            continue
        if not 0 <= i < n_tokens:
            raise CheckpointError(f"{path}: tokenizer.ggml.{key}_token_id={i} is outside the vocabulary")
        ids[name] = i
    return ids


def build_tokenizer(meta: dict[str, Any], special_ids: dict[str, int], path: Path):
    """A `tokenizers.Tokenizer` equivalent to llama.cpp's, from the tokenizer.ggml.* metadata."""

    kind = metadata_value(meta, "tokenizer.ggml.model", path)
    if kind != "gpt2":
        raise CheckpointError(f"{path}: unsupported tokenizer.ggml.model {kind!r} (only byte-level BPE 'gpt2')")
    if metadata_value(meta, "tokenizer.ggml.add_space_prefix", path, False):
        raise CheckpointError(f"{path}: tokenizer.ggml.add_space_prefix=true is not supported")
    tokens = metadata_value(meta, "tokenizer.ggml.tokens", path, kind="a list of strings")
    types = metadata_value(meta, "tokenizer.ggml.token_type", path, [1] * len(tokens), kind="a list of integers")
    if len(types) != len(tokens):
        raise CheckpointError(f"{path}: {len(types)} token types for {len(tokens)} tokens")
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise CheckpointError(f"{path}: tokenizer.ggml.tokens has duplicate tokens")
    # A merge is "left right"; like llama.cpp, split at the first space after the first character.
    merges = []
    for m in metadata_value(meta, "tokenizer.ggml.merges", path, kind="a list of strings"):
        cut = m.find(" ", 1)
        if cut < 0:
            raise CheckpointError(f"{path}: malformed merge {m!r} in tokenizer.ggml.merges")
        merges.append((m[:cut], m[cut + 1 :]))

    try:
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    except Exception as e:  # tokenizers raises a bare Exception for a merge of unknown tokens
        raise CheckpointError(f"{path}: tokenizer.ggml.merges do not fit tokenizer.ggml.tokens ({e})") from None
    tok.pre_tokenizer = _pre_tokenizer(metadata_value(meta, "tokenizer.ggml.pre", path, "gpt-2"), path)
    tok.decoder = decoders.ByteLevel()
    # Added tokens match as whole strings before the pre-tokenizer and BPE see the text, so
    # "<|im_start|>" stays one id. Control tokens are special: skip_special_tokens drops them.
    tok.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == _USER_DEFINED]
    )
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == _CONTROL]
    )

    bos, eos = [], []
    for name, added in (("bos", bos), ("eos", eos)):
        if metadata_value(meta, f"tokenizer.ggml.add_{name}_token", path, False):
            if name not in special_ids:
                raise CheckpointError(f"{path}: tokenizer.ggml.add_{name}_token is set but no {name} token id is")
            added.append(tokens[special_ids[name]])
    if bos or eos:
        single = [f"{t}:0" for t in bos] + ["$A:0"] + [f"{t}:0" for t in eos]
        pair = single + [f"{t}:1" for t in bos] + ["$B:1"] + [f"{t}:1" for t in eos]
        tok.post_processor = processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=[(t, vocab[t]) for t in dict.fromkeys(bos + eos)]
        )
    return tok
