"""What is static about one generation (`DecodeSpec`) and the weights it reads (`Weights`).

Compiled programs are shared between equal specs (`loop.programs`): everything a spec holds is
hashable, and everything that changes between calls without recompiling (prompts, lengths,
keys, each row's sampling parameters, length and stop ids) is an argument instead.
"""

from __future__ import annotations

import dataclasses
import sys
from types import ModuleType
from typing import ClassVar

import jax

from specjax import mesh as meshes
from specjax.decoding import lookahead
from specjax.model.config import ModelConfig
from specjax.model.linear import Kernels
from specjax.sampling.rules import Rules
from specjax.sampling.tree import Tree

@dataclasses.dataclass(frozen=True)
class Lookahead:
    """How many of its k tokens a row drafts each step (`decoding.lookahead`): the schedule,
    the heuristic's starting length and the confidence schedule's threshold."""
    schedule: str = "constant"
    start: int = lookahead.DEFAULT_K_START
    threshold: float = lookahead.DEFAULT_CONFIDENCE_THRESHOLD


@dataclasses.dataclass(frozen=True, kw_only=True)
class MethodSpec:
    """What is static about one method (`DecodeSpec.method`): a frozen dataclass that each
    method's decoding module declares for itself, naming the method (`name`). Its `module` is
    the module that declares it, whose three functions the loop runs:

      init(spec, weights, prompts, prompt_length) -> (target cache, carry)
          the prefill, and the method's own state (`DecodeState.carry`; None if it has none);
      step(spec, weights, state) -> state
          one step for every row, over a chain or a token tree (`spec.method.tree`);
      layout(spec, rows, cache) -> carry of shardings
          where the carry lives on a device mesh (`decoding.sharding`).

    Plain decoding drafts nothing (`max_accepted` None, `width` 0); every other method's spec
    is a `Drafting`."""
    name: ClassVar[str]
    module: ClassVar[ModuleType]
    max_accepted: ClassVar[int | None] = None
    width: ClassVar[int] = 0

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.module = sys.modules[cls.__module__]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Drafting(MethodSpec):
    """What every method that drafts has static: a chain of k tokens, or a token tree instead
    (`specjax.sampling.tree`), and how a drafter fills the tree (`decoding.trees.SCHEMES`)."""
    k: int = 1
    tree: Tree | None = None
    candidates: str = "top"

    @property
    def max_accepted(self) -> int:
        """The most drafted tokens one step can accept: the tree's depth, else k."""
        return self.tree.max_depth if self.tree is not None else self.k

    @property
    def width(self) -> int:
        """The drafted tokens one step verifies: the tree's nodes, else k."""
        return self.tree.size if self.tree is not None else self.k


@dataclasses.dataclass(frozen=True)
class DecodeSpec:
    """Everything static about one generation: compiled code is shared between equal specs.
    What each row asks for (sampling parameters, length, stop ids) is data instead
    (`state.RowSettings`)."""
    method: MethodSpec             # the method's own static spec; `method.module` runs it
    target_config: ModelConfig
    buffer_length: int = 0         # token buffer and cache slots per row
    # Keep each step's verify numbers in the state (`specjax.explain`, stepping only: the
    # state's structure changes after the first step, so `run` never traces).
    trace: bool = False
    # A "data" x "model" device mesh to run on (`specjax.mesh`), None for one device.
    mesh: jax.sharding.Mesh | None = None
    # The draw and verification rules (`specjax.sampling.rules`); the default is Theorem 1's.
    rules: Rules = Rules()
    # How many alternatives each emitted token's log-probability comes with (`extras.Logprobs`);
    # 0: none are kept.
    logprobs: int = 0
    # The CPU plug-in whose kernels the programs use (`specjax.model.linear.Kernels`; None:
    # XLA's formulations): `loop.lawful` writes it into every model config of the spec.
    kernels: Kernels | None = None

    @property
    def data_shards(self) -> int:
        """How many blocks of rows the mesh's "data" axis splits a batch into (1 without)."""
        return 1 if self.mesh is None else self.mesh.shape[meshes.DATA]

    @property
    def vocab_size(self) -> int:
        """The larger vocabulary of the target and the draft."""
        draft = getattr(self.method, "draft_config", None)
        return max(self.target_config.vocab_size, draft.vocab_size if draft else 0)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Weights:
    target: dict
    draft: dict | None = None
    heads: dict | None = None      # `heads.medusa.runtime_weights`
    drafter: dict | None = None    # `heads.eagle.runtime_weights`, `heads.dflash.runtime_weights`
