"""The key/value cache: fixed-size buffers, per-row lengths, masks from absolute positions.

Shapes use the letters of `specjax.model`: L layers, B batch, S cache slots, K key/value heads,
H head size, T query length.

Slot s of row b holds the key and value of the token at absolute position s. A forward call
with tokens at positions p0 .. p0+T-1 writes slots p0 .. p0+T-1, and a query at position p
attends to slots s <= p. Everything before p0 was written by earlier calls for the current
sequence, everything after p is masked, so stale entries beyond a row's length (rejected draft
tokens, right padding of a ragged prompt) are never read: rolling back is just setting a
smaller length, and the next call overwrites those slots before anyone can see them.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

from specjax.config import ModelConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    k: jax.Array        # [L, B, S, K, H]
    v: jax.Array        # [L, B, S, K, H]
    length: jax.Array   # [B] int32: number of valid positions of each row

    @classmethod
    def init(cls, config: ModelConfig, batch: int, slots: int, dtype=None) -> "KVCache":
        dtype = dtype or jnp.dtype(config.dtype)
        shape = (config.n_layers, batch, slots, config.n_kv_heads, config.head_dim)
        return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), jnp.zeros((batch,), jnp.int32))

    @property
    def slots(self) -> int:
        return self.k.shape[2]

    def with_length(self, length: jax.Array) -> "KVCache":
        """Sets each row's length: rollback of rejected tokens, or the true length of a padded row."""
        return dataclasses.replace(self, length=jnp.asarray(length, jnp.int32))


def write(cache_k: jax.Array, cache_v: jax.Array, k: jax.Array, v: jax.Array,
          positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Writes one layer's new keys and values at each row's positions.

    Args:
      cache_k, cache_v: [B, S, K, H] one layer's buffers.
      k, v: [B, T, K, H] the new entries.
      positions: [B, T] absolute positions; each row's are consecutive, so the row is one slice
        starting at positions[b, 0]. The caller keeps positions[b, -1] < S (a slice that ran past
        the end would be shifted back by `dynamic_update_slice`, silently corrupting the cache).
    """
    def write_row(buffer, new, start):    # [S, K, H] <- [T, K, H] at start
        return lax.dynamic_update_slice(buffer, new.astype(buffer.dtype), (start, 0, 0))

    starts = positions[:, 0]
    return jax.vmap(write_row)(cache_k, k, starts), jax.vmap(write_row)(cache_v, v, starts)


def attention_mask(query_positions: jax.Array, key_positions: jax.Array) -> jax.Array:
    """Causal mask from absolute positions: [B, T] queries x [B, S] keys -> [B, T, S] bool."""
    return key_positions[:, None, :] <= query_positions[:, :, None]
