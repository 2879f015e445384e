"""The checks of `specjax.generate`'s arguments, on the host, each once, with errors that name
the offending value (`GenerationError`): what a method object checks of its own options when it
is made (`api.methods`), what binding it checks against the target and the request, and the
prompts. The compiled loop itself (`decoding.loop`) assumes valid input."""

from __future__ import annotations

import numbers
import os
from typing import Sequence

import numpy as np

from specjax.decoding.config import Lookahead
from specjax.decoding.methods import REGISTRY
from specjax.decoding.lookahead import DEFAULT_CONFIDENCE_THRESHOLD, DEFAULT_K_START, SCHEDULES
from specjax.decoding.trees import SCHEMES
from specjax.heads.eagle import Drafter
from specjax.io.sidecar import check_target
from specjax.model.config import DTYPES, EIGHT_BIT
from specjax.model.transformer import Model
from specjax.sampling.params import GenerationError, check_int
from specjax.sampling.tree import DynamicTree, Tree, TreeError

KERNELS_ENV = "SPECJAX_KERNELS"
_ENV_VALUES = {"on": True, "1": True, "true": True, "off": False, "0": False, "false": False}


def kernels_switch(kernels) -> bool:
    """The run option `kernels`: its value when given, else $SPECJAX_KERNELS (on by default;
    the one place the variable is read). Where it is on, the programs' configs name the
    kernels (`api.forward.kernels_of`); without a compiler, or on a GPU, they name none and
    XLA's formulation runs."""
    if kernels is not None:
        if not isinstance(kernels, bool):
            raise GenerationError(f"kernels must be True, False or None, got {kernels!r}")
        return kernels
    value = os.environ.get(KERNELS_ENV, "on").strip().lower() or "on"
    if value not in _ENV_VALUES:
        raise GenerationError(f"{KERNELS_ENV} must be on or off, got {os.environ[KERNELS_ENV]!r}")
    return _ENV_VALUES[value]


# -- Validation and inputs ----------------------------------------------------------------------

def check_compatible(target: Model, draft: Model) -> None:
    """A draft must share the target's token ids: same tokenizer, vocab sizes equal or differing
    only by padding rows beyond the tokenizer."""
    tt, dt = target.tokenizer, draft.tokenizer
    tv, dv = target.config.vocab_size, draft.config.vocab_size
    if tt is not None and dt is not None:
        if tt.get_vocab(with_added_tokens=True) != dt.get_vocab(with_added_tokens=True):
            raise GenerationError(f"draft {draft.name} and target {target.name} have different "
                                  "tokenizers; speculative sampling needs the same token ids")
        return  # the same tokenizer fits in both vocabularies (checked by load): padding only
    if tv != dv:
        raise GenerationError(f"draft vocab_size {dv} != target vocab_size {tv} ({draft.name} vs "
                              f"{target.name})")


def prompt_matrix(model: Model, prompts) -> tuple[np.ndarray, np.ndarray]:
    """The prompts right-padded with zeros to their bucketed length (`_bucket`), [B, P] int64,
    and each row's length [B]. A 2-D integer array is taken as it is (every row full length:
    the fast way in for 10^5 equal rows); anything else goes through `encode_prompts`."""
    if (isinstance(prompts, np.ndarray) and prompts.ndim == 2 and prompts.dtype.kind in "iu"
            and prompts.size):
        rows, lengths = prompts, np.full(len(prompts), prompts.shape[1], np.int32)
    else:
        rows = encode_prompts(model, prompts)
        lengths = np.array([len(r) for r in rows], np.int32)
    matrix = np.zeros((len(rows), bucket(int(lengths.max()))), np.int64)
    if isinstance(rows, np.ndarray):
        matrix[:, :rows.shape[1]] = rows
    else:
        for i, row in enumerate(rows):
            matrix[i, :len(row)] = row
    return matrix, lengths


def encode_prompts(model: Model, prompts) -> list[list[int]]:
    if isinstance(prompts, np.ndarray):
        prompts = list(prompts)
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
        raise GenerationError("prompts must be a non-empty list of texts or of token-id lists")
    rows = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            if model.tokenizer is None:
                raise GenerationError(f"{model.name} has no tokenizer.json; pass token ids")
            row = model.tokenizer.encode(prompt).ids
        else:
            try:
                array = np.asarray(prompt)
            except ValueError:         # ragged nesting
                array = np.asarray(prompt, dtype=object)
            if array.size and array.dtype.kind not in "iub":
                big = [t for t in array.reshape(-1) if isinstance(t, numbers.Integral)]
                if array.dtype == object and len(big) == array.size:   # beyond int64
                    raise GenerationError(f"prompt {i} has token id {max(big, key=abs)} outside "
                                          f"the vocabulary [0, {model.config.vocab_size})")
                raise GenerationError(f"prompt {i} must hold integer token ids")
            row = array.reshape(-1).tolist()
        if not row:
            raise GenerationError(f"prompt {i} is empty")
        rows.append(row)
    return rows


# -- What a method object checks when it is made ------------------------------------------------

def check_loads(method: str, value) -> None:
    """What a method runs beside the target (its record's `loads`: a draft model, Medusa heads,
    a drafter) is there and of its kind."""
    record = REGISTRY[method]
    if value is None:
        raise GenerationError(f"method {method!r} needs {record.what} "
                              f"({record.loads}=specjax.load(DIR))")
    if not isinstance(value, record.kind):
        raise GenerationError(f"{record.loads} must be {record.what} from specjax.load, got "
                              f"{type(value).__name__}")


def check_dtype(dtype) -> None:
    """A drafter's dtype: None (the target's) or one of the dtypes weights load in."""
    if dtype is not None and (not isinstance(dtype, str) or dtype not in DTYPES):
        raise GenerationError(f"drafter_dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")


def tree_of(method: str, tree, candidates, tree_needed: bool = True):
    """The `tree` a method object was given, as a `Tree` (from paths), a `DynamicTree` (EAGLE's
    only) or None, with its `candidates` scheme checked: one of `SCHEMES`, "top" for a dynamic
    tree, and given with a tree where the method's default is a chain (`tree_needed`)."""
    if candidates is not None and candidates not in SCHEMES:
        raise GenerationError(f"candidates must be one of {', '.join(SCHEMES)}; "
                              f"got {candidates!r}")
    if tree is None:
        if candidates is not None and tree_needed:
            raise GenerationError("candidates applies to token trees; pass tree=... too")
        return None
    if isinstance(tree, DynamicTree):
        if method != "eagle":
            raise GenerationError(f"a dynamic tree is EAGLE-2's: it needs method 'eagle', not "
                                  f"{method!r}")
        if candidates not in (None, "top"):
            raise GenerationError(f"a dynamic tree's candidates are the drafter's top tokens; "
                                  f"candidates={candidates!r} does not apply")
        return tree
    if isinstance(tree, Tree):
        return tree
    try:
        return Tree.from_paths(tree)
    except TreeError as e:
        raise GenerationError(str(e)) from None


def check_proposes(tree, name: str, width: int, depth: int | None = None) -> None:
    """A tree fits heads or a drafter (`name`) that propose `width` tokens a node, one level
    per head (`depth` heads) where they are heads."""
    if depth is not None and tree.max_depth > depth:
        raise GenerationError(f"the tree is {tree.max_depth} deep but {name} has {depth} heads "
                              "(one per depth)")
    if tree.max_width > width:
        raise GenerationError(f"the tree has {tree.max_width} children at a node, more than the "
                              f"{width} tokens {name} can propose")


def check_schedule(method: str, tree, k: int, k_schedule, k_start, threshold) -> None:
    """The lookahead schedule (`decoding.lookahead`) of a chain of k and its settings."""
    if k_schedule not in SCHEDULES:
        raise GenerationError(f"k_schedule must be one of {', '.join(SCHEDULES)}; "
                              f"got {k_schedule!r}")
    if k_schedule == "confidence" and method == "ngram":
        raise GenerationError("k_schedule='confidence' needs a draft model's probabilities "
                              "(method 'speculative'); n-gram lookup has none")
    if k_schedule != "constant" and tree is not None:
        raise GenerationError(f"k_schedule={k_schedule!r} drafts a chain; a token tree's "
                              "shape is fixed (use k_schedule='constant')")
    if k_start is not None and k_schedule != "heuristic":
        raise GenerationError("k_start applies to k_schedule='heuristic'")
    if threshold is not None and k_schedule != "confidence":
        raise GenerationError("confidence_threshold applies to k_schedule='confidence'")
    if k_start is not None:
        check_int("k_start", k_start, 1)
        if k_start > k:
            raise GenerationError(f"k_start={k_start} is more than k={k}, the most a step drafts "
                                  "under the heuristic schedule")
    if threshold is not None and (isinstance(threshold, bool)
                                  or not isinstance(threshold, numbers.Real)
                                  or not 0.0 <= threshold <= 1.0):
        raise GenerationError(f"confidence_threshold must be a number in [0, 1], "
                              f"got {threshold!r}")


def lookahead(k_schedule: str, k: int, k_start, threshold) -> Lookahead:
    """The static spec of a checked schedule (`check_schedule`), its defaults filled in."""
    if k_schedule == "heuristic":
        return Lookahead(k_schedule, start=min(DEFAULT_K_START, k) if k_start is None else k_start)
    if k_schedule == "confidence":
        return Lookahead(k_schedule, threshold=float(DEFAULT_CONFIDENCE_THRESHOLD
                                                     if threshold is None else threshold))
    return Lookahead(k_schedule)


# -- What binding a method to the target and the request checks ---------------------------------

def drafter_dtype(dtype, target: Model, mesh) -> str:
    """The dtype a method's drafter runs in (`check_dtype`'s), else the target's."""
    if dtype is None:
        return target.config.dtype
    if dtype in EIGHT_BIT and mesh is not None:
        raise GenerationError(f"drafter_dtype {dtype!r} does not run on a device mesh (8-bit "
                              "matrices have no sharding table): use float32 or bfloat16")
    return dtype


def check_trained_on(value, target: Model) -> None:
    """Medusa heads or an EAGLE drafter were trained on this target (`io.sidecar.check_target`)."""
    try:
        check_target(value, target)
    except ValueError as e:
        raise GenerationError(str(e)) from None


def check_taps(drafter: Drafter, target: Model) -> None:
    """An EAGLE-3 drafter reads states of layers the target has."""
    taps = drafter.config.taps
    if taps and max(taps) >= target.config.n_layers:
        raise GenerationError(f"{drafter.name} reads the states after {list(taps)} layers, but "
                              f"{target.name} has {target.config.n_layers}")


def check_tree_fits(tree, target: Model) -> None:
    """A tree's target call, and a dynamic tree's frontiers, fit the context window."""
    window = target.config.max_positions
    if tree.size >= window:
        raise GenerationError(f"the tree has {tree.size} nodes; a target call on it needs more "
                              f"than the context window of {target.name} ({window})")
    if isinstance(tree, DynamicTree):
        reach = (tree.depth - 1) * tree.top_k       # the drafter's frontiers, past the tree
        if reach >= window:
            raise GenerationError(f"a dynamic tree of depth {tree.depth} and top_k {tree.top_k} "
                                  f"drafts {reach} frontier slots, more than the context "
                                  f"window of {target.name} ({window})")


def check_tree_width(tree, target: Model) -> None:
    """A drafter's candidates at a node are distinct tokens: no more than the vocabulary."""
    if tree.max_width > target.config.vocab_size:
        raise GenerationError(f"the tree has {tree.max_width} children at a node, more than the "
                              f"vocabulary ({target.config.vocab_size})")


def candidates_for(candidates, greedy: bool, sampled: str) -> str:
    """The candidate scheme a request runs: the one given, else "top" when every row is greedy
    and `sampled` (the method's default) otherwise."""
    if candidates is None:
        return "top" if greedy else sampled
    if greedy and candidates != "top":
        # Sampled from a one-hot p, every candidate would be the draft's argmax.
        raise GenerationError(f"at temperature 0 the draft's distribution is one-hot, so "
                              f"candidates={candidates!r} would draw its argmax only; use "
                              "candidates='top'")
    return candidates


def bucket(n: int) -> int:
    """Rounds lengths up so that new prompt lengths rarely recompile: powers of two up to 256,
    then four sizes per octave (320, 384, 448, 512, 640, ...), so that a buffer is at most
    1.25x what the request needs."""
    if n <= 256:
        return max(8, 1 << (n - 1).bit_length())
    step = 1 << (n.bit_length() - 3)
    return -(-n // step) * step
