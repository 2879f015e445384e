"""Hugging Face tensor names: one explicit name table per architecture (GPT-2, Llama), mapping
each Hugging Face tensor to a leaf of specjax's parameter tree with the transform between the two
layouts, both ways (`specjax.io.checkpoint` loads and saves through it)."""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from specjax.model.config import ModelConfig

# -- Name tables --------------------------------------------------------------------------------
# Each entry: (Hugging Face name, path in specjax's tree, HF -> specjax, specjax -> HF).
# `{i}` in a name is the layer index; such an entry's path is inside each of params["layers"].

@dataclasses.dataclass(frozen=True)
class Entry:
    hf_name: str
    path: tuple[str, ...]
    to_specjax: Callable[[np.ndarray], np.ndarray]
    to_hf: Callable[[np.ndarray], np.ndarray]


def _same(a):
    return a


def _gpt2_table(c: ModelConfig) -> list[Entry]:
    D, N, H = c.d_model, c.n_heads, c.head_dim
    # GPT-2's Conv1D weights are [in, out], transposed to specjax's [out, in]. c_attn packs q, k
    # and v side by side along its output axis.
    def qkv(index):
        return lambda w: w[:, index * D:(index + 1) * D].T.reshape(N, H, D)

    def qkv_bias(index):
        return lambda b: b[index * D:(index + 1) * D].reshape(N, H)

    t = [Entry("wte.weight", ("embed",), _same, _same),
         Entry("wpe.weight", ("pos_embed",), _same, _same),
         Entry("ln_f.weight", ("final_norm", "scale"), _same, _same),
         Entry("ln_f.bias", ("final_norm", "bias"), _same, _same)]
    layer = "h.{i}."
    t += [Entry(layer + "ln_1.weight", ("layers", "attn_norm", "scale"), _same, _same),
          Entry(layer + "ln_1.bias", ("layers", "attn_norm", "bias"), _same, _same),
          Entry(layer + "ln_2.weight", ("layers", "mlp_norm", "scale"), _same, _same),
          Entry(layer + "ln_2.bias", ("layers", "mlp_norm", "bias"), _same, _same),
          # c_attn is split three ways; the to_hf side is handled by `_gpt2_c_attn`.
          Entry(layer + "attn.c_attn.weight", ("layers", "wq"), qkv(0), None),
          Entry(layer + "attn.c_attn.weight", ("layers", "wk"), qkv(1), None),
          Entry(layer + "attn.c_attn.weight", ("layers", "wv"), qkv(2), None),
          Entry(layer + "attn.c_attn.bias", ("layers", "bq"), qkv_bias(0), None),
          Entry(layer + "attn.c_attn.bias", ("layers", "bk"), qkv_bias(1), None),
          Entry(layer + "attn.c_attn.bias", ("layers", "bv"), qkv_bias(2), None),
          Entry(layer + "attn.c_proj.weight", ("layers", "wo"),
                lambda w: w.T.reshape(D, N, H), lambda w: w.reshape(D, N * H).T),
          Entry(layer + "attn.c_proj.bias", ("layers", "bo"), _same, _same),
          Entry(layer + "mlp.c_fc.weight", ("layers", "w_in"), np.transpose, np.transpose),
          Entry(layer + "mlp.c_fc.bias", ("layers", "b_in"), _same, _same),
          Entry(layer + "mlp.c_proj.weight", ("layers", "w_out"), np.transpose, np.transpose),
          Entry(layer + "mlp.c_proj.bias", ("layers", "b_out"), _same, _same)]
    if not c.tie_embeddings:
        t.append(Entry("lm_head.weight", ("lm_head",), _same, _same))
    return t


def _llama_table(c: ModelConfig) -> list[Entry]:
    D, N, K, H = c.d_model, c.n_heads, c.n_kv_heads, c.head_dim
    # torch.nn.Linear stores [out, in], as specjax does, with heads split out.
    # Hugging Face Llama q/k rows are already in the half-split (rotate_half) RoPE layout that
    # `layers.apply_rope` uses, so no permutation is needed (GGUF files differ: see gguf.py).
    def proj_in(heads):
        return (lambda w: w.reshape(heads, H, D), lambda w: w.reshape(heads * H, D))

    def bias(heads):
        return (lambda b: b.reshape(heads, H), lambda b: b.reshape(heads * H))

    layer = "model.layers.{i}."
    t = [Entry("model.embed_tokens.weight", ("embed",), _same, _same),
         Entry("model.norm.weight", ("final_norm", "scale"), _same, _same),
         Entry(layer + "input_layernorm.weight", ("layers", "attn_norm", "scale"), _same, _same),
         Entry(layer + "post_attention_layernorm.weight", ("layers", "mlp_norm", "scale"), _same, _same),
         Entry(layer + "self_attn.q_proj.weight", ("layers", "wq"), *proj_in(N)),
         Entry(layer + "self_attn.k_proj.weight", ("layers", "wk"), *proj_in(K)),
         Entry(layer + "self_attn.v_proj.weight", ("layers", "wv"), *proj_in(K)),
         Entry(layer + "self_attn.o_proj.weight", ("layers", "wo"),
               lambda w: w.reshape(D, N, H), lambda w: w.reshape(D, N * H)),
         Entry(layer + "mlp.gate_proj.weight", ("layers", "w_gate"), _same, _same),
         Entry(layer + "mlp.up_proj.weight", ("layers", "w_up"), _same, _same),
         Entry(layer + "mlp.down_proj.weight", ("layers", "w_down"), _same, _same)]
    if c.qkv_bias:
        t += [Entry(layer + "self_attn.q_proj.bias", ("layers", "bq"), *bias(N)),
              Entry(layer + "self_attn.k_proj.bias", ("layers", "bk"), *bias(K)),
              Entry(layer + "self_attn.v_proj.bias", ("layers", "bv"), *bias(K))]
    if c.qk_norm:
        t += [Entry(layer + "self_attn.q_norm.weight", ("layers", "q_norm", "scale"), _same, _same),
              Entry(layer + "self_attn.k_norm.weight", ("layers", "k_norm", "scale"), _same, _same)]
    if c.out_bias:
        t.append(Entry(layer + "self_attn.o_proj.bias", ("layers", "bo"), _same, _same))
    if c.mlp_bias:
        t += [Entry(layer + "mlp.gate_proj.bias", ("layers", "b_gate"), _same, _same),
              Entry(layer + "mlp.up_proj.bias", ("layers", "b_up"), _same, _same),
              Entry(layer + "mlp.down_proj.bias", ("layers", "b_down"), _same, _same)]
    if not c.tie_embeddings:
        t.append(Entry("lm_head.weight", ("lm_head",), _same, _same))
    return t


def name_table(config: ModelConfig) -> list[Entry]:
    return _gpt2_table(config) if config.arch == "gpt2" else _llama_table(config)


# Tensors some checkpoints carry that are not parameters (buffers of older transformers).
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")


def canonical(name: str, config: ModelConfig) -> str:
    # GPT-2 checkpoints come with and without the "transformer." prefix (GPT2LMHeadModel vs
    # GPT2Model, and the original openai-community/gpt2 upload).
    if config.arch == "gpt2" and name.startswith("transformer."):
        return name[len("transformer."):]
    return name
