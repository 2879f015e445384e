"""Writing GGUF files that llama.cpp runs: a specjax Llama as llama.cpp's converter lays one out
(`write_llama`), and a GGUF re-encoded in another precision with its metadata kept
(`reencode`). The `gguf` package does the writing (pip install specjax[gguf]); `specjax.io.gguf`
reads back what this writes.

Two vocabularies can go with a model's tensors: the metadata of an existing GGUF whose
tokenizer the model shares (`like=`: a SmolLM2 draft written beside SmolLM2's own file), or
fields a caller builds (`vocabulary=`: the conformance kit's one-byte tokens).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
from safetensors.numpy import load_file

from specjax.io.checkpoint import save
from specjax.model.transformer import Model

__all__ = ["GGUF_TYPES", "file_type", "reencode", "write_llama"]

# The GGUF tensor type for each specjax dtype.
GGUF_TYPES = {"float32": "F32", "bfloat16": "BF16", "int8": "Q8_0", "q8_0": "Q8_0"}

# Hugging Face name -> GGUF name (convert_hf_to_gguf.py's table for Llama).
_LAYER = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
          "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
          "self_attn.o_proj.weight": "attn_output.weight",
          "post_attention_layernorm.weight": "ffn_norm.weight",
          "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
          "mlp.down_proj.weight": "ffn_down.weight"}
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}
# The hyperparameters `write_llama` sets from the model's config; a `like` file's own are
# dropped, as are its type and its quantisation's notes.
_OWN_KEYS = ("general.architecture", "general.file_type", "general.quantization_version")


def _gguf():
    try:        # an optional dependency: only writing GGUF files needs it
        import gguf
    except ImportError:
        raise ImportError("writing GGUF files needs the gguf package: pip install gguf") from None
    return gguf


def gguf_name(name: str) -> str:
    """A Hugging Face Llama tensor name as llama.cpp's converter names it."""
    if name.startswith("model.layers."):
        layer, rest = name[len("model.layers."):].split(".", 1)
        return f"blk.{layer}.{_LAYER[rest]}"
    return _TOP[name]


def permute_rope_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """q or k rows from Hugging Face's rotate-half order to llama.cpp's interleaved one (the
    inverse of `gguf.unpermute_rope_rows`)."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2)
            .reshape(w.shape))


def _copy_fields(writer, reader, gguf, skip: Callable[[str], bool]) -> None:
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or skip(field.name):
            continue     # the header's own fields; the writer adds the architecture
        kinds = field.types
        writer.add_key_value(field.name, field.contents(), kinds[0],
                             sub_type=kinds[-1] if kinds[0] == gguf.GGUFValueType.ARRAY
                             and len(kinds) > 1 else None)


def _finish(writer) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_llama(model: Model, path: str | Path, *, like: str | Path | None = None,
                vocabulary: Callable | None = None, pad_rows: int = 0) -> Path:
    """`model`, a float32 Llama (untied or tied, without q/k norms), as a GGUF file at `path`
    in float32, q and k rows permuted for llama.cpp's RoPE as its converter writes them.

    The vocabulary comes from `like`, a GGUF whose tokenizer the model shares (every
    `tokenizer.*` and `general.*` field but the file's type is copied), or from
    `vocabulary(writer)`, which adds the tokenizer fields itself. `pad_rows` zero rows are added
    to the embedding and output matrices (tokens past the model's vocabulary)."""
    gguf = _gguf()
    config = model.config
    if config.arch != "llama" or config.qk_norm or config.dtype != "float32":
        raise ValueError("write_llama writes a float32 Llama without q/k norms, got "
                         f"{config.arch} in {config.dtype}")
    if (like is None) == (vocabulary is None):
        raise ValueError("write_llama takes one of like= (a GGUF) or vocabulary=")
    with tempfile.TemporaryDirectory() as directory:
        save(model, directory)
        tensors = load_file(str(Path(directory) / "model.safetensors"))
    path = Path(path)
    writer = gguf.GGUFWriter(str(path), "llama")
    if like is not None:
        reader = gguf.GGUFReader(str(like))
        vocab = len(reader.fields["tokenizer.ggml.tokens"].contents())
        if vocab != config.vocab_size + pad_rows:
            raise ValueError(f"{like} has {vocab} tokens, the model {config.vocab_size}")
        _copy_fields(writer, reader, gguf, lambda name: name in _OWN_KEYS
                     or not name.startswith(("tokenizer.", "general.")))
    else:
        vocabulary(writer)
    writer.add_block_count(config.n_layers)
    writer.add_context_length(config.max_positions)
    writer.add_embedding_length(config.d_model)
    writer.add_feed_forward_length(config.d_ff)
    writer.add_head_count(config.n_heads)
    writer.add_head_count_kv(config.n_kv_heads)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.norm_eps)
    writer.add_vocab_size(config.vocab_size + pad_rows)
    for name, tensor in tensors.items():
        gname, a = gguf_name(name), np.asarray(tensor, np.float32)
        if gname.endswith("attn_q.weight"):
            a = permute_rope_rows(a, config.n_heads)
        elif gname.endswith("attn_k.weight"):
            a = permute_rope_rows(a, config.n_kv_heads)
        elif gname in ("token_embd.weight", "output.weight") and pad_rows:
            a = np.concatenate([a, np.zeros((pad_rows, a.shape[1]), np.float32)])
        writer.add_tensor(gname, a)
    _finish(writer)
    return path


def reencode(source: str | Path, precision: str, directory: str | Path) -> Path:
    """`source` re-encoded with every matrix in `precision` (a specjax dtype, as GGUF_TYPES
    maps it, or a GGUF type's name: F16, Q4_1, ...; vectors as F32) and the same metadata, in
    `directory`; made once, reused after. `source` itself when its header says it is a file of
    that type (`general.file_type`, as llama.cpp's quantiser writes it: the `smollm2` download
    is MOSTLY_Q4_1, with its embeddings in Q8_0)."""
    gguf = _gguf()
    source = Path(source)
    kind = GGUF_TYPES.get(precision, precision)
    if file_type(source) == kind:
        return source
    directory = Path(directory)
    out = directory / f"{source.stem}.{kind}.gguf"
    if out.is_file() and out.stat().st_mtime >= source.stat().st_mtime:
        return out
    directory.mkdir(parents=True, exist_ok=True)
    reader = gguf.GGUFReader(source)
    arch = str(reader.fields["general.architecture"].contents())
    qtype = getattr(gguf.GGMLQuantizationType, kind)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".tmp-") as scratch:
        partial = Path(scratch) / out.name
        writer = gguf.GGUFWriter(partial, arch)
        _copy_fields(writer, reader, gguf, lambda name: name == "general.architecture")
        for tensor in reader.tensors:
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
            # Vectors (the norms) stay float32, as llama.cpp's converter writes them: its CPU
            # backend has no float32-by-bfloat16 elementwise product (it aborts on one).
            if kind == "F32" or values.ndim == 1:
                writer.add_tensor(tensor.name, values)
            elif kind == "F16":
                writer.add_tensor(tensor.name, values.astype(np.float16))
            else:
                writer.add_tensor(tensor.name, gguf.quants.quantize(values, qtype),
                                  raw_dtype=qtype)
        _finish(writer)
        os.replace(partial, out)
    return out


def file_type(source: str | Path) -> str | None:
    """The GGUF type `source`'s header says its matrices are in (`general.file_type`: 3 is
    MOSTLY_Q4_1, so "Q4_1"), or None without one."""
    gguf = _gguf()
    field = gguf.GGUFReader(str(source)).fields.get("general.file_type")
    if field is None:
        return None
    try:
        name = gguf.LlamaFileType(int(field.contents())).name
    except ValueError:
        return None
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")
