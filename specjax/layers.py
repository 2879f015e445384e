"""The few pieces GPT-2 and Llama share: norms, rotary embeddings, attention and MLPs.

Dimension letters (as in `specjax.model`): B batch, T query length, S key length, D model
width, F MLP width, N query heads, K key/value heads, G = N / K, H head size.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from specjax.cache import attention_mask
from specjax.config import ModelConfig


def layer_norm(x, scale, bias, eps: float):
    """LayerNorm over D, computed in float32 whatever the activation dtype."""
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = jnp.square(x32 - mean).mean(-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + eps)
    return (y * scale + bias).astype(x.dtype)


def rms_norm(x, scale, eps: float):
    """RMSNorm over D in float32; like transformers, cast back before applying the scale."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.square(x32).mean(-1, keepdims=True) + eps)
    return y.astype(x.dtype) * scale


def activation(name: str, x):
    if name == "gelu_tanh":      # GPT-2's gelu_new
        return jax.nn.gelu(x, approximate=True)
    if name == "gelu":
        return jax.nn.gelu(x, approximate=False)
    return jax.nn.silu(x)


# -- Rotary position embeddings ----------------------------------------------------------------

def rope_frequencies(config: ModelConfig) -> np.ndarray:
    """Inverse frequencies [H/2] (float32), with `linear` or `llama3` scaling applied.

    Computed once on the host: they depend only on the (static) config.
    """
    h = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, h, 2, dtype=np.float32) / np.float32(h)))
    inv_freq = inv_freq.astype(np.float32)
    scaling = config.rope_scaling_dict
    if scaling is None:
        return inv_freq
    if scaling["rope_type"] == "linear":
        return (inv_freq / np.float32(scaling["factor"])).astype(np.float32)
    # llama3 (Llama 3.1/3.2): long wavelengths are slowed down by `factor`, short ones kept, and
    # the band between is interpolated smoothly.
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_context / high) & (wavelen <= old_context / low)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def apply_rope(x, positions, inv_freq):
    """Half-split ("rotate_half") RoPE, the Hugging Face Llama layout.

    Args:
      x: [B, T, heads, H]; positions: [B, T] int; inv_freq: [H/2].
    """
    angles = positions.astype(jnp.float32)[..., None] * inv_freq       # [B, T, H/2]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # [B, T, 1, H]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (x.astype(jnp.float32) * cos + rotated * sin).astype(x.dtype)


# -- Attention ----------------------------------------------------------------------------------

def attend(q, k, v, query_positions, key_positions):
    """Grouped-query attention with a causal mask built from absolute positions.

    Args:
      q: [B, T, N, H]; k, v: [B, S, K, H]; query_positions: [B, T]; key_positions: [B, S].
    Returns:
      [B, T, N, H]
    """
    b, t, n, h = q.shape
    kv_heads = k.shape[2]
    # Queries of one group share a key/value head: reshape instead of repeating K and V.
    q = q.reshape(b, t, kv_heads, n // kv_heads, h)                     # [B, T, K, G, H]
    scores = jnp.einsum("BTKGH,BSKH->BKGTS", q, k, preferred_element_type=jnp.float32)
    scores = scores / np.float32(math.sqrt(h))
    mask = attention_mask(query_positions, key_positions)[:, None, None]  # [B, 1, 1, T, S]
    # Every query sees at least its own slot, so no row of the softmax is all -inf.
    scores = jnp.where(mask, scores, -jnp.inf)
    weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("BKGTS,BSKH->BTKGH", weights, v)
    return out.reshape(b, t, n, h)
