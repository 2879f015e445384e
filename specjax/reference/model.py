"""The forward pass of GPT-2 and Llama-family models in plain NumPy, float32, one sequence.

`forward(model, tokens)` reads the parameter tree `specjax.load` gives (the tree is described in
`specjax.model.transformer`'s docstring: the layers stacked along a leading L axis, every matrix
stored [out, in]) and returns the logits after every position. No cache: each call reads the
whole sequence again, which is what makes this short.

Dimension letters, as in the engine's einsums:

    T tokens (queries)   S tokens (keys)   D model width   F MLP width   V vocab
    N query heads   K key/value heads   G = N / K   H head size

GPT-2: learned positions, LayerNorm, a GELU MLP, biases. Llama (and Mistral, Qwen2 and Qwen3,
which differ from it only in config): RoPE, RMSNorm, a SwiGLU MLP, grouped-query attention,
optional biases and Qwen3's RMSNorm over each head's queries and keys before RoPE.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

__all__ = ["Plain", "forward", "plain"]


@dataclasses.dataclass(frozen=True)
class Plain:
    """A model's parameters as float32 NumPy arrays (`plain`), and its config (read by name)."""
    config: object              # a `specjax.ModelConfig`
    params: dict


def plain(model) -> Plain:
    """`model` (what `specjax.load` gives: `.config` and `.params`) as NumPy float32 arrays,
    converted once so that a decoding loop does not convert every weight at every call.

    8-bit weights ("int8": values int8, a float16 scale per block of inputs) are dequantised:
    each value times its block's scale, exact in float32. The "q8_0" dtype rounds the
    activations of every product to 8 bits as well, a law this reference does not state: it is
    refused (load the model as "int8" or a float dtype to compare).
    """
    if isinstance(model, Plain):
        return model
    config = getattr(model, "config", None)
    if config is None or not isinstance(getattr(model, "params", None), dict):
        raise TypeError(f"model must be a loaded specjax.Model (with .config and .params), "
                        f"got {type(model).__name__}")
    if config.arch not in ("gpt2", "llama"):
        raise ValueError(f"the reference runs the gpt2 and llama architectures, not "
                         f"{config.arch!r}")
    if config.dtype == "q8_0":
        raise ValueError("the reference does not run q8_0 models (their products quantise the "
                         "activations too); load the model as int8 or float32")
    return Plain(config, _as_float32(model.params))


def _as_float32(tree):
    if isinstance(tree, dict):
        return {name: _as_float32(value) for name, value in tree.items()}
    if hasattr(tree, "values") and hasattr(tree, "scales"):     # an 8-bit matrix
        values = np.asarray(tree.values, np.float32)            # [..., I]
        scales = np.asarray(tree.scales, np.float32)             # [..., I / B]
        blocks = values.reshape(*scales.shape, -1)               # [..., I / B, B]
        return (blocks * scales[..., None]).reshape(values.shape)
    return np.asarray(tree, np.float32)


def forward(model, tokens) -> np.ndarray:
    """Logits [T, V] float32 after each of `tokens` ([T] ids, positions 0..T-1), for a loaded
    `specjax.Model` (or its `plain` form)."""
    model = plain(model)
    config, p = model.config, model.params
    tokens = np.asarray(tokens, np.int64)
    if tokens.ndim != 1 or not 1 <= len(tokens) <= config.max_positions:
        raise ValueError(f"tokens must be a list of 1 to {config.max_positions} ids, "
                         f"got shape {tokens.shape}")
    if tokens.min() < 0 or tokens.max() >= config.vocab_size:
        raise ValueError(f"token ids must be in [0, {config.vocab_size}), got {tokens.tolist()}")
    positions = np.arange(len(tokens))
    x = p["embed"][tokens]                                               # [T, D]
    if config.arch == "gpt2":
        x = x + p["pos_embed"][positions]
    for i in range(config.n_layers):
        layer = {name: _layer_of(value, i) for name, value in p["layers"].items()}
        x = x + attention(config, layer, norm(config, layer["attn_norm"], x), positions)
        x = x + mlp(config, layer, norm(config, layer["mlp_norm"], x))
    x = norm(config, p["final_norm"], x)
    head = p["embed"] if config.tie_embeddings else p["lm_head"]           # [V, D]
    return (x @ head.T).astype(np.float32)                               # [T, D] -> [T, V]


def _layer_of(value, i):
    """Layer i of a stacked leaf (a dict of them for a norm)."""
    return {k: v[i] for k, v in value.items()} if isinstance(value, dict) else value[i]


def norm(config, p: dict, x: np.ndarray) -> np.ndarray:
    """GPT-2's LayerNorm or Llama's RMSNorm over the last axis."""
    if config.arch == "gpt2":
        return layer_norm(x, p["scale"], p["bias"], config.norm_eps)
    return rms_norm(x, p["scale"], config.norm_eps)


def layer_norm(x, scale, bias, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = np.square(x - mean).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + np.float32(eps)) * scale + bias


def rms_norm(x, scale, eps: float) -> np.ndarray:
    return x / np.sqrt(np.square(x).mean(axis=-1, keepdims=True) + np.float32(eps)) * scale


def attention(config, p: dict, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Causal grouped-query attention of x [T, D] -> [T, D]: query head n reads key/value head
    n // G (K key/value heads serve N = K * G query heads; K = N is multi-head, K = 1
    multi-query)."""
    t, h = len(x), config.head_dim
    q = np.einsum("TD,NHD->TNH", x, p["wq"])                              # [T, N, H]
    k = np.einsum("TD,KHD->TKH", x, p["wk"])                              # [T, K, H]
    v = np.einsum("TD,KHD->TKH", x, p["wv"])                              # [T, K, H]
    if config.qkv_bias:
        q, k, v = q + p["bq"], k + p["bk"], v + p["bv"]
    if config.qk_norm:                      # Qwen3: each head's queries and keys, over H
        q = rms_norm(q, p["q_norm"]["scale"], config.norm_eps)
        k = rms_norm(k, p["k_norm"]["scale"], config.norm_eps)
    if config.arch == "llama":
        angles = positions[:, None] * rope_frequencies(config)            # [T, H/2]
        q, k = rope(q, angles), rope(k, angles)
    q = q.reshape(t, config.n_kv_heads, config.n_groups, h)               # [T, K, G, H]
    scores = np.einsum("TKGH,SKH->KGTS", q, k) / np.float32(math.sqrt(h))  # [K, G, T, S]
    causal = np.tril(np.ones((t, t), bool))                               # query T sees S <= T
    scores = np.where(causal, scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights = weights / weights.sum(axis=-1, keepdims=True)
    out = np.einsum("KGTS,SKH->TKGH", weights, v).reshape(t, config.n_heads, h)  # [T, N, H]
    out = np.einsum("TNH,DNH->TD", out, p["wo"])                           # [T, D]
    return out + p["bo"] if config.out_bias else out


def rope_frequencies(config) -> np.ndarray:
    """RoPE's inverse frequencies [H/2], theta^(-2i/H), with the config's scaling: "linear"
    divides them all by its factor; "llama3" (Llama 3.1) divides the low frequencies (long
    wavelengths) by its factor, keeps the high ones, and blends the band between."""
    h = config.head_dim
    inv_freq = (1.0 / config.rope_theta ** (np.arange(0, h, 2, dtype=np.float32) / h)
                ).astype(np.float32)
    scaling = dict(config.rope_scaling) if config.rope_scaling else None
    if scaling is None:
        return inv_freq
    factor = scaling["factor"]
    if scaling["rope_type"] == "linear":
        return (inv_freq / np.float32(factor)).astype(np.float32)
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    context = scaling["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv_freq
    slow = np.where(wavelength > context / low, inv_freq / factor, inv_freq)
    blend = (context / wavelength - low) / (high - low)
    between = (wavelength >= context / high) & (wavelength <= context / low)
    return np.where(between, (1 - blend) * slow / factor + blend * slow, slow).astype(np.float32)


def rope(x: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """Rotate x [T, heads, H] by angles [T, H/2], Hugging Face's half-split layout: dimension i
    of the first half pairs with dimension i of the second (Meta's checkpoints interleave the
    pairs instead; the loaders convert)."""
    cos = np.cos(np.concatenate([angles, angles], axis=-1))[:, None, :]   # [T, 1, H]
    sin = np.sin(np.concatenate([angles, angles], axis=-1))[:, None, :]
    first, second = np.split(x, 2, axis=-1)
    return x * cos + np.concatenate([-second, first], axis=-1) * sin


def mlp(config, p: dict, x: np.ndarray) -> np.ndarray:
    """GPT-2's GELU MLP or Llama's SwiGLU, x [T, D] -> [T, D]."""
    if config.arch == "gpt2":
        h = np.einsum("TD,FD->TF", x, p["w_in"]) + (p["b_in"] if config.mlp_bias else 0)
        out = np.einsum("TF,DF->TD", activation(config.activation, h), p["w_out"])
        return out + p["b_out"] if config.mlp_bias else out
    gate = np.einsum("TD,FD->TF", x, p["w_gate"]) + (p["b_gate"] if config.mlp_bias else 0)
    up = np.einsum("TD,FD->TF", x, p["w_up"]) + (p["b_up"] if config.mlp_bias else 0)
    out = np.einsum("TF,DF->TD", activation(config.activation, gate) * up, p["w_down"])
    return out + p["b_down"] if config.mlp_bias else out


def activation(name: str, x: np.ndarray) -> np.ndarray:
    """GELU with tanh (GPT-2's "gelu_new"), exact GELU, or SiLU (SwiGLU's gate)."""
    if name == "gelu_tanh":
        return 0.5 * x * (1 + np.tanh(np.float32(math.sqrt(2 / math.pi))
                                      * (x + np.float32(0.044715) * x ** 3)))
    if name == "gelu":
        return (0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))).astype(np.float32)
    return x / (1 + np.exp(-x))
