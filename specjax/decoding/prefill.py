"""The prefill every method starts with: the prompts read through a fresh cache, in chunks.

`prefill` returns a `Prefilled`: the cache, and the hidden states a drafter reads when they are
asked for (`hidden`: "last" for Medusa heads, "all" for EAGLE and DFlash drafters).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from specjax.model.cache import KVCache
from specjax.model.transformer import hidden_states, tapped_states

# Prompts are read this many positions per call: long enough for efficient matrix products,
# short enough that padding costs little (at most one chunk) and that a call's attention reads
# only the cache prefix its positions can see (`layers.attend_cache`).
PREFILL_CHUNK = 256
MIN_PREFILL_CHUNK = 8
MAX_PREFILL_GROUPS = 8

# Which hidden states `prefill` keeps: none, each row's at its last cached position, or all.
HIDDEN = (None, "last", "all")


class Prefilled(NamedTuple):
    """What `prefill` gives."""
    cache: KVCache              # every position before each row's last prompt token
    hidden: jax.Array | None    # the hidden states asked for (`prefill`'s `hidden`), else None


def prefill_chunk(batch: int) -> int:
    """Prompt positions per prefill call for `batch` rows: PREFILL_CHUNK for one row, halved
    while a call would hold more than PREFILL_CHUNK tokens (down to MIN_PREFILL_CHUNK).

    A call on B rows of c positions is a matrix product of B * c rows, efficient from a few
    hundred; and the last chunk pads every row up to a multiple of c, so a batch of short
    prompts wastes less with small chunks.
    """
    chunk = PREFILL_CHUNK
    while chunk > MIN_PREFILL_CHUNK and chunk * batch > PREFILL_CHUNK:
        chunk //= 2
    return chunk


def prefill_groups(batch: int) -> int:
    """How many groups of rows a batch's prefill runs as (`prefill`): about one per 4 rows, at
    most MAX_PREFILL_GROUPS, and a divisor of the batch (1 for fewer than 8 rows)."""
    most = min(MAX_PREFILL_GROUPS, batch // 4)
    return max([g for g in range(1, most + 1) if batch % g == 0], default=1)


def prefill(params, config, prompts, prompt_length, slots: int,
            chunk: int | None = None, hidden: str | None = None, shards: int = 1,
            taps: tuple[int, ...] = ()) -> Prefilled:
    """Runs the padded prompts [B, P] through a fresh cache of `slots` >= P slots, `chunk`
    positions per call.

    The cache is left holding every position before each row's last prompt token: the first
    decoding step feeds that token again (one position of repeated work, in exchange for one
    code path for every prompt length, including 1). Chunks past the longest row's last needed
    position are not run (the loop's trip count is computed at run time), and prefill stops
    before the LM head: it needs only the keys and values.

    A batch of 8 or more rows is sorted by prompt length and read as `prefill_groups(B)`
    groups of equal size, one after another (`lax.map`: one compiled body), each for as many
    chunks as its own longest row needs; the caches are put back in the rows' order. Every
    call of a batch computes all its rows, so without the groups a batch of short prompts pays
    for its longest one (docs/benchmarks.md). A row's numbers do not depend on its group: rows
    never interact.

    With `shards` > 1, the rows are split into that many consecutive blocks (a mesh's "data"
    axis, `specjax.mesh`), each sorted and grouped on its own, and a group holds the same
    number of rows of every block: no row's prompt or cache leaves its block's devices.

    `hidden` (one of `HIDDEN`) says which final hidden states `Prefilled.hidden` holds: None,
    none; "last", each row's at its last cached position, prompt_length - 2 [B, D] (zeros for a
    one-token prompt): what Medusa heads read; "all", those of every prompt position [B, P, D]
    (those at and after a row's last token are stale): what an EAGLE or DFlash drafter reads,
    or with `taps` its tapped states instead (`transformer.tapped_states`,
    [B, P, len(taps) * D]).
    """
    if hidden not in HIDDEN:
        raise ValueError(f"hidden must be one of {HIDDEN}, got {hidden!r}")
    b = prompts.shape[0]
    per_shard = b // shards
    groups = prefill_groups(per_shard)
    if groups == 1:
        return _prefill_rows(params, config, prompts, prompt_length, slots, chunk, hidden, taps)
    rows = per_shard // groups
    order = jnp.argsort(prompt_length.reshape(shards, per_shard), axis=1, stable=True)
    back = jnp.argsort(order, axis=1)                        # row -> its sorted place

    def by_block(a, index):   # [shards, per_shard, ...] rows reordered within each block
        return jnp.take_along_axis(a, index.reshape(*index.shape, *(1,) * (a.ndim - 2)), axis=1)

    def to_groups(a):         # [B, ...] -> [groups, shards * rows, ...], shortest rows first
        a = by_block(a.reshape(shards, per_shard, *a.shape[1:]), order)
        a = jnp.swapaxes(a.reshape(shards, groups, rows, *a.shape[2:]), 0, 1)
        return a.reshape(groups, shards * rows, *a.shape[3:])

    def from_groups(a):       # the inverse of to_groups
        a = jnp.swapaxes(a.reshape(groups, shards, rows, *a.shape[2:]), 0, 1)
        return by_block(a.reshape(shards, per_shard, *a.shape[3:]), back).reshape(b, *a.shape[3:])

    def read_group(group):
        return _rows_first(_prefill_rows(params, config, *group, slots, chunk, hidden, taps))

    stacked = lax.map(read_group, (to_groups(prompts), to_groups(prompt_length)))
    return _rows_first(jax.tree.map(from_groups, stacked))


def _rows_first(out):
    """The caches in `out` with the rows' axis and the layers' swapped (keys [L, B, ...] <->
    [B, L, ...]), so that every leaf's rows lead while groups of rows are put together."""
    def swap(cache):
        return (KVCache(jnp.swapaxes(cache.k, 0, 1), jnp.swapaxes(cache.v, 0, 1), cache.length,
                        cache.first) if isinstance(cache, KVCache) else cache)
    return jax.tree.map(swap, out, is_leaf=lambda a: isinstance(a, KVCache))


def _prefill_rows(params, config, prompts, prompt_length, slots, chunk, which,
                  taps) -> Prefilled:
    """`prefill` of one group of rows, all in every call. Each call is a prefill's
    (`transformer.hidden_states`' `prefill`): the model computes its wide products by XLA's
    GEMM."""
    b, p = prompts.shape
    chunk = min(p, chunk or prefill_chunk(b))
    n_chunks = (jnp.max(prompt_length) - 1 + chunk - 1) // chunk
    wanted = prompt_length - 2                                                  # [B]

    def run_chunk(c, carry):
        cache, hidden = carry
        # A last chunk that would run past the padded prompt is moved back to end with it: the
        # positions it repeats get the same keys and values again.
        start = jnp.minimum(c * chunk, p - chunk)
        tokens = lax.dynamic_slice_in_dim(prompts, start, chunk, axis=1)           # [B, chunk]
        positions = start + jnp.broadcast_to(jnp.arange(chunk, dtype=jnp.int32), (b, chunk))
        if taps:
            # The tapped states and the cache (not the final-normed states).
            x, cache = tapped_states(params, config, tokens, positions, cache, taps=taps,
                                     prefill=True)[1:]
        else:
            x, cache = hidden_states(params, config, tokens, positions, cache, prefill=True)
        if which == "all":
            hidden = lax.dynamic_update_slice_in_dim(hidden, x.astype(hidden.dtype), start, 1)
        elif which == "last":
            index = wanted - start
            here = (index >= 0) & (index < chunk)
            picked = jnp.take_along_axis(x, jnp.clip(index, 0, chunk - 1)[:, None, None], 1)
            hidden = jnp.where(here[:, None], picked[:, 0], hidden)
        return cache, hidden

    width = config.d_model * max(1, len(taps))
    shape = (b, p, width) if which == "all" else (b, width)
    hidden = jnp.zeros(shape, jnp.dtype(config.compute_dtype)) if which else None
    cache, hidden = lax.fori_loop(0, n_chunks, run_chunk,
                                  (KVCache.init(config, b, slots), hidden))
    return Prefilled(cache.with_length(prompt_length - 1), hidden)
