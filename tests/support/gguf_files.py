"""Tiny GGUF files written the way llama.cpp's convert_hf_to_gguf.py writes them.

Shared by the GGUF tests (test_gguf.py, test_loader_fuzz.py); needs the gguf package, not torch.
"""

from __future__ import annotations

import re
from pathlib import Path

import gguf
import numpy as np


def llama_cpp_permute(w: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: HF rotate_half rows -> interleaved rows."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (encoder.py)."""
    printable = [range(ord("!"), ord("~") + 1), range(ord("¡"), ord("¬") + 1), range(ord("®"), ord("ÿ") + 1)]
    bs = [b for r in printable for b in r]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TINY_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TINY_MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "Ġ Ġ", "ĠĠ ĠĠ", "Ã ©"]


def tiny_vocab() -> tuple[list[str], list[str], list[int]]:
    """(tokens, merges, token types): specials, the 256 byte characters, one token per merge."""
    tokens = TINY_SPECIALS + list(bytes_to_unicode().values()) + [m.replace(" ", "") for m in TINY_MERGES]
    types = [3] * len(TINY_SPECIALS) + [1] * (len(tokens) - len(TINY_SPECIALS))
    return tokens, TINY_MERGES, types


# Hugging Face name (per layer after "model.layers.N.") -> GGUF name (after "blk.N.").
HF_TO_GGUF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",          # Qwen3
    "self_attn.k_norm.weight": "attn_k_norm.weight",
}
HF_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def hf_to_gguf_name(name: str) -> str:
    if m := re.fullmatch(r"model\.layers\.(\d+)\.(.+)", name):
        return f"blk.{m[1]}.{HF_TO_GGUF_LAYER[m[2]]}"
    return HF_TO_GGUF[name]


def write_gguf(
    path: Path,
    config: dict,
    tensors: dict[str, np.ndarray],
    arch: str = "llama",
    quant: dict[str, object] | None = None,
    drop=(),
    extra=(),
    add_bos: bool = False,
    file_type: int | None = None,
    pre: str = "smollm",
) -> None:
    """Write a Llama model to GGUF like convert_hf_to_gguf.py (q/k permuted), or a Qwen3
    (arch="qwen3": q/k as they are, its key length and q/k norms written).

    Args:
        config: its Hugging Face config.json, parsed.
        tensors: its Hugging Face tensors by name (model.safetensors, or a state dict in numpy).
    """
    c = config
    tokens, merges, types = tiny_vocab()
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_rope_dimension_count(c["head_dim"])
    if arch == "qwen3":
        w.add_key_length(c["head_dim"])
        w.add_value_length(c["head_dim"])
    w.add_rope_freq_base(c["rope_parameters"]["rope_theta"])
    if c["rope_parameters"].get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(c["rope_parameters"]["factor"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_vocab_size(c["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(add_bos)
    w.add_chat_template(CHATML)
    if file_type is not None:           # general.file_type, as llama.cpp's quantiser writes it
        w.add_file_type(file_type)

    n, k = c["num_attention_heads"], c["num_key_value_heads"]
    for name, t in tensors.items():
        if name == "lm_head.weight" and c["tie_word_embeddings"]:
            continue
        gname = hf_to_gguf_name(name)
        if gname in drop:
            continue
        a = np.asarray(t, np.float32)
        if gname.endswith("attn_q.weight") and arch == "llama":
            a = llama_cpp_permute(a, n, n)
        elif gname.endswith("attn_k.weight") and arch == "llama":
            a = llama_cpp_permute(a, n, k)
        qtype = (quant or {}).get(gname)
        if qtype is None:
            w.add_tensor(gname, a)
        else:
            w.add_tensor(gname, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
    for gname, a in extra:
        w.add_tensor(gname, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
