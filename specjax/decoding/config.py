"""What is static about one generation (`DecodeSpec`) and the weights it reads (`Weights`).

Compiled programs are shared between equal specs (`loop.programs`): everything a spec holds is
hashable, and everything that changes between calls without recompiling (prompts, lengths,
keys, each row's sampling parameters, length and stop ids) is an argument instead.
"""

from __future__ import annotations

import dataclasses

import jax

from specjax import mesh as meshes
from specjax.decoding import lookahead
from specjax.heads.dflash import DFlashConfig
from specjax.heads.eagle import DrafterConfig
from specjax.heads.medusa import HeadsConfig
from specjax.model.config import ModelConfig
from specjax.sampling.rules import Rules
from specjax.sampling.tree import Tree

@dataclasses.dataclass(frozen=True)
class DecodeSpec:
    """Everything static about one generation: compiled code is shared between equal specs.
    What each row asks for (sampling parameters, length, stop ids) is data instead
    (`state.RowSettings`)."""
    method: str
    target_config: ModelConfig
    draft_config: ModelConfig | None = None
    k: int = 1
    max_ngram: int = 3
    min_ngram: int = 1
    buffer_length: int = 0         # token buffer and cache slots per row
    tree: Tree | None = None       # a token tree instead of a chain of k (`specjax.sampling.tree`)
    candidates: str = "top"        # how a drafter fills a tree (`decoding.trees.SCHEMES`)
    heads_config: HeadsConfig | None = None     # method "medusa" (`specjax.heads.medusa`)
    drafter_config: DrafterConfig | None = None  # method "eagle" (`specjax.heads.eagle`)
    dflash_config: DFlashConfig | None = None    # method "dflash" (`specjax.heads.dflash`)
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
    # The draw and verification rules (`specjax.sampling.rules`); the default is Theorem 1's.
    rules: Rules = Rules()
    # How many alternatives each emitted token's log-probability comes with (`state.Logprobs`);
    # 0: none are kept.
    logprobs: int = 0
    # The CPU kernels' switch (`specjax.model.linear`): the programs are traced inside
    # `use_kernels(kernels)`, so programs with and without them are never confused.
    kernels: bool = False

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

    @property
    def max_accepted(self) -> int | None:
        """The most drafted tokens one step can accept: K, a tree's depth, None without drafts."""
        if self.method == "autoregressive":
            return None
        return self.tree.max_depth if self.tree is not None else self.k


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Weights:
    target: dict
    draft: dict | None = None
    heads: dict | None = None      # `heads.medusa.runtime_weights`
    drafter: dict | None = None    # `heads.eagle.runtime_weights`, `heads.dflash.runtime_weights`
