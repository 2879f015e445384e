"""The key/value cache: fixed-size buffers, per-row lengths, masks from absolute positions.

Shapes use the letters of `specjax.model`: L layers, B batch, S cache slots, K key/value heads,
H head size, T query length. A layer's keys are stored [B, K, H, S] and its values [B, K, S, H]:
each head is one contiguous matrix laid out the way attention's two products read it (scores
contract H against the keys, the output contracts S against the values); docs/benchmarks.md,
"The model's layouts, measured", has what that bought on a CPU.

Slot s of row b holds the key and value of the token at absolute position s. A forward call
with tokens at positions p0 .. p0+T-1 writes slots p0 .. p0+T-1, and a query at position p
attends to slots s <= p. Everything before p0 was written by earlier calls for the current
sequence, everything after p is masked, so stale entries beyond a row's length (rejected draft
tokens, right padding of a ragged prompt) are never read: rolling back is just setting a
smaller length, and the next call overwrites those slots before anyone can see them.

Every layer's buffers are stacked, keys [L, B, K, H, S] and values [L, B, K, S, H], so that the
decoder's one compiled layer (`transformer.decoder_layers`, a loop over L) reads and writes
layer l's part by its index: a call writes its new entries into the stack where they go
(`write`), and attention to the cache on a few tokens reads the layer's part where it lies
(`layers.attend_cache`), never a slice of it copied out.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

from specjax.model.config import ModelConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    k: jax.Array               # [L, B, K, H, S]
    v: jax.Array               # [L, B, K, S, H]
    length: jax.Array          # [B] int32: number of valid positions of each row
    # Slots before `first` are read only by queries in them (static). A published EAGLE
    # drafter never saw the pair in slot 0 (no feature comes before the first token), so its
    # cache has first = 1 (`specjax.heads.eagle`); every model's own cache has 0.
    first: int = dataclasses.field(default=0, metadata=dict(static=True))

    @classmethod
    def init(cls, config: ModelConfig, batch: int, slots: int, dtype=None,
             first: int = 0) -> "KVCache":
        dtype = dtype or jnp.dtype(config.compute_dtype)
        layers, heads, h = config.n_layers, config.n_kv_heads, config.head_dim
        return cls(jnp.zeros((layers, batch, heads, h, slots), dtype),
                   jnp.zeros((layers, batch, heads, slots, h), dtype),
                   jnp.zeros((batch,), jnp.int32), first)

    @property
    def slots(self) -> int:
        return self.v.shape[-2]

    def with_length(self, length: jax.Array) -> "KVCache":
        """Sets each row's length: rollback of rejected tokens, or the true length of a padded row."""
        return dataclasses.replace(self, length=jnp.asarray(length, jnp.int32))


def write(cache_k: jax.Array, cache_v: jax.Array, k: jax.Array, v: jax.Array,
          slots: jax.Array, layer=0) -> tuple[jax.Array, jax.Array]:
    """Writes one layer's new keys and values at each row's positions, into the stack.

    Args:
      cache_k: [L, B, K, H, S] and cache_v: [L, B, K, S, H], every layer's buffers.
      k, v: [B, T, K, H] the new entries of layer `layer` ([] int, traced or not).
      slots: [B, T] the slots to write (the tokens' positions, except in a token tree). The
        caller keeps them below S (an entry past the end would be dropped).
    """
    return (_scatter_rows(cache_k, 4, slots, k, layer),
            _scatter_rows(cache_v, 3, slots, v, layer))


# What a bfloat16 cache is carried as through the decoder's layers (`as_bits`).
BITS = jnp.dtype(jnp.uint16)


def as_bits(buffer: jax.Array):
    """A 16-bit float buffer as its integer bits, and the function that turns bits back: XLA's
    CPU backend has no bfloat16 update or gather, so it would convert the whole buffer to
    float32 and back at every write; as integers, the write touches only the new slots. The
    bits, and so the values, are the same. The conversion itself is a copy of the buffer, so
    the decoder converts its stacked cache once a call, not at every layer's write
    (`transformer.decoder_layers`)."""
    if jnp.dtype(buffer.dtype).itemsize != 2 or not jnp.issubdtype(buffer.dtype, jnp.floating):
        return buffer, lambda bits: bits
    dtype = buffer.dtype
    return (lax.bitcast_convert_type(buffer, jnp.uint16),
            lambda bits: lax.bitcast_convert_type(bits, dtype))


def _scatter_rows(buffer: jax.Array, slot_axis: int, slots: jax.Array, new: jax.Array,
                  layer=None) -> jax.Array:
    """Writes new [B, T, ...] into a stacked buffer [L, B, ...] at row b's `slots[b, t]` along
    `slot_axis` (and layer `layer`, or every layer when None: then new holds them, [B, T, L,
    ...]); the other axes whole, in the buffer's order. One scatter whose rows are a batch
    dimension of both operands: a device mesh keeps each row's write on its own devices, and
    XLA transposes nothing (a `vmap` over the stack's second axis made it transpose the whole
    stack around every write)."""
    b, t = slots.shape
    indexed = (0, slot_axis) if layer is not None else (slot_axis,)
    window = tuple(a for a in range(buffer.ndim) if a not in (1, *indexed))
    columns = [slots.astype(jnp.int32)]
    if layer is not None:
        columns.insert(0, jnp.broadcast_to(jnp.asarray(layer, jnp.int32), (b, t)))
    numbers = lax.ScatterDimensionNumbers(
        update_window_dims=tuple(range(2, 2 + len(window))), inserted_window_dims=indexed,
        scatter_dims_to_operand_dims=indexed, operand_batching_dims=(1,),
        scatter_indices_batching_dims=(0,))
    if buffer.dtype == BITS:           # a bfloat16 stack carried as its bits (`as_bits`)
        new = lax.bitcast_convert_type(new.astype(jnp.bfloat16), BITS)
    bits, back = as_bits(buffer)
    new, _ = as_bits(new.astype(buffer.dtype))
    return back(lax.scatter(bits, jnp.stack(columns, axis=-1), new, numbers,
                            unique_indices=True, mode=lax.GatherScatterMode.FILL_OR_DROP))


def _gather_rows(buffer: jax.Array, slot_axis: int, slots: jax.Array) -> jax.Array:
    """Row b's `slots[b, n]` along `slot_axis` of a stacked buffer [L, B, ...], every layer ->
    [B, n, L, ...] (the other axes whole, in the buffer's order): `_scatter_rows`'s inverse."""
    window = tuple(a for a in range(buffer.ndim) if a not in (1, slot_axis))
    sizes = tuple(1 if a in (1, slot_axis) else buffer.shape[a] for a in range(buffer.ndim))
    numbers = lax.GatherDimensionNumbers(
        offset_dims=tuple(range(2, 2 + len(window))), collapsed_slice_dims=(slot_axis,),
        start_index_map=(slot_axis,), operand_batching_dims=(1,),
        start_indices_batching_dims=(0,))
    bits, back = as_bits(buffer)
    return back(lax.gather(bits, slots.astype(jnp.int32)[..., None], numbers, sizes,
                           mode=lax.GatherScatterMode.CLIP))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TreeAttention:
    """Tells a forward call that its tokens are nodes of a token tree (`specjax.sampling.tree`).

    The tree's nodes occupy consecutive cache slots after its root: node i of the row's tree is
    at slot root + i, while its position (for RoPE) is root + depth[i]. A call feeds the nodes
    first .. first + T - 1. Each attends to the slots before the root and to the nodes that are
    its ancestors or itself, never to a sibling's branch.
    """
    root: jax.Array              # [B] int32: the slot (and position) of each row's tree root
    ancestors: jax.Array         # [n, n] bool: `Tree.ancestors`; [B, n, n] for one tree per row
    first: int = dataclasses.field(default=0, metadata=dict(static=True))

    def slots(self, t: int) -> jax.Array:
        """[B, T] the cache slots of this call's T nodes."""
        return self.root[:, None] + self.first + jnp.arange(t, dtype=jnp.int32)


def attention_mask(query_slots: jax.Array, key_slots: jax.Array,
                   tree: TreeAttention | None = None, first: int = 0) -> jax.Array:
    """[B, T] queries x [B, S] keys -> [B, T, S] bool: which cache slots each query reads.

    Causal over slots; inside a token tree's slots, only the query node's ancestors. Outside a
    tree, slots are positions, so this is the usual causal mask from absolute positions; a chain
    is the tree whose ancestor matrix is lower-triangular, so it gets the same mask. Slots
    before `first` (`KVCache.first`) are seen only by queries in them, so no query's row is
    empty.
    """
    mask = key_slots[:, None, :] <= query_slots[:, :, None]
    if first:
        mask &= (key_slots >= first)[:, None, :] | (query_slots < first)[:, :, None]
    if tree is None:
        return mask
    n = tree.ancestors.shape[-1]
    key_node = key_slots - tree.root[:, None]                                # [B, S]
    query = jnp.clip(query_slots - tree.root[:, None], 0, n - 1)             # [B, T]
    key = jnp.clip(key_node, 0, n - 1)
    if tree.ancestors.ndim == 3:                  # one tree per row
        related = jax.vmap(lambda a, q, k: a[q[:, None], k[None, :]])(tree.ancestors, query, key)
    else:
        related = tree.ancestors[query[:, :, None], key[:, None, :]]          # [B, T, S]
    return mask & ((key_node < 0)[:, None, :] | related)


def branch_layout(query_slots: jax.Array, key_slots: jax.Array,
                  tree: TreeAttention) -> tuple[jax.Array, jax.Array]:
    """Each query of a tree call, its keys laid out as one-token steps along its branch would
    find them: the ancestor at depth j in slot root + j, the slots outside the tree where they
    are. For XLA's path, whose attention sums the slots in an order that depends on where the
    nonzero ones lie (`layers.attend_cache`'s `by_branch`).

    Args:
      query_slots: [B, T] the call's slots; key_slots: [B, S] the window's; tree: its tree,
        nodes numbered parent before child (`Tree`, `RowTrees`).
    Returns:
      sources [B, T, S]: for each query, the slot whose key and value its key slot s takes;
      positions [B, T]: each query's position, root + depth, the slot it has in that layout
      (it reads the slots up to it). Slots past a query's depth hold what they held, masked.
    """
    n = tree.ancestors.shape[-1]
    b = query_slots.shape[0]
    ancestors = jnp.broadcast_to(tree.ancestors, (b, n, n))                     # [B, n, n]
    node = jnp.clip(query_slots - tree.root[:, None], 0, n - 1)                 # [B, T]
    branch = ancestors[jnp.arange(b)[:, None], node]                            # [B, T, n]
    depth_of = jnp.cumsum(branch, axis=-1, dtype=jnp.int32) - 1   # an ancestor's depth: rank
    at = branch[:, :, None, :] & (depth_of[:, :, None, :] == jnp.arange(n)[:, None])
    node_at = jnp.where(at.any(-1), jnp.argmax(at, -1), jnp.arange(n))          # [B, T, n]
    offset = key_slots - tree.root[:, None]                                     # [B, S]
    inside = ((offset >= 0) & (offset < n))[:, None, :]                        # [B, 1, S]
    within = jnp.broadcast_to(jnp.clip(offset, 0, n - 1)[:, None, :],
                              (*node.shape, offset.shape[1]))                   # [B, T, S]
    sources = jnp.where(inside, tree.root[:, None, None]
                        + jnp.take_along_axis(node_at, within, axis=-1), key_slots[:, None, :])
    return sources.astype(jnp.int32), tree.root[:, None] + depth_of[..., -1]


def keep_path(cache_k: jax.Array, cache_v: jax.Array, root: jax.Array, path: jax.Array,
              nodes: int) -> tuple[jax.Array, jax.Array]:
    """After a tree call: moves the accepted nodes' keys and values to consecutive slots.

    Node path[b, d] (the accepted node at depth d + 1) moves from slot root + path[b, d] to slot
    root + 1 + d, where the chain that the rest of the cache assumes puts it; then rolling back
    by length forgets the other branches like any rejected draft.

    Args:
      cache_k: [L, B, K, H, S] and cache_v: [L, B, K, S, H], every layer's buffers.
      root: [B] the tree's root slot; path: [B, D] node indices in 1 .. nodes - 1 (entries past
        the accepted depth are ignored: their slots are stale after the rollback).
      nodes: the tree's node count including the root (static).
    """
    b, depth = path.shape
    source = jnp.concatenate([jnp.zeros((b, 1), jnp.int32), path.astype(jnp.int32),
                              jnp.broadcast_to(jnp.arange(depth + 1, nodes, dtype=jnp.int32),
                                               (b, nodes - depth - 1))], axis=1)  # [B, n]
    sources = root[:, None] + source                                      # [B, n]
    targets = root[:, None] + jnp.arange(nodes, dtype=jnp.int32)          # [B, n]

    def move(buffer, slot_axis):     # each row's tree slots, in path order, every layer at once
        return _scatter_rows(buffer, slot_axis, targets,
                             _gather_rows(buffer, slot_axis, sources))
    return move(cache_k, 4), move(cache_v, 3)


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
