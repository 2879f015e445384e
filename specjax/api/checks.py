"""The checks of `specjax.generate`'s arguments, on the host, each once, with errors that name
the offending value (`GenerationError`): what a method object checks of its own options when it
is made (`api.methods`), what binding it checks against the target and the request, the
prompts, and the request's sampling bound to its rows (the one `SamplingParams`, or one a row,
as the loop's per-row settings: temperature, top-k, top-p, min-p, the controls, the
structured-output constraints, the stop strings and stop ids, log-probabilities). The compiled
loop itself (`decoding.loop`) assumes valid input."""

from __future__ import annotations

import dataclasses
import numbers
import os
from typing import Sequence

import numpy as np

from specjax.decoding.config import Lookahead
from specjax.decoding.lookahead import DEFAULT_CONFIDENCE_THRESHOLD, DEFAULT_K_START, SCHEDULES
from specjax.decoding.state import RowSettings
from specjax.decoding.trees import SCHEMES
from specjax.heads.eagle import Drafter
from specjax.io.sidecar import check_target
from specjax.model.config import DTYPES, EIGHT_BIT
from specjax.model.transformer import Model
from specjax.sampling.constraints import (Automaton, ConstraintError, compile_json_schema,
                                          compile_regex, constraints_of)
from specjax.sampling.controls import Controls
from specjax.sampling.logits import Sampling
from specjax.sampling.params import (MAX_LOGPROBS, GenerationError, SamplingParams, bias_tables,
                                     check_int, distinct, is_sequence, per_row, schema_key,
                                     stop_lists, stops_per_row)
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


# -- What binding the sampling to the rows checks ------------------------------------------------

def one_sampling(sampling) -> SamplingParams:
    """`generate`'s sampling as one `SamplingParams`: the default for None, and a list of one
    per row (each field a single value) as the object whose fields hold one value per row."""
    if sampling is None:
        return SamplingParams()
    if isinstance(sampling, SamplingParams):
        return sampling
    if not (isinstance(sampling, Sequence) and sampling
            and all(isinstance(s, SamplingParams) for s in sampling)):
        raise GenerationError(f"sampling must be a SamplingParams or a list of one per prompt, "
                              f"got {sampling!r}")
    fields = {}
    for field in dataclasses.fields(SamplingParams):
        values = [getattr(s, field.name) for s in sampling]
        if field.name == "logprobs":
            if len(set(values)) > 1:
                raise GenerationError(f"logprobs is one number for the request; the rows ask "
                                      f"for {sorted(set(values))}")
            fields["logprobs"] = values[0]
        elif field.name == "stop":
            fields["stop"] = [list(v) if v is not None else [] for v in values]
        elif field.name in ("regex", "json_schema", "logit_bias"):
            fields[field.name] = values if any(v is not None for v in values) else None
        else:
            fields[field.name] = values
    return SamplingParams(**fields)


def bind_sampling(sampling: SamplingParams, rows: int, vocab: int, max_new: np.ndarray,
                  stop_ids: np.ndarray, target: Model) -> tuple[RowSettings, tuple]:
    """The sampling as each row's settings (`state.RowSettings`) and stop strings, checked
    against the rows, the vocabulary and the target's tokenizer (its values were checked when
    it was made)."""
    law = Sampling(**{name: np.asarray(per_row(name, getattr(sampling, name), rows), dtype)
                      for name, dtype in _LAW.items()})
    controls = check_controls(sampling, rows, vocab, max_new)
    constraint = check_constraints(sampling.regex, sampling.json_schema, rows, target, vocab,
                                   stop_ids)
    settings = RowSettings(law, max_new, stop_ids, controls, constraint)
    return settings, check_stop(sampling.stop, rows, target.tokenizer)


_LAW = {"temperature": np.float32, "top_k": np.int32, "top_p": np.float32, "min_p": np.float32}


def check_controls(sampling: SamplingParams, rows: int, vocab: int,
                   max_new: np.ndarray) -> Controls:
    """Each row's penalties, logit bias and minimum length (`specjax.sampling.controls`): a
    value (a dict for the bias) for every row, or a sequence of one per row, checked against
    the rows, the vocabulary and `max_new_tokens`."""
    repetition, presence, frequency = (
        np.asarray(per_row(name, getattr(sampling, name), rows), np.float32)
        for name in ("repetition_penalty", "presence_penalty", "frequency_penalty"))
    least = np.asarray(per_row("min_tokens", sampling.min_tokens, rows), np.int32)
    if np.any(least > max_new):
        i = int(np.argmax(least > max_new))
        raise GenerationError(f"min_tokens={least[i]} exceeds max_new_tokens={max_new[i]}"
                              + (f" (row {i})" if rows > 1 else ""))
    bias = np.zeros((rows, vocab), np.float32)
    tables = bias_tables(sampling.logit_bias)
    one = len(tables) == 1 and tables[0] is sampling.logit_bias      # for every row
    if not one and len(tables) != rows:
        raise GenerationError(f"logit_bias has {len(tables)} dicts for {rows} prompts")
    for b, table in enumerate(tables * rows if one else tables):
        for token, value in (table or {}).items():
            if token >= vocab:
                raise GenerationError(f"logit_bias has token id {token!r}, outside the "
                                      f"vocabulary [0, {vocab})")
            bias[b, token] = value
    active = ((repetition != 1) | (presence != 0) | (frequency != 0) | (least > 0)
              | np.any(bias != 0, axis=1))
    return Controls(repetition=repetition, presence=presence, frequency=frequency, bias=bias,
                    min_tokens=least, active=active)


def check_constraints(regex, json_schema, rows: int, target, vocab: int, stop_ids):
    """Each row's automaton (`sampling.constraints`) from `regex` or `json_schema` (one for
    every row, or a list of one per row, None where free), compiled once per distinct one. A
    regex may also be an `Automaton` compiled before (`compile_regex`, or `from_vocabulary`
    for a model without a tokenizer)."""
    given, name = (regex, "regex") if regex is not None else (json_schema, "json_schema")
    if given is None:
        return constraints_of([None] * rows, stop_ids, vocab)
    values = list(given) if isinstance(given, (list, tuple)) else [given] * rows
    if len(values) != rows:
        raise GenerationError(f"{name} has {len(values)} values for {rows} prompts")
    if name == "regex" and all(isinstance(v, Automaton) or v is None for v in values):
        for v in values:
            if v is not None and v.table.shape[1] > vocab:
                raise GenerationError(f"the automaton of {v.pattern!r} has {v.table.shape[1]} "
                                      f"tokens, the target {vocab}")
        return _checked_stops(values, stop_ids, vocab)
    if target.tokenizer is None:
        raise GenerationError(f"{name} is matched against the text, and the target has no "
                              "tokenizer")
    compile_ = compile_regex if name == "regex" else compile_json_schema
    compiled = {}
    for value in values:
        if value is not None and schema_key(value) not in compiled:
            try:
                compiled[schema_key(value)] = compile_(value, target.tokenizer,
                                                       target.config.vocab_size)
            except ConstraintError as e:
                raise GenerationError(str(e)) from None
    automata = [None if v is None else compiled[schema_key(v)] for v in values]
    return _checked_stops(automata, stop_ids, vocab)


def _checked_stops(automata, stop_ids, vocab):
    for b, automaton in enumerate(automata):
        if automaton is not None and not (stop_ids[b] >= 0).any():
            raise GenerationError(f"a constrained row needs an EOS id to stop at (row {b} has "
                                  "eos_ids=())")
    return constraints_of(automata, stop_ids, vocab)


def check_stop(stop, rows: int, tokenizer) -> tuple[tuple[str, ...], ...]:
    """Each row's stop strings (a list for every row or one per row, checked when the
    `SamplingParams` was made), which need the target's tokenizer: they are found in the
    text."""
    lists = stop_lists(stop)
    if stops_per_row(stop) and len(lists) != rows:
        raise GenerationError(f"stop has {len(lists)} lists for {rows} prompts")
    if any(lists) and tokenizer is None:
        raise GenerationError("stop strings are found in the decoded text, and the target has "
                              "no tokenizer")
    table = tuple(tuple(s) for s in lists) or ((),)
    return table if stops_per_row(stop) else table * rows


def check_logprobs(logprobs: int, vocab: int) -> int:
    """How many alternatives each emitted token's log-probability comes with: at most
    `MAX_LOGPROBS` (checked when made) and at most the vocabulary."""
    if logprobs > vocab:
        raise GenerationError(f"logprobs must be at most {min(MAX_LOGPROBS, vocab)}, got "
                              f"{logprobs}")
    return int(logprobs)


def per_row_ints(name: str, value, rows: int, minimum: int) -> np.ndarray:
    """An integer for every row, or one per row: [rows] int32."""
    values = per_row(name, value, rows)
    for v in distinct(values):
        check_int(name, v, minimum)
    return np.asarray(values, np.int32)


STOP_SLOTS = 8


def check_stop_ids(eos_ids, rows: int) -> np.ndarray:
    """The ids that end each row, [rows, S] int32 padded with -1; S, the slots, is a power of
    two of at least `STOP_SLOTS`, so that other stop ids, or a few more, do not recompile.
    `eos_ids` is one sequence of ids for every row, or a sequence of one per row."""
    if not is_sequence(eos_ids):
        raise GenerationError(f"eos_ids must be a list of token ids (or one list per prompt), "
                              f"got {eos_ids!r}")
    each_row = len(eos_ids) > 0 and all(is_sequence(e) for e in eos_ids)
    lists = [list(e) for e in eos_ids] if each_row else [list(eos_ids)]
    if each_row and len(lists) != rows:
        raise GenerationError(f"eos_ids has {len(lists)} lists for {rows} prompts")
    for e in distinct([e for ids in lists for e in ids]):
        if isinstance(e, bool) or not isinstance(e, numbers.Integral) or not 0 <= e < 2 ** 31:
            raise GenerationError(f"eos_ids must hold token ids >= 0, got {e!r}")
    longest = max(len(ids) for ids in lists)
    slots = max(STOP_SLOTS, 1 << (longest - 1).bit_length()) if longest else STOP_SLOTS
    table = np.full((len(lists), slots), -1, np.int32)
    for b, ids in enumerate(lists):
        table[b, :len(ids)] = ids
    return table if each_row else np.repeat(table, rows, axis=0)
