"""The key/value cache: fixed-size buffers, per-row lengths, masks from absolute positions.

Shapes use the letters of `specjax.model`: L layers, B batch, S cache slots, K key/value heads,
H head size, T query length. A layer's keys are stored [B, K, H, S] and its values [B, K, S, H]:
each head is one contiguous matrix laid out the way attention's two products read it (scores
contract H against the keys, the output contracts S against the values). On a CPU, with
SmolLM2's shapes, the scores' product over 2,048 slots took 0.57 ms a layer with keys stored
like the values and 0.07 ms with keys [B, K, H, S].

Slot s of row b holds the key and value of the token at absolute position s. A forward call
with tokens at positions p0 .. p0+T-1 writes slots p0 .. p0+T-1, and a query at position p
attends to slots s <= p. Everything before p0 was written by earlier calls for the current
sequence, everything after p is masked, so stale entries beyond a row's length (rejected draft
tokens, right padding of a ragged prompt) are never read: rolling back is just setting a
smaller length, and the next call overwrites those slots before anyone can see them.

Each layer has its own pair of buffers (a tuple of L arrays, not one [L, ...] array): a decoding
loop then updates every buffer in place, and attention reads a layer's buffer directly. Slicing
a layer out of a stacked array costs a copy of it on every call, which made a step's cost grow
with the buffer's size (see `specjax.model` on the same effect for weights).
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
    k: tuple[jax.Array, ...]   # L x [B, K, H, S]
    v: tuple[jax.Array, ...]   # L x [B, K, S, H]
    length: jax.Array          # [B] int32: number of valid positions of each row

    @classmethod
    def init(cls, config: ModelConfig, batch: int, slots: int, dtype=None) -> "KVCache":
        dtype = dtype or jnp.dtype(config.dtype)
        k_shape = (batch, config.n_kv_heads, config.head_dim, slots)
        v_shape = (batch, config.n_kv_heads, slots, config.head_dim)
        return cls(tuple(jnp.zeros(k_shape, dtype) for _ in range(config.n_layers)),
                   tuple(jnp.zeros(v_shape, dtype) for _ in range(config.n_layers)),
                   jnp.zeros((batch,), jnp.int32))

    @property
    def slots(self) -> int:
        return self.v[0].shape[2]

    def with_length(self, length: jax.Array) -> "KVCache":
        """Sets each row's length: rollback of rejected tokens, or the true length of a padded row."""
        return dataclasses.replace(self, length=jnp.asarray(length, jnp.int32))


def write(cache_k: jax.Array, cache_v: jax.Array, k: jax.Array, v: jax.Array,
          positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Writes one layer's new keys and values at each row's positions.

    Args:
      cache_k: [B, K, H, S] and cache_v: [B, K, S, H], one layer's buffers.
      k, v: [B, T, K, H] the new entries.
      positions: [B, T] absolute positions; each row's are consecutive, so the row is one slice
        starting at positions[b, 0]. The caller keeps positions[b, -1] < S (a slice that ran past
        the end would be shifted back by `dynamic_update_slice`, silently corrupting the cache).
    """
    def write_keys(buffer, new, start):      # [K, H, S] <- [T, K, H] at start
        new = jnp.transpose(new, (1, 2, 0)).astype(buffer.dtype)          # [K, H, T]
        return lax.dynamic_update_slice(buffer, new, (0, 0, start))

    def write_values(buffer, new, start):    # [K, S, H] <- [T, K, H] at start
        new = jnp.swapaxes(new, 0, 1).astype(buffer.dtype)                # [K, T, H]
        return lax.dynamic_update_slice(buffer, new, (0, start, 0))

    starts = positions[:, 0]
    return jax.vmap(write_keys)(cache_k, k, starts), jax.vmap(write_values)(cache_v, v, starts)


def attention_mask(query_positions: jax.Array, key_positions: jax.Array) -> jax.Array:
    """Causal mask from absolute positions: [B, T] queries x [B, S] keys -> [B, T, S] bool."""
    return key_positions[:, None, :] <= query_positions[:, :, None]


def windows(slots: int, smallest: int) -> tuple[int, ...]:
    """The static prefix lengths attention may read from a cache of `slots` slots.

    smallest, 1.5 x smallest, 2 x smallest, 3 x smallest, ... (each at most 1.5x the one
    before), capped by and ending with `slots`: a call reads the shortest prefix that holds
    every key its queries may see, so its cost follows the tokens in the cache, within 1.5x,
    not the buffer's size.
    """
    sizes, size = [], smallest
    while size < slots:
        sizes += [s for s in (size, size * 3 // 2) if s < slots]
        size *= 2
    return tuple(sizes) + (slots,)
