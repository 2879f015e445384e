"""Tiny random Hugging Face models, saved with `save_pretrained`, for parity tests."""

from __future__ import annotations

import torch
import transformers


def tiny_gpt2(tmp_path, *, vocab=97, d=32, layers=2, heads=4, n_inner=None, positions=64,
              tied=True, eps=1e-5, activation="gelu_new", seed=0):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=vocab, n_embd=d, n_layer=layers, n_head=heads,
                                     n_inner=n_inner, n_positions=positions,
                                     layer_norm_epsilon=eps, activation_function=activation,
                                     tie_word_embeddings=tied, bos_token_id=0, eos_token_id=1)
    model = transformers.GPT2LMHeadModel(config).eval()
    _perturb(model)
    model.save_pretrained(tmp_path)
    return model


def tiny_llama(tmp_path, *, vocab=97, d=32, layers=2, heads=4, kv_heads=2, head_dim=None,
               ff=48, positions=128, tied=False, rope_theta=10000.0, rope_scaling=None,
               model_type="llama", seed=0, attention_bias=False):
    torch.manual_seed(seed)
    rope = {"rope_type": "default", "rope_theta": rope_theta}
    rope.update(rope_scaling or {})
    kwargs = dict(vocab_size=vocab, hidden_size=d, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=ff,
                  max_position_embeddings=positions, tie_word_embeddings=tied,
                  rope_parameters=rope, bos_token_id=0, eos_token_id=1)
    if head_dim is not None:
        kwargs["head_dim"] = head_dim
    if model_type == "qwen2":
        config, cls = transformers.Qwen2Config(**kwargs), transformers.Qwen2ForCausalLM
    elif model_type == "qwen3":     # its q_norm / k_norm; head_dim defaults to 128 there
        kwargs.setdefault("head_dim", d // heads)
        config, cls = (transformers.Qwen3Config(attention_bias=attention_bias, **kwargs),
                       transformers.Qwen3ForCausalLM)
    elif model_type == "mistral":
        config, cls = (transformers.MistralConfig(sliding_window=None, **kwargs),
                       transformers.MistralForCausalLM)
    else:
        config, cls = transformers.LlamaConfig(**kwargs), transformers.LlamaForCausalLM
    model = cls(config).eval()
    _perturb(model)
    model.save_pretrained(tmp_path)
    return model


def _perturb(model):
    # Default init leaves biases at zero and norm scales at one, which would hide a bias or
    # scale that is loaded into the wrong place. Randomise every parameter.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn_like(p) if ("ln" in name or "norm" in name)
                        else 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.08)


def hf_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor(tokens)).logits.float().numpy()
