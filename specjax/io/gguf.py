"""Convert a llama- or qwen3-architecture GGUF file into a Hugging Face checkpoint directory.

GGUF is llama.cpp's single-file format: hyperparameters, the tokenizer and (often quantized)
tensors in one file. specjax itself only reads Hugging Face layout (config.json +
*.safetensors + tokenizer.json), so a GGUF is converted once, offline:

    convert_gguf("SmolLM2-135M-Instruct.Q4_1.gguf", "out/")  ->  out/config.json,
        model.safetensors (float32), generation_config.json, tokenizer.json,
        tokenizer_config.json (with the chat template), special_tokens_map.json

Every tensor is dequantized to float32, so the result is exactly the model llama.cpp runs
from that file, not the unquantized original. The `gguf` package (pip install specjax[gguf])
does the parsing and the dequantization (`specjax.io.gguf_read`); the tokenizer is rebuilt
from the file's metadata (`specjax.io.gguf_tokenizer`).

Shape letters as in STYLE.md: V vocab, D width, F MLP width, N query heads, K KV heads,
H head size, L layers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors.numpy import save_file

from specjax.io.errors import CheckpointError
from specjax.io.gguf_read import (ARCHES, Hparams, metadata_value, open_reader, read_hparams,
                                  read_metadata, read_tensors)
from specjax.io.gguf_tokenizer import build_tokenizer, read_special_ids
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
