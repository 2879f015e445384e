"""The tokenizer a GGUF file holds in its metadata, as a Hugging Face `tokenizers.Tokenizer`:
the BPE vocabulary and merges, the pre-tokenizer its `tokenizer.ggml.pre` names, the special
tokens and the BOS/EOS post-processing (`specjax.io.gguf` writes it as tokenizer.json)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from specjax.io.errors import CheckpointError
from specjax.io.gguf_read import metadata_value

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
