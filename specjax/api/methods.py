"""The decoding methods as objects that carry their own options and weights.

    specjax.generate(target, prompts, specjax.Speculative(draft, k=4))
    specjax.generate(target, prompts, specjax.Eagle(drafter, tree=specjax.DynamicTree(4, 4, 8)))
    specjax.generate(target, prompts, "ngram")          # a name: the method with its defaults

A method is a class here (`Method`; the listed ones in `CLASSES`) beside the decoding module
that declares its static spec (docs/layout.md, "One declaration per method"); `generate` takes
any `Method` object. Each checks its own values when it is made (a `GenerationError` naming the field: its weights'
kind, k, its tree and candidate scheme, its schedule, its dtype), and `bind` checks only what
needs the target and the request (its weights' fit, its tree against the context window and
the vocabulary, its candidate scheme against the temperatures, the mesh) and returns what the
decoding loop needs of it (`Bound`).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, ClassVar

from specjax.api.checks import (candidates_for, check_compatible, check_dtype, check_proposes,
                                check_schedule, check_taps, check_trained_on,
                                check_tree_fits, check_tree_width, drafter_dtype,
                                lookahead, tree_of)
from specjax.decoding.autoregressive import AutoregressiveSpec
from specjax.decoding.config import Drafting, MethodSpec
from specjax.decoding.dflash import DFlashSpec
from specjax.decoding.eagle import EagleSpec
from specjax.decoding.medusa import MedusaSpec
from specjax.decoding.ngram import NGramSpec
from specjax.decoding.speculative import SpeculativeSpec
from specjax.heads import dflash, eagle
from specjax.heads.dflash import BlockDrafter
from specjax.heads.medusa import Heads, runtime_weights
from specjax.io.dflash import check_target as check_block_drafter
from specjax.model.transformer import Model, in_dtype
from specjax.sampling.params import GenerationError, check_int
from specjax.sampling.tree import DynamicTree, Tree

# The drafts a step verifies when k is not given (a DFlash drafter's block sets its own).
DEFAULT_K = 4

# EAGLE's tree when neither a tree nor k is given, by the target's dtype, where it was measured
# to beat the drafter's own: in the dtypes whose one-token step is fast, a verify call on the
# drafter's 8-node tree costs more than its extra tokens win, and a chain of 2 pays
# (docs/benchmarks.md, "Defaults by dtype"). The other dtypes run the drafter's own tree. The
# method holds it, so `Eagle(drafter)` and `generate --method eagle` run the same.
EAGLE_TREES = {"bfloat16": Tree.chain(2), "int8": Tree.chain(2), "q8_0": Tree.chain(2)}


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
    """What every method object shares. A subclass is a frozen dataclass whose fields are the
    method's options (each checked in `__post_init__`), that declares the static spec its
    `bind` makes (`spec`: the spec's `name` is the method's, its `module` decodes it) and what
    it runs beside the target (`loads`: the field that holds it, whose type is what
    `specjax.load` gives; `what`: a phrase for messages; None for a method that needs none)."""
    spec: ClassVar[type[MethodSpec]]
    loads: ClassVar[str | None] = None
    what: ClassVar[str | None] = None
    # The lookahead schedules its k_schedule takes (`decoding.lookahead`).
    schedules: ClassVar[tuple[str, ...]] = ("constant",)
    # How it drafts by default: a chain of k (what a sweep of k varies), or the tree its weights
    # ship (neither: one block's drafts, or nothing).
    chain: ClassVar[bool] = False
    own_tree: ClassVar[bool] = False
    name: ClassVar[str]            # its spec's name
    drafts: ClassVar[bool]         # whether a step verifies drafts (its spec is a `Drafting`)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.name, cls.drafts = cls.spec.name, issubclass(cls.spec, Drafting)

    @classmethod
    def options(cls) -> tuple[str, ...]:
        """Its options: its fields but the one that holds its weights."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.name != cls.loads)

    @classmethod
    def kind(cls) -> type | None:
        """The type of what it loads (its `loads` field's), None if it loads nothing."""
        return typing.get_type_hints(cls)[cls.loads] if cls.loads else None

    def bind(self, target: Model, greedy: bool, mesh) -> Bound:
        raise NotImplementedError

    def _check_loads(self) -> None:
        """What it runs beside the target (a draft model, heads, a drafter) is there and of
        its kind."""
        value = getattr(self, self.loads)
        if value is None:
            raise GenerationError(f"method {self.name!r} needs {self.what} "
                                  f"({self.loads}=specjax.load(DIR))")
        if not isinstance(value, self.kind()):
            raise GenerationError(f"{self.loads} must be {self.what} from specjax.load, got "
                                  f"{type(value).__name__}")

    def _set(self, **values) -> None:
        """Stores a value in the form it was checked in (a tree's paths as a `Tree`)."""
        for name, value in values.items():
            object.__setattr__(self, name, value)


def _chain(tree, k: int) -> int:
    """How many slots a step of a chain of k, or of a tree, writes."""
    if isinstance(tree, DynamicTree):   # the drafter reads its frontiers past the tree's end
        return max(tree.size, (tree.depth - 1) * tree.top_k)
    return tree.size if tree is not None else k


def _first(*trees):
    """The first tree given (not None)."""
    return next(tree for tree in trees if tree is not None)


def _scheme(tree, target: Model, greedy: bool, candidates) -> str:
    """The tree (if any) checked against the target, and the candidate scheme that fills it: a
    chain's and a dynamic tree's are "top", a static tree's the one given or its default."""
    if tree is None:
        return "top"
    check_tree_fits(tree, target)
    if isinstance(tree, DynamicTree):
        return "top"
    check_tree_width(tree, target)
    return candidates_for(candidates, greedy, "distinct")


@dataclasses.dataclass(frozen=True)
class Autoregressive(Method):
    """One target call per token: the baseline every other method is exact against."""
    spec: ClassVar = AutoregressiveSpec

    def bind(self, target, greedy, mesh) -> Bound:
        return Bound(AutoregressiveSpec())


@dataclasses.dataclass(frozen=True)
class Speculative(Method):
    """A draft model proposes, the target verifies (Chen et al. 2023): k drafts a step as a
    chain, or a token `tree` filled by the `candidates` scheme ("top", "distinct", "iid"; the
    default "top" at temperature 0, "distinct" otherwise); `k_schedule` "heuristic" or
    "confidence" draws fewer when drafts are rejected (`decoding.lookahead`). The draft runs in
    `drafter_dtype` (default: the target's) and, on a mesh, replicated unless `shard_draft`."""
    spec: ClassVar = SpeculativeSpec
    loads: ClassVar = "draft"
    what: ClassVar = "a draft model"
    schedules: ClassVar = ("constant", "heuristic", "confidence")
    chain: ClassVar = True

    draft: Model
    k: int = DEFAULT_K
    tree: Any = None
    candidates: str | None = None
    k_schedule: str = "constant"
    k_start: int | None = None
    confidence_threshold: float | None = None
    drafter_dtype: str | None = None
    shard_draft: bool = False

    def __post_init__(self):
        self._check_loads()
        check_int("k", self.k, 1)
        self._set(tree=tree_of(self.name, self.tree, self.candidates))
        check_schedule(self.name, self.tree, self.k, self.k_schedule, self.k_start,
                       self.confidence_threshold)
        check_dtype(self.drafter_dtype)
        if not isinstance(self.shard_draft, bool):
            raise GenerationError(f"shard_draft must be True or False, got {self.shard_draft!r}")

    def bind(self, target, greedy, mesh) -> Bound:
        if self.shard_draft and mesh is None:
            raise GenerationError("shard_draft applies to method 'speculative' on a mesh "
                                  "(mesh=...)")
        check_compatible(target, self.draft)
        draft = in_dtype(self.draft, drafter_dtype(self.drafter_dtype, target, mesh))
        candidates = _scheme(self.tree, target, greedy, self.candidates)
        schedule = lookahead(self.k_schedule, self.k, self.k_start, self.confidence_threshold)
        return Bound(SpeculativeSpec(k=_chain(self.tree, self.k), tree=self.tree,
                                     candidates=candidates, draft_config=draft.config,
                                     lookahead=schedule, shard_draft=self.shard_draft),
                     draft=draft, room=_chain(self.tree, self.k))


@dataclasses.dataclass(frozen=True)
class NGram(Method):
    """Drafts looked up in the prompt and the output so far (prompt lookup): the longest match
    of `max_ngram` down to `min_ngram` tokens proposes the k tokens that followed it, as a
    chain, or a `tree` of its candidates; `k_schedule` "heuristic" adapts k per row."""
    spec: ClassVar = NGramSpec
    schedules: ClassVar = ("constant", "heuristic")
    chain: ClassVar = True

    k: int = DEFAULT_K
    max_ngram: int = 3
    min_ngram: int = 1
    tree: Any = None
    k_schedule: str = "constant"
    k_start: int | None = None

    def __post_init__(self):
        check_int("k", self.k, 1)
        check_int("min_ngram", self.min_ngram, 1)
        check_int("max_ngram", self.max_ngram, self.min_ngram)
        self._set(tree=tree_of(self.name, self.tree, None))
        check_schedule(self.name, self.tree, self.k, self.k_schedule, self.k_start, None)

    def bind(self, target, greedy, mesh) -> Bound:
        if self.tree is not None:
            check_tree_fits(self.tree, target)
        # Lookup's candidates are deterministic: "top" at every temperature.
        return Bound(NGramSpec(k=_chain(self.tree, self.k), tree=self.tree, candidates="top",
                               max_ngram=self.max_ngram, min_ngram=self.min_ngram,
                               lookahead=lookahead(self.k_schedule, self.k, self.k_start, None)),
                     room=_chain(self.tree, self.k))


@dataclasses.dataclass(frozen=True)
class Medusa(Method):
    """Medusa heads on the target propose a token tree: the heads' own `tree` unless one is
    given (a chain of one candidate per head, as vLLM runs them, for heads that ship none),
    filled by the `candidates` scheme; the heads run in `drafter_dtype`."""
    spec: ClassVar = MedusaSpec
    loads: ClassVar = "heads"
    what: ClassVar = "Medusa heads"
    own_tree: ClassVar = True

    heads: Heads
    tree: Any = None
    candidates: str | None = None
    drafter_dtype: str | None = None

    def __post_init__(self):
        self._check_loads()
        tree = tree_of(self.name, self.tree, self.candidates, tree_needed=False)
        self._set(tree=_first(tree, self.heads.tree, Tree.chain(self.heads.config.num_heads)))
        check_proposes(self.tree, self.heads.name, self.heads.config.subset_size,
                       self.heads.config.num_heads)
        check_dtype(self.drafter_dtype)

    def bind(self, target, greedy, mesh) -> Bound:
        check_trained_on(self.heads, target)
        candidates = _scheme(self.tree, target, greedy, self.candidates)
        weights = runtime_weights(self.heads, target,
                                  drafter_dtype(self.drafter_dtype, target, mesh))
        return Bound(MedusaSpec(k=_chain(self.tree, 1), tree=self.tree, candidates=candidates,
                                heads_config=self.heads.config),
                     weights=weights, room=_chain(self.tree, 1))


@dataclasses.dataclass(frozen=True)
class Eagle(Method):
    """An EAGLE drafter (EAGLE-1, -2 or -3) drafts on the target's states: the `tree` given, or
    a chain of the `k` given; else its sampled default when a row samples, the target dtype's
    measured tree (`EAGLE_TREES`), its own static tree, or a chain of `DEFAULT_K` for a drafter
    that ships none. EAGLE-2's `DynamicTree` is a tree too. It runs in `drafter_dtype`."""
    spec: ClassVar = EagleSpec
    loads: ClassVar = "drafter"
    what: ClassVar = "an EAGLE drafter"
    own_tree: ClassVar = True

    drafter: eagle.Drafter
    k: int | None = None
    tree: Any = None
    candidates: str | None = None
    drafter_dtype: str | None = None

    def __post_init__(self):
        self._check_loads()
        if self.k is not None:
            check_int("k", self.k, 1)
        self._set(tree=tree_of(self.name, self.tree, self.candidates, tree_needed=False))
        if self.tree is not None:
            check_proposes(self.tree, self.drafter.name, self.drafter.config.subset_size)
        check_dtype(self.drafter_dtype)

    def bind(self, target, greedy, mesh) -> Bound:
        check_trained_on(self.drafter, target)
        check_taps(self.drafter, target)
        # The given tree, else the drafter's own (its sampled one when a row samples), which its
        # file brought: checked here, after what the target allows.
        k = DEFAULT_K if self.k is None else self.k
        if self.k is not None:
            tree = _first(self.tree, Tree.chain(k))
        else:
            tree = _first(self.tree, None if greedy else self.drafter.sampled_tree,
                          EAGLE_TREES.get(target.config.dtype), self.drafter.tree,
                          Tree.chain(k))
        candidates = _scheme(tree, target, greedy, self.candidates)
        if self.tree is None:
            check_proposes(tree, self.drafter.name, self.drafter.config.subset_size)
        drafter = eagle.with_dtype(eagle.resolve_taps(self.drafter, target.config),
                                   drafter_dtype(self.drafter_dtype, target, mesh))
        return Bound(EagleSpec(k=_chain(tree, k), tree=tree, candidates=candidates,
                               drafter_config=drafter.config),
                     weights=eagle.runtime_weights(drafter, target), room=_chain(tree, k))


@dataclasses.dataclass(frozen=True)
class DFlash(Method):
    """A DFlash block drafter drafts a whole block in one call; a step verifies the first k of
    its drafts (default: all, block_size - 1) as a chain, each position's argmax ("top", the
    default when every row is greedy) or a draw from its own distribution ("iid", the default
    when a row samples); it runs in `drafter_dtype`."""
    spec: ClassVar = DFlashSpec
    loads: ClassVar = "drafter"
    what: ClassVar = "a DFlash drafter"

    drafter: BlockDrafter
    k: int | None = None
    candidates: str | None = None
    drafter_dtype: str | None = None

    def __post_init__(self):
        self._check_loads()
        drafts = self.drafter.config.drafts
        if self.k is not None:
            check_int("k", self.k, 1)
            if self.k > drafts:
                raise GenerationError(f"k={self.k} is more than the {drafts} tokens a block of "
                                      f"{self.drafter.name} drafts (block_size "
                                      f"{self.drafter.config.block_size})")
        if self.candidates not in (None, "top", "iid"):
            raise GenerationError(f"candidates for method 'dflash' must be 'top' or 'iid' (one "
                                  f"draft per position), got {self.candidates!r}")
        check_dtype(self.drafter_dtype)

    def bind(self, target, greedy, mesh) -> Bound:
        check_block_drafter(self.drafter, target)
        if mesh is not None:
            raise GenerationError("method 'dflash' does not run on a device mesh yet")
        k = self.drafter.config.drafts if self.k is None else self.k
        drafter = dflash.with_dtype(self.drafter, drafter_dtype(self.drafter_dtype, target, mesh))
        # A block is written to the drafter's cache whole, past the k drafts verified.
        return Bound(DFlashSpec(k=k, tree=Tree.chain(k),
                                candidates=candidates_for(self.candidates, greedy, "iid"),
                                dflash_config=drafter.config),
                     weights=dflash.runtime_weights(drafter),
                     room=max(k, drafter.config.drafts))


# The methods: the one list of them, which the command line, the bench, `explain` and the kits
# read (`generate` takes any `Method` object).
CLASSES = (Autoregressive, Speculative, NGram, Medusa, Eagle, DFlash)
TYPES = {cls.name: cls for cls in CLASSES}


def listing(names=tuple(TYPES)) -> str:
    """The methods, as a sentence lists them: 'a', 'b' and 'c'."""
    quoted = [repr(n) for n in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


def build(name: str, **options) -> Method:
    """The object of method `name` from options given by name (the command line's and the
    bench's way in): those left at None take the object's own defaults; one the method does not
    take is a `GenerationError` naming it and the methods that take it."""
    cls = _class(name)
    fields = _fields(cls)
    for option, value in options.items():
        if option not in fields and value is not None:
            owners = [n for n, c in TYPES.items() if option in _fields(c)]
            where = (f"; it is an option of {listing(owners)}" if owners else
                     f"; its options are {', '.join(sorted(fields)) or 'none'}")
            raise GenerationError(f"{option} does not apply to method {name!r}{where}")
    return cls(**{k: v for k, v in options.items() if v is not None})


def build_shared(name: str, **settings) -> Method:
    """The object of method `name` from settings shared by several methods (a bench sweep,
    the command line's --method all, a test over every method): the method takes those that
    are its options (`build`) and leaves the others out."""
    fields = _fields(_class(name))
    return build(name, **{k: v for k, v in settings.items() if k in fields})


def _class(name: str) -> type[Method]:
    if name not in TYPES:
        method_of(name)                 # the error that lists the methods
    return TYPES[name]


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def method_of(method) -> Method:
    """A method object, or a method's name for its defaults (a method that needs weights
    cannot be named alone: it says which object to make)."""
    if isinstance(method, Method):
        return method
    if isinstance(method, str) and method in TYPES:
        cls = TYPES[method]
        if cls.loads:
            raise GenerationError(f"method {method!r} needs {cls.what}: pass "
                                  f"specjax.{cls.__name__}({cls.loads}=...)")
        return cls()
    names = ", ".join(TYPES)
    raise GenerationError(f"method must be one of {names} (a name or its object, such as "
                          f"specjax.Speculative(draft)); got {method!r}")
