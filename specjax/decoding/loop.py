"""The shared driver: prefill, then a `lax.while_loop` over a method's step, jitted end to end.

`run` is the whole generation as one compiled program (no host round trip per token).
`init` and `step` are the same pieces jitted separately, for a Python loop that streams tokens
as they are produced; both paths run the same functions, so they give the same tokens.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

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
    # Hooks, replaceable only to build deliberately broken samplers for the negative-control
    # tests; the defaults are the algorithm.
    verify_fn: Callable = verify
    propose_fn: Callable = speculative.propose
    tree_verify_fn: Callable = verify_tree

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
                                                      prompt_length, slots, with_hidden=True)
        return initial_state(prompts, prompt_length, row_keys, slots, target_cache,
                             hidden=hidden, max_accepted=_max_accepted(spec))
    target_cache = autoregressive.prefill(weights.target, spec.target_config, prompts,
                                          prompt_length, slots)
    draft_cache = None
    if spec.method == "speculative":
        draft_cache = autoregressive.prefill(weights.draft, spec.draft_config, prompts,
                                             prompt_length, slots)
    return initial_state(prompts, prompt_length, row_keys, slots, target_cache, draft_cache,
                         lookahead=lookahead.initial_lengths(spec, prompts.shape[0]),
                         max_accepted=_max_accepted(spec))


def _max_accepted(spec: DecodeSpec) -> int | None:
    """The most drafted tokens one step can accept: K, a tree's depth, None without drafts."""
    if spec.method == "autoregressive":
        return None
    return spec.tree.max_depth if spec.tree is not None else spec.k


def _step(spec: DecodeSpec, weights: Weights, state: DecodeState) -> DecodeState:
    return _STEPS[spec.method](spec, weights, state).replace(step=state.step + 1)


@functools.partial(jax.jit, static_argnums=0)
def init(spec, weights, prompts, prompt_length, row_keys) -> DecodeState:
    """Prefill: prompts [B, P] int32 (right-padded), prompt_length [B], row_keys [B]."""
    return _init(spec, weights, prompts, prompt_length, row_keys)


@functools.partial(jax.jit, static_argnums=0)
def step(spec, weights, state) -> DecodeState:
    """One step of the method for every row (finished rows are left unchanged)."""
    return _step(spec, weights, state)


@functools.partial(jax.jit, static_argnums=0)
def run(spec, weights, prompts, prompt_length, row_keys) -> DecodeState:
    """The whole generation: prefill, then steps until every row is done."""
    state = _init(spec, weights, prompts, prompt_length, row_keys)
    return lax.while_loop(lambda s: ~jnp.all(s.done),
                          lambda s: _step(spec, weights, s), state)
