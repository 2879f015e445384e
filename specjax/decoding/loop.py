"""The shared driver: prefill, then a `lax.while_loop` over a method's step, jitted end to end.

`programs(spec)` compiles three programs for a spec: `run`, the whole generation as one
program (no host round trip per token), and `init` and `step`, the same pieces for a Python
loop that streams tokens as they are produced; all run the same functions, so they give the
same tokens. On a device mesh they are jitted with its input and output shardings
(`specjax.mesh`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

from specjax import mesh as meshes
from specjax.cache import KVCache
from specjax.config import ModelConfig
from specjax.decoding import autoregressive, lookahead, medusa, ngram, speculative
from specjax.decoding.state import DecodeState, initial_state
from specjax.logits import SamplingParams
from specjax.medusa import HeadsConfig
from specjax.rejection import verify, verify_tree
from specjax.tree import Tree

METHODS = ("autoregressive", "speculative", "ngram", "medusa")


@dataclasses.dataclass(frozen=True)
class DecodeSpec:
    """Everything static about one generation: compiled code is shared between equal specs."""
    method: str
    target_config: ModelConfig
    draft_config: ModelConfig | None
    sampling: SamplingParams
    max_new_tokens: int
    k: int = 1
    eos_ids: tuple[int, ...] = ()
    max_ngram: int = 3
    min_ngram: int = 1
    buffer_length: int = 0         # token buffer and cache slots per row
    tree: Tree | None = None       # a token tree instead of a chain of k (`specjax.tree`)
    candidates: str = "top"        # how a drafter fills a tree (`decoding.trees.SCHEMES`)
    heads_config: HeadsConfig | None = None     # method "medusa" (`specjax.medusa`)
    # How many of the k tokens a row drafts each step (`decoding.lookahead`).
    k_schedule: str = "constant"
    k_start: int = lookahead.DEFAULT_K_START
    confidence_threshold: float = lookahead.DEFAULT_CONFIDENCE_THRESHOLD
    # Keep each step's verify numbers in the state (`specjax.explain`, stepping only: the
    # state's structure changes after the first step, so `run` never traces).
    trace: bool = False
    # A "data" x "model" device mesh to run on (`specjax.mesh`), None for one device; with
    # shard_draft the draft's weights are split like the target's instead of replicated.
    mesh: jax.sharding.Mesh | None = None
    shard_draft: bool = False
    # Hooks, replaceable only to build deliberately broken samplers for the negative-control
    # tests; the defaults are the algorithm.
    verify_fn: Callable = verify
    propose_fn: Callable = speculative.propose
    tree_verify_fn: Callable = verify_tree

    @property
    def data_shards(self) -> int:
        """How many blocks of rows the mesh's "data" axis splits a batch into (1 without)."""
        return 1 if self.mesh is None else self.mesh.shape[meshes.DATA]

    @property
    def vocab_size(self) -> int:
        sizes = [self.target_config.vocab_size]
        if self.draft_config is not None:
            sizes.append(self.draft_config.vocab_size)
        return max(sizes)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Weights:
    target: dict
    draft: dict | None = None
    heads: dict | None = None      # `medusa.runtime_weights`


_STEPS = {"autoregressive": autoregressive.step, "speculative": speculative.step,
          "ngram": ngram.step, "medusa": medusa.step}


def _init(spec: DecodeSpec, weights: Weights, prompts, prompt_length, row_keys) -> DecodeState:
    slots = spec.buffer_length
    if spec.method == "medusa":
        target_cache, hidden = autoregressive.prefill(weights.target, spec.target_config, prompts,
                                                      prompt_length, slots, with_hidden=True,
                                                      shards=spec.data_shards)
        return _laid_out(spec, initial_state(prompts, prompt_length, row_keys, slots,
                                             target_cache, hidden=hidden,
                                             max_accepted=_max_accepted(spec)))
    target_cache = autoregressive.prefill(weights.target, spec.target_config, prompts,
                                          prompt_length, slots, shards=spec.data_shards)
    draft_cache = None
    if spec.method == "speculative":
        draft_cache = autoregressive.prefill(weights.draft, spec.draft_config, prompts,
                                             prompt_length, slots, shards=spec.data_shards)
    state = initial_state(prompts, prompt_length, row_keys, slots, target_cache, draft_cache,
                          lookahead=lookahead.initial_lengths(spec, prompts.shape[0]),
                          max_accepted=_max_accepted(spec))
    return _laid_out(spec, state)


def _max_accepted(spec: DecodeSpec) -> int | None:
    """The most drafted tokens one step can accept: K, a tree's depth, None without drafts."""
    if spec.method == "autoregressive":
        return None
    return spec.tree.max_depth if spec.tree is not None else spec.k


def _step(spec: DecodeSpec, weights: Weights, state: DecodeState) -> DecodeState:
    return _laid_out(spec, _STEPS[spec.method](spec, weights, state).replace(step=state.step + 1))


def _run(spec, weights, prompts, prompt_length, row_keys) -> DecodeState:
    state = _init(spec, weights, prompts, prompt_length, row_keys)
    return lax.while_loop(lambda s: ~jnp.all(s.done),
                          lambda s: _step(spec, weights, s), state)


# -- Shardings on a device mesh -----------------------------------------------------------------

def _laid_out(spec: DecodeSpec, state: DecodeState) -> DecodeState:
    """The state pinned to the mesh's layout (`state_shardings`): the loop carries the cache
    split as the weights are, instead of whatever the partitioner would infer. Identity on one
    device and while tracing a step (`DecodeSpec.trace` changes the state's structure)."""
    if spec.mesh is None or spec.trace:
        return state
    return lax.with_sharding_constraint(state, state_shardings(spec))


def weight_shardings(spec: DecodeSpec) -> Weights:
    """The target split (`mesh.param_shardings`), the draft replicated unless
    spec.shard_draft, the Medusa heads replicated."""
    mesh = spec.mesh
    draft = None
    if spec.draft_config is not None:
        draft = meshes.param_shardings(spec.draft_config, mesh, shard=spec.shard_draft)
    return Weights(meshes.param_shardings(spec.target_config, mesh), draft,
                   meshes.replicated(mesh) if spec.heads_config is not None else None)


def state_shardings(spec: DecodeSpec) -> DecodeState:
    """Every per-row array over "data", caches also over "model" by key/value head where their
    model's weights are split so (`mesh.cache_sharding`), the step counter replicated."""
    mesh = spec.mesh
    rows, one = meshes.rows(mesh), meshes.replicated(mesh)

    def cache(config, shard):
        heads = meshes.cache_sharding(config, mesh, shard)
        return KVCache(k=heads, v=heads, length=rows)

    drafts = spec.method != "autoregressive"
    return DecodeState(
        tokens=rows, length=rows, prompt_length=rows, done=rows, row_keys=rows, step=one,
        target_cache=cache(spec.target_config, True),
        draft_cache=(cache(spec.draft_config, spec.shard_draft)
                     if spec.method == "speculative" else None),
        target_calls=rows, draft_calls=rows, drafted=rows, accepted=rows, nan_seen=one,
        hidden=rows if spec.method == "medusa" else None,
        lookahead=rows if spec.k_schedule == "heuristic" else None,
        accepted_histogram=rows if drafts else None)


@functools.lru_cache(maxsize=None)
def programs(spec: DecodeSpec):
    """(init, step, run) for this spec, jitted; on a mesh, with explicit shardings for the
    weights, the per-row inputs and the state (not while tracing: `DecodeSpec.trace` changes
    the state's structure after the first step)."""
    functions = (functools.partial(_init, spec), functools.partial(_step, spec),
                 functools.partial(_run, spec))
    if spec.mesh is None or spec.trace:
        return tuple(jax.jit(f) for f in functions)
    weights, rows, state = (weight_shardings(spec), meshes.rows(spec.mesh),
                            state_shardings(spec))
    inputs = (weights, rows, rows, rows)
    return tuple(jax.jit(f, in_shardings=shardings, out_shardings=state)
                 for f, shardings in zip(functions, (inputs, (weights, state), inputs)))


def init(spec, weights, prompts, prompt_length, row_keys) -> DecodeState:
    """Prefill: prompts [B, P] int32 (right-padded), prompt_length [B], row_keys [B]."""
    return programs(spec)[0](weights, prompts, prompt_length, row_keys)


def step(spec, weights, state) -> DecodeState:
    """One step of the method for every row (finished rows are left unchanged)."""
    return programs(spec)[1](weights, state)
