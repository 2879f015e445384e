"""The shared driver: prefill, then a `lax.while_loop` over a method's step, jitted end to end.

`programs(spec)` compiles three programs for a spec: `run`, the whole generation as one
program (no host round trip per token), and `init` and `step`, the same pieces for a Python
loop that streams tokens as they are produced; all run the same functions, so they give the
same tokens. On a device mesh they are jitted with its input and output shardings
(`decoding.sharding`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from specjax import mesh as meshes
from specjax.decoding.sharding import pinned, settings_layout, state_shardings, weight_shardings
from specjax.decoding.config import DecodeSpec, Weights
from specjax.decoding.state import DecodeState, RowSettings, initial_state
from specjax.model.config import ModelConfig
from specjax.model.transformer import lawful as lawful_config

__all__ = ["DecodeSpec", "Programs", "Weights", "init", "programs", "step", "with_kernels"]


class Programs(NamedTuple):
    """The jitted programs of one spec (`programs`)."""
    init: Callable    # (weights, prompts, prompt_length, row_keys, settings) -> state: prefill
    step: Callable    # (weights, state) -> state: one step for every row
    run: Callable     # (weights, prompts, prompt_length, row_keys, settings) -> state: the
    #                   whole generation, init then steps until every row is done


def _init(spec: DecodeSpec, weights: Weights, prompts, prompt_length, row_keys,
          settings: RowSettings) -> DecodeState:
    target_cache, carry = spec.method.module.init(spec, weights, prompts, prompt_length)
    return pinned(spec, initial_state(prompts, prompt_length, row_keys, settings,
                                      spec.buffer_length, target_cache, carry,
                                      max_accepted=spec.method.max_accepted,
                                      logprobs=spec.logprobs))


def _step(spec: DecodeSpec, weights: Weights, state: DecodeState) -> DecodeState:
    state = spec.method.module.step(spec, weights, state)
    return pinned(spec, state.replace(step=state.step + 1))


def _run(spec, weights, prompts, prompt_length, row_keys, settings) -> DecodeState:
    state = _init(spec, weights, prompts, prompt_length, row_keys, settings)
    return lax.while_loop(lambda s: ~jnp.all(s.done),
                          lambda s: _step(spec, weights, s), state)


@functools.lru_cache(maxsize=None)
def programs(spec: DecodeSpec) -> Programs:
    """`Programs` (init, step, run) for this spec, jitted; on a mesh, with explicit shardings
    for the weights, the per-row inputs and the state (not while tracing: `DecodeSpec.trace`
    changes the state's structure after the first step)."""
    # Each is traced with the spec's kernels in its configs (`lawful`). On a mesh there are none
    # (the API sees to it): XLA's partitioner cannot split a custom call across devices, it
    # would gather every weight onto each.
    functions = tuple(functools.partial(f, lawful(spec)) for f in (_init, _step, _run))
    if spec.mesh is None or spec.trace:
        return Programs(*(jax.jit(f) for f in functions))
    weights, rows, state = (weight_shardings(spec), meshes.rows(spec.mesh),
                            state_shardings(spec))
    inputs = (weights, rows, rows, rows, settings_layout(spec))
    return Programs(*(jax.jit(f, in_shardings=shardings, out_shardings=state)
                      for f, shardings in zip(functions, (inputs, (weights, state), inputs))))


def lawful(spec: DecodeSpec) -> DecodeSpec:
    """The spec its programs are traced with, where their products are chosen: every model
    config in it (the target's, a draft model's, a drafter's layers) names the spec's CPU
    kernels (`spec.kernels`; None: XLA's formulations), and the target's calls take the one
    law's width where the kernels do not serve (`transformer.lawful`)."""
    return dataclasses.replace(spec, target_config=lawful_config(spec.target_config, spec.kernels),
                               method=with_kernels(spec.method, spec.kernels))


def with_kernels(value, kernels):
    """`value` (a config, a method's static spec, or a field of one) with every `ModelConfig`
    in it naming the CPU plug-in `kernels` (None: XLA's formulations): a draft model's config,
    an EAGLE or DFlash drafter's layers."""
    if isinstance(value, ModelConfig):
        return value.replace(kernels=kernels)
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        return value
    changed = {f.name: with_kernels(getattr(value, f.name), kernels)
               for f in dataclasses.fields(value) if f.init}
    changed = {name: new for name, new in changed.items() if new is not getattr(value, name)}
    return dataclasses.replace(value, **changed) if changed else value


def init(spec, weights, prompts, prompt_length, row_keys, settings) -> DecodeState:
    """Prefill: prompts [B, P] int32 (right-padded), prompt_length [B], row_keys [B], and each
    row's `RowSettings`."""
    return programs(spec).init(weights, prompts, prompt_length, row_keys, settings)


def step(spec, weights, state) -> DecodeState:
    """One step of the method for every row (finished rows are left unchanged)."""
    return programs(spec).step(weights, state)
