"""The decoding methods as objects that carry their own options and weights.

    specjax.generate(target, prompts, specjax.Speculative(draft, k=4))
    specjax.generate(target, prompts, specjax.Eagle(drafter, tree=specjax.DynamicTree(4, 4, 8)))
    specjax.generate(target, prompts, "ngram")          # a name: the method with its defaults

One class per record of the registry (`decoding.methods.REGISTRY`, found by their `name`). Each
checks its own values when it is made (a `GenerationError` naming the field), and `bind` checks
what it carries against the target and the request (its weights' fit, its tree against the
context window, its candidate scheme against the temperatures) and returns what the decoding
loop needs of it (`Bound`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from specjax.api.checks import (check_compatible, check_drafter, check_drafter_dtype,
                                check_heads, check_schedule, check_tree, check_tree_fits_heads)
from specjax.decoding.config import (AutoregressiveSpec, DFlashSpec, EagleSpec, MedusaSpec,
                                     MethodSpec, NGramSpec, SpeculativeSpec)
from specjax.decoding.methods import REGISTRY, listing
from specjax.heads import dflash, eagle
from specjax.heads.dflash import BlockDrafter
from specjax.heads.medusa import Heads, runtime_weights
from specjax.io.dflash import check_target as check_block_drafter
from specjax.model.transformer import Model, in_dtype
from specjax.sampling.params import GenerationError, check_int
from specjax.sampling.tree import DynamicTree, Tree

# The drafts a step verifies when k is not given (a DFlash drafter's block sets its own).
DEFAULT_K = 4


@dataclasses.dataclass(frozen=True)
class Bound:
    """A method checked against a target: its static spec (`DecodeSpec.method`), what it runs
    beside the target (the draft model, the runtime weights of heads or a drafter) and how many
    slots one step writes past a row's end (`room`)."""
    spec: MethodSpec
    draft: Model | None = None
    weights: Any = None          # `Weights.heads` or `Weights.drafter`, by the method
    room: int = 1


@dataclasses.dataclass(frozen=True)
class Method:
    """What every method object shares: its registry name and its binding."""
    name: ClassVar[str]

    @property
    def record(self):
        """The method's registry record (`decoding.methods.Record`)."""
        return REGISTRY[self.name]

    def bind(self, target: Model, greedy: bool, mesh) -> Bound:
        raise NotImplementedError


def _check_k(k) -> None:
    check_int("k", k, 1)


def _dtype(method: str, dtype, target: Model, mesh) -> str:
    return check_drafter_dtype(dtype, method, target, mesh)


def _chain(tree, k: int) -> int:
    """How many slots a step of a chain of k, or of a tree, writes."""
    if isinstance(tree, DynamicTree):   # the drafter reads its frontiers past the tree's end
        return max(tree.size, (tree.depth - 1) * tree.top_k)
    return tree.size if tree is not None else k


@dataclasses.dataclass(frozen=True)
class Autoregressive(Method):
    """One target call per token: the baseline every other method is exact against."""
    name: ClassVar[str] = "autoregressive"

    def bind(self, target, greedy, mesh) -> Bound:
        return Bound(AutoregressiveSpec())


@dataclasses.dataclass(frozen=True)
class Speculative(Method):
    """A draft model proposes, the target verifies (Chen et al. 2023): k drafts a step as a
    chain, or a token `tree` filled by the `candidates` scheme ("top", "distinct", "iid"; the
    default "top" at temperature 0, "distinct" otherwise); `k_schedule` "heuristic" or
    "confidence" draws fewer when drafts are rejected (`decoding.lookahead`). The draft runs in
    `drafter_dtype` (default: the target's) and, on a mesh, replicated unless `shard_draft`."""
    draft: Model
    k: int = DEFAULT_K
    tree: Any = None
    candidates: str | None = None
    k_schedule: str = "constant"
    k_start: int | None = None
    confidence_threshold: float | None = None
    drafter_dtype: str | None = None
    shard_draft: bool = False
    name: ClassVar[str] = "speculative"

    def __post_init__(self):
        if not isinstance(self.draft, Model):
            raise GenerationError(f"method 'speculative' needs a draft model (a Model from "
                                  f"specjax.load), got {type(self.draft).__name__}")
        _check_k(self.k)
        if not isinstance(self.shard_draft, bool):
            raise GenerationError(f"shard_draft must be True or False, got {self.shard_draft!r}")

    def bind(self, target, greedy, mesh) -> Bound:
        dtype = _dtype(self.name, self.drafter_dtype, target, mesh)
        tree, candidates = check_tree(self.name, self.tree, self.candidates, greedy, target)
        schedule = check_schedule(self.name, tree, self.k, self.k_schedule, self.k_start,
                                  self.confidence_threshold)
        if self.shard_draft and mesh is None:
            raise GenerationError("shard_draft applies to method 'speculative' on a mesh "
                                  "(mesh=...)")
        check_compatible(target, self.draft)
        draft = in_dtype(self.draft, dtype)
        return Bound(SpeculativeSpec(k=_chain(tree, self.k), tree=tree, candidates=candidates,
                                     draft_config=draft.config, lookahead=schedule,
                                     shard_draft=self.shard_draft),
                     draft=draft, room=_chain(tree, self.k))


@dataclasses.dataclass(frozen=True)
class NGram(Method):
    """Drafts looked up in the prompt and the output so far (prompt lookup): the longest match
    of `max_ngram` down to `min_ngram` tokens proposes the k tokens that followed it, as a
    chain, or a `tree` of its candidates; `k_schedule` "heuristic" adapts k per row."""
    k: int = DEFAULT_K
    max_ngram: int = 3
    min_ngram: int = 1
    tree: Any = None
    k_schedule: str = "constant"
    k_start: int | None = None
    name: ClassVar[str] = "ngram"

    def __post_init__(self):
        _check_k(self.k)
        check_int("min_ngram", self.min_ngram, 1)
        check_int("max_ngram", self.max_ngram, self.min_ngram)

    def bind(self, target, greedy, mesh) -> Bound:
        tree, candidates = check_tree(self.name, self.tree, None, greedy, target)
        schedule = check_schedule(self.name, tree, self.k, self.k_schedule, self.k_start, None)
        return Bound(NGramSpec(k=_chain(tree, self.k), tree=tree, candidates=candidates,
                               max_ngram=self.max_ngram, min_ngram=self.min_ngram,
                               lookahead=schedule),
                     room=_chain(tree, self.k))


@dataclasses.dataclass(frozen=True)
class Medusa(Method):
    """Medusa heads on the target propose a token tree: the heads' own `tree` unless one is
    given, filled by the `candidates` scheme; the heads run in `drafter_dtype`."""
    heads: Heads
    tree: Any = None
    candidates: str | None = None
    drafter_dtype: str | None = None
    name: ClassVar[str] = "medusa"

    def bind(self, target, greedy, mesh) -> Bound:
        dtype = _dtype(self.name, self.drafter_dtype, target, mesh)
        tree = check_heads(self.heads, self.tree, target)
        tree, candidates = check_tree(self.name, tree, self.candidates, greedy, target)
        check_tree_fits_heads(tree, self.heads)
        return Bound(MedusaSpec(k=_chain(tree, 1), tree=tree, candidates=candidates,
                                heads_config=self.heads.config),
                     weights=runtime_weights(self.heads, target, dtype), room=_chain(tree, 1))


@dataclasses.dataclass(frozen=True)
class Eagle(Method):
    """An EAGLE drafter (EAGLE-1, -2 or -3) drafts on the target's states: its own static
    `tree` unless one is given (its sampled default when a row samples), a chain of k for a
    drafter that ships none, or EAGLE-2's `DynamicTree`; it runs in `drafter_dtype`."""
    drafter: eagle.Drafter
    k: int = DEFAULT_K
    tree: Any = None
    candidates: str | None = None
    drafter_dtype: str | None = None
    name: ClassVar[str] = "eagle"

    def __post_init__(self):
        _check_k(self.k)

    def bind(self, target, greedy, mesh) -> Bound:
        dtype = _dtype(self.name, self.drafter_dtype, target, mesh)
        tree = check_drafter(self.drafter, self.tree, target, self.k, greedy)
        drafter = eagle.with_dtype(eagle.resolve_taps(self.drafter, target.config), dtype)
        tree, candidates = check_tree(self.name, tree, self.candidates, greedy, target)
        if tree.max_width > drafter.config.subset_size:
            raise GenerationError(f"the tree has {tree.max_width} children at a node, more "
                                  f"than the {drafter.config.subset_size} tokens "
                                  f"{drafter.name} can propose")
        return Bound(EagleSpec(k=_chain(tree, self.k), tree=tree, candidates=candidates,
                               drafter_config=drafter.config),
                     weights=eagle.runtime_weights(drafter, target), room=_chain(tree, self.k))


@dataclasses.dataclass(frozen=True)
class DFlash(Method):
    """A DFlash block drafter drafts a whole block in one call; a step verifies the first k of
    its drafts (default: all, block_size - 1) as a chain, each position's argmax ("top", the
    default when every row is greedy) or a draw from its own distribution ("iid", the default
    when a row samples); it runs in `drafter_dtype`."""
    drafter: BlockDrafter
    k: int | None = None
    candidates: str | None = None
    drafter_dtype: str | None = None
    name: ClassVar[str] = "dflash"

    def __post_init__(self):
        if not isinstance(self.drafter, BlockDrafter):
            raise GenerationError(f"drafter must be a DFlash drafter from specjax.load for "
                                  f"method 'dflash', got {type(self.drafter).__name__}")
        if self.k is not None:
            _check_k(self.k)

    def bind(self, target, greedy, mesh) -> Bound:
        dtype = _dtype(self.name, self.drafter_dtype, target, mesh)
        drafter = self.drafter
        check_block_drafter(drafter, target)
        k = drafter.config.drafts if self.k is None else self.k
        if k > drafter.config.drafts:
            raise GenerationError(f"k={k} is more than the {drafter.config.drafts} tokens a "
                                  f"block of {drafter.name} drafts (block_size "
                                  f"{drafter.config.block_size})")
        if mesh is not None:
            raise GenerationError("method 'dflash' does not run on a device mesh yet")
        candidates = self.candidates
        if candidates is None:
            candidates = "top" if greedy else "iid"
        if candidates not in ("top", "iid"):
            raise GenerationError(f"candidates for method 'dflash' must be 'top' or 'iid' (one "
                                  f"draft per position), got {candidates!r}")
        if greedy and candidates != "top":
            raise GenerationError("every row is greedy (temperature 0): each position's "
                                  "distribution is its argmax; use candidates='top'")
        drafter = dflash.with_dtype(drafter, dtype)
        # A block is written to the drafter's cache whole, past the k drafts verified.
        return Bound(DFlashSpec(k=k, tree=Tree.chain(k), candidates=candidates,
                                dflash_config=drafter.config),
                     weights=dflash.runtime_weights(drafter),
                     room=max(k, drafter.config.drafts))


TYPES = {cls.name: cls for cls in Method.__subclasses__()}
assert set(TYPES) == set(REGISTRY), "every method in the registry has its object, and only they"


def build(name: str, *, others: str = "refuse", **options) -> Method:
    """The object of method `name` from options given by name (the command line's and the
    bench's way in): those left at None take the object's own defaults; one the method does not
    take is a `GenerationError` naming it, or with others="ignore" left out (a bench setting
    shared by methods)."""
    if name not in TYPES:
        method_of(name)                 # the error that lists the methods
    cls = TYPES[name]
    fields = _fields(cls)
    for option, value in options.items():
        if option not in fields and value is not None and others == "refuse":
            owners = [n for n, c in TYPES.items() if option in _fields(c)]
            where = (f"; it is an option of {listing(owners)}" if owners else
                     f"; its options are {', '.join(sorted(fields)) or 'none'}")
            raise GenerationError(f"{option} does not apply to method {name!r}{where}")
    return cls(**{k: v for k, v in options.items() if v is not None and k in fields})


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def method_of(method) -> Method:
    """A method object, or a method's name for its defaults (a method that needs weights
    cannot be named alone: it says which object to make)."""
    if isinstance(method, Method):
        return method
    if isinstance(method, str) and method in TYPES:
        record = REGISTRY[method]
        if record.loads:
            raise GenerationError(f"method {method!r} needs {record.what}: pass "
                                  f"specjax.{TYPES[method].__name__}({record.loads}=...)")
        return TYPES[method]()
    names = ", ".join(TYPES)
    raise GenerationError(f"method must be one of {names} (a name or its object, such as "
                          f"specjax.Speculative(draft)); got {method!r}")
