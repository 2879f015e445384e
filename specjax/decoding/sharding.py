"""The decoding loop's layout on a device mesh (`specjax.mesh`): which shards the weights and
the decode state live on, so that `loop.programs` can jit with explicit shardings and the
`lax.while_loop` carries the cache split as the weights are.
"""

from __future__ import annotations

from jax import lax

from specjax import mesh as meshes
from specjax.decoding.config import DecodeSpec, Weights
from specjax.decoding.extras import Logprobs
from specjax.decoding.state import DecodeState, RowSettings
from specjax.sampling.constraints import Constraint
from specjax.model.cache import KVCache


def weight_shardings(spec: DecodeSpec) -> Weights:
    """The target split (`mesh.param_shardings`), a draft model (a spec with a `draft_config`)
    replicated unless its spec's `shard_draft`, heads and drafters replicated (a sharding for
    weights a method does not read matches their None)."""
    mesh, method = spec.mesh, spec.method
    draft_config = getattr(method, "draft_config", None)
    draft = (None if draft_config is None else
             meshes.param_shardings(draft_config, mesh, shard=method.shard_draft))
    one = meshes.replicated(mesh)
    return Weights(meshes.param_shardings(spec.target_config, mesh), draft, one, one)


def state_shardings(spec: DecodeSpec) -> DecodeState:
    """Every per-row array over "data", caches also over "model" by key/value head where their
    model's weights are split so (`mesh.cache_sharding`), the step counter replicated; the
    method's carry as its module's `layout` says."""
    mesh = spec.mesh
    rows, one = meshes.rows(mesh), meshes.replicated(mesh)

    def cache(config, shard, first=0):
        heads = meshes.cache_sharding(config, mesh, shard)
        return KVCache(k=heads, v=heads, length=rows, first=first)

    drafts = spec.method.max_accepted is not None
    return DecodeState(
        tokens=rows, length=rows, prompt_length=rows, done=rows, row_keys=rows,
        settings=settings_layout(spec), step=one, target_cache=cache(spec.target_config, True),
        target_calls=rows, draft_calls=rows, drafted=rows, accepted=rows, nan_seen=one,
        carry=spec.method.module.layout(spec, rows, cache),
        accepted_histogram=rows if drafts else None,
        logprobs=Logprobs(rows, rows, rows) if spec.logprobs else None, fsm=rows)


def settings_layout(spec: DecodeSpec) -> RowSettings:
    """Every per-row setting over "data"; the automata's table, one for the batch, replicated."""
    rows, one = meshes.rows(spec.mesh), meshes.replicated(spec.mesh)
    return RowSettings(sampling=rows, max_new_tokens=rows, stop_ids=rows, controls=rows,
                       constraint=Constraint(table=one, start=rows, active=rows))


def pinned(spec: DecodeSpec, state: DecodeState) -> DecodeState:
    """The state pinned to the mesh's layout (`state_shardings`): the loop carries the cache
    split as the weights are, instead of whatever the partitioner would infer. Identity on one
    device and while tracing a step (`DecodeSpec.trace` changes the state's structure)."""
    if spec.mesh is None or spec.trace:
        return state
    return lax.with_sharding_constraint(state, state_shardings(spec))
