"""The decoding methods: one record each (`Record`), the only list of them (`REGISTRY`).

Every module of a method has the same three functions:

  init(spec, weights, prompts, prompt_length) -> (target cache, carry)
      the prefill, and the method's own state (`DecodeState.carry`; None if it has none);
  step(spec, weights, state) -> state
      one step for every row, over a chain or a token tree (`spec.method.tree`);
  layout(spec, rows, cache) -> carry of shardings
      where the carry lives on a device mesh (`decoding.sharding`).

The API, the command line, the bench and `specjax.explain` read what else they need of a method
from its record: what it loads beside the target and under which keyword and flag, whether it
drafts, which of the shared options apply to it. Adding a method is one module here and one
record below (and its heads/io files when it brings a new weights layout): docs/layout.md walks
through it.

Chains and trees are two steps of one module where a method has both (speculative, n-gram):
docs/layout.md says why they stay apart.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType

from specjax.decoding import autoregressive, dflash, eagle, medusa, ngram, speculative
from specjax.heads.dflash import BlockDrafter
from specjax.heads.eagle import Drafter
from specjax.heads.medusa import Heads
from specjax.model.transformer import Model


@dataclasses.dataclass(frozen=True)
class Record:
    """What the house knows of one decoding method: its record in the registry."""
    name: str
    module: ModuleType             # init, step and layout (module docstring)
    summary: str                   # one line, for help texts and listings
    # The weights it runs beside the target: the keyword of `generate` that takes them, the
    # command-line flag that names their directory, their type (what `specjax.load` gives) and
    # what they are, for messages. None for a method that needs none.
    loads: str | None = None
    flag: str | None = None
    kind: type | None = None
    what: str | None = None
    # The options shared between methods that apply to it (`generate`'s keywords).
    options: tuple[str, ...] = ()
    # The lookahead schedules it takes (`decoding.lookahead`).
    schedules: tuple[str, ...] = ("constant",)
    # Of its options, those it shares with the other methods when the command line runs them
    # all (--method all); None: every one. DFlash's k counts its own block's drafts.
    shared: tuple[str, ...] | None = None
    # How it drafts by default: a chain of k (the bench sweeps k), or the tree its weights ship.
    chain: bool = False
    own_tree: bool = False
    # The other engines that run the same method, which the bench times beside it.
    peers: tuple[str, ...] = ()
    # What the command line runs when none of k, the schedule and the tree is given: the
    # measured best on SmolLM2 over the bench's quick prompts (docs/benchmarks.md, "Defaults"),
    # as (option, value) pairs; () leaves the method object's own defaults.
    measured_default: tuple[tuple[str, object], ...] = ()

    @property
    def under_all(self) -> tuple[str, ...]:
        """The options --method all passes it (`shared`)."""
        return self.options if self.shared is None else self.shared

    @property
    def drafts(self) -> bool:
        """Whether a step verifies drafted tokens (every method but plain decoding)."""
        return self.module is not autoregressive

    @property
    def explains(self) -> bool:
        """Whether `specjax.explain` shows its steps: every method that verifies drafts."""
        return self.drafts


_TREE = ("k", "tree", "candidates")
REGISTRY = {m.name: m for m in (
    Record("autoregressive", autoregressive, "one target call per token: the baseline",
           peers=("transformers", "llama.cpp")),
    Record("speculative", speculative, "a small draft model proposes, the target verifies",
           loads="draft", flag="draft", kind=Model, what="a draft model",
           options=(*_TREE, "drafter_dtype", "shard_draft"),
           schedules=("constant", "heuristic", "confidence"), chain=True,
           peers=("transformers",),
           measured_default=(("k_schedule", "confidence"),)),
    Record("ngram", ngram, "drafts copied from the prompt and the output (prompt lookup)",
           options=("k", "tree", "max_ngram", "min_ngram"), schedules=("constant", "heuristic"),
           chain=True, peers=("transformers", "llama.cpp"), measured_default=(("k", 2),)),
    Record("medusa", medusa, "extra heads on the target propose a token tree",
           loads="heads", flag="heads", kind=Heads, what="Medusa heads",
           options=("tree", "candidates", "drafter_dtype"), own_tree=True),
    Record("eagle", eagle, "a one-layer drafter on the target's states (EAGLE-1/2/3)",
           loads="drafter", flag="drafter", kind=Drafter, what="an EAGLE drafter",
           options=(*_TREE, "drafter_dtype"), own_tree=True),
    Record("dflash", dflash, "a block drafter proposes a whole block in one call (DFlash)",
           loads="drafter", flag="drafter", kind=BlockDrafter,
           what="a DFlash drafter",
           options=("k", "candidates", "drafter_dtype"), shared=("drafter_dtype",)),
)}
METHODS = tuple(REGISTRY)
MODULES = {name: method.module for name, method in REGISTRY.items()}


def methods_where(test) -> tuple[str, ...]:
    """The names of the methods whose record passes `test`, in the registry's order."""
    return tuple(name for name, m in REGISTRY.items() if test(m))


def methods_taking(option: str) -> tuple[str, ...]:
    """The methods that take `option` (one of `Record.options`)."""
    return tuple(name for name, m in REGISTRY.items() if option in m.options)


def listing(names=METHODS) -> str:
    """The methods, as a sentence lists them: 'a', 'b' and 'c'."""
    quoted = [repr(n) for n in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]
