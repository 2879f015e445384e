"""The checks of `specjax.generate`'s arguments, on the host, with errors that name the offending
value (`GenerationError`); the compiled loop itself (`decoding.loop`) assumes valid input."""

from __future__ import annotations

import dataclasses
import json
import numbers
import os
from typing import Sequence

import numpy as np

from specjax.decoding.methods import REGISTRY, listing, methods_taking
from specjax.decoding.lookahead import DEFAULT_CONFIDENCE_THRESHOLD, DEFAULT_K_START, SCHEDULES
from specjax.decoding.trees import SCHEMES
from specjax.heads.eagle import Drafter
from specjax.heads.medusa import Heads
from specjax.io.checkpoint import Model
from specjax.io.sidecar import check_target
from specjax.model.config import DTYPES, EIGHT_BIT
from specjax.sampling.constraints import (Automaton, ConstraintError, compile_json_schema,
                                          compile_regex, constraints_of)
from specjax.decoding.state import RowSettings
from specjax.sampling.logits import Controls, Sampling
from specjax.sampling.params import (BIAS_RANGE, MAX_LOGPROBS, MAX_STOPS, PENALTY_RANGE,
                                     GenerationError, SamplingParams, check_int, distinct,
                                     is_sequence)
from specjax.sampling.tree import DynamicTree, Tree, TreeError



KERNELS_ENV = "SPECJAX_KERNELS"
_ENV_VALUES = {"on": True, "1": True, "true": True, "off": False, "0": False, "false": False}


def kernels_switch(kernels) -> bool:
    """The CPU kernels' switch: `kernels` when given, else $SPECJAX_KERNELS (on by default).
    Where it is on, the kernels are built and registered (`specjax.kernels.ensure`); without a
    compiler, or on a GPU, that is False and XLA's formulation runs."""
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
    against the rows, the vocabulary and the target's tokenizer."""
    law = rows_of(check_sampling(sampling.temperature, sampling.top_k, sampling.top_p,
                                 sampling.min_p), rows)
    controls = check_controls(rows, vocab, max_new, sampling.repetition_penalty,
                              sampling.presence_penalty, sampling.frequency_penalty,
                              sampling.logit_bias, sampling.min_tokens)
    constraint = check_constraints(sampling.regex, sampling.json_schema, rows, target, vocab,
                                   stop_ids)
    settings = RowSettings(law, max_new, stop_ids, controls, constraint)
    return settings, check_stop(sampling.stop, rows, target.tokenizer)


def check_sampling(temperature, top_k, top_p, min_p) -> Sampling:
    """The sampling parameters, each a number for every row or a sequence of one per row,
    validated (`SamplingParams`), as numpy arrays ([] or [B] each)."""
    values = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p}
    dtypes = {"temperature": np.float32, "top_k": np.int32, "top_p": np.float32,
              "min_p": np.float32}
    arrays = {}
    for name, value in values.items():
        per_row = _is_sequence(value)
        array = np.asarray(value, dtype=object) if per_row else None
        if per_row and (array.ndim != 1 or not len(array)):
            raise GenerationError(f"{name} must be a number or a flat list of one per row, "
                                  f"got {value!r}")
        for v in _distinct(array.tolist() if per_row else [value]):
            try:
                SamplingParams(**{name: v})
            except ValueError as e:
                raise GenerationError(str(e)) from None
        arrays[name] = np.asarray(array.tolist() if per_row else value, dtypes[name])
    return Sampling(**arrays)


_is_sequence, _distinct = is_sequence, distinct


def rows_of(sampling: Sampling, rows: int) -> Sampling:
    """Every field [rows]: a number repeated, a per-row sequence checked for its length."""
    fields = {}
    for name in ("temperature", "top_k", "top_p", "min_p"):
        value = getattr(sampling, name)
        if value.ndim and len(value) != rows:
            raise GenerationError(f"{name} has {len(value)} values for {rows} prompts")
        fields[name] = np.broadcast_to(value, (rows,)).copy()
    return Sampling(**fields)


def check_controls(rows: int, vocab: int, max_new: np.ndarray, repetition_penalty,
                   presence_penalty, frequency_penalty, logit_bias, min_tokens) -> Controls:
    """Each row's penalties, logit bias and minimum length (`specjax.sampling.logits`),
    validated: a number (a dict for the bias) for every row, or a sequence of one per row."""
    def numbers_of(name, value, ok, allowed):
        values = list(value) if _is_sequence(value) else [value] * rows
        if len(values) != rows:
            raise GenerationError(f"{name} has {len(values)} values for {rows} prompts")
        for v in _distinct(values):
            if (isinstance(v, bool) or not isinstance(v, numbers.Real)
                    or not np.isfinite(v) or not ok(v)):
                raise GenerationError(f"{name} must be {allowed}, got {v!r}")
        return np.asarray(values, np.float32)

    repetition = numbers_of("repetition_penalty", repetition_penalty, lambda v: v > 0,
                            "a finite number > 0 (1 = off)")
    within = lambda v: -PENALTY_RANGE <= v <= PENALTY_RANGE              # noqa: E731
    presence = numbers_of("presence_penalty", presence_penalty, within,
                          f"in [-{PENALTY_RANGE:g}, {PENALTY_RANGE:g}] (0 = off)")
    frequency = numbers_of("frequency_penalty", frequency_penalty, within,
                           f"in [-{PENALTY_RANGE:g}, {PENALTY_RANGE:g}] (0 = off)")
    least = per_row_ints("min_tokens", min_tokens, rows, 0)
    if np.any(least > max_new):
        i = int(np.argmax(least > max_new))
        raise GenerationError(f"min_tokens={least[i]} exceeds max_new_tokens={max_new[i]}"
                              + (f" (row {i})" if rows > 1 else ""))
    bias = np.zeros((rows, vocab), np.float32)
    per_row = isinstance(logit_bias, Sequence) and not isinstance(logit_bias, (str, dict))
    tables = list(logit_bias) if per_row else [logit_bias] * rows
    if len(tables) != rows:
        raise GenerationError(f"logit_bias has {len(tables)} dicts for {rows} prompts")
    for b, table in enumerate(tables):
        if table is None:
            continue
        if not isinstance(table, dict):
            raise GenerationError(f"logit_bias must be a dict {{token id: bias}} (or one per "
                                  f"prompt), got {table!r}")
        for token, value in table.items():
            if (isinstance(token, bool) or not isinstance(token, numbers.Integral)
                    or not 0 <= token < vocab):
                raise GenerationError(f"logit_bias has token id {token!r}, outside the "
                                      f"vocabulary [0, {vocab})")
            if (isinstance(value, bool) or not isinstance(value, numbers.Real)
                    or not -BIAS_RANGE <= value <= BIAS_RANGE):
                raise GenerationError(f"logit_bias[{token}] must be a number in "
                                      f"[-{BIAS_RANGE:g}, {BIAS_RANGE:g}], got {value!r}")
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
    if regex is not None and json_schema is not None:
        raise GenerationError("pass regex or json_schema, not both")
    given, name = (regex, "regex") if regex is not None else (json_schema, "json_schema")
    if given is None:
        return constraints_of([None] * rows, stop_ids, vocab)
    per_row = isinstance(given, (list, tuple))
    values = list(given) if per_row else [given] * rows
    if len(values) != rows:
        raise GenerationError(f"{name} has {len(values)} values for {rows} prompts")
    if name == "regex" and all(isinstance(v, Automaton) or v is None for v in values):
        for v in values:
            if v is not None and v.table.shape[1] > vocab:
                raise GenerationError(f"the automaton of {v.pattern!r} has {v.table.shape[1]} "
                                      f"tokens, the target {vocab}")
        return _checked_stops(values, stop_ids, vocab, constraints_of)
    if target.tokenizer is None:
        raise GenerationError(f"{name} is matched against the text, and the target has no "
                              "tokenizer")
    compiled = {}
    for value in values:
        key = value if isinstance(value, str) or value is None else json.dumps(value,
                                                                               sort_keys=True)
        if value is None or key in compiled:
            continue
        if name == "regex" and not isinstance(value, str):
            raise GenerationError(f"regex must be a string (or one per prompt), got {value!r}")
        if name == "json_schema" and not isinstance(value, (str, dict)):
            raise GenerationError(f"json_schema must be a dict or its JSON text, got {value!r}")
        try:
            compiled[key] = (compile_regex if name == "regex" else compile_json_schema)(
                value, target.tokenizer, target.config.vocab_size)
        except ConstraintError as e:
            raise GenerationError(str(e)) from None
    automata = [None if v is None else compiled[v if isinstance(v, str) else
                                                json.dumps(v, sort_keys=True)] for v in values]
    return _checked_stops(automata, stop_ids, vocab, constraints_of)


def _checked_stops(automata, stop_ids, vocab, constraints_of):
    for b, automaton in enumerate(automata):
        if automaton is not None and not (stop_ids[b] >= 0).any():
            raise GenerationError(f"a constrained row needs an EOS id to stop at (row {b} has "
                                  "eos_ids=())")
    return constraints_of(automata, stop_ids, vocab)


def check_stop(stop, rows: int, tokenizer) -> tuple[tuple[str, ...], ...]:
    """Each row's stop strings: None (none), a list of non-empty strings for every row, or one
    such list per row; they need the target's tokenizer (they are found in the text)."""
    if stop is None:
        return ((),) * rows
    if isinstance(stop, str):
        raise GenerationError(f"stop must be a list of strings (or one list per prompt), got "
                              f"{stop!r}: write [{stop!r}]")
    per_row = (_is_sequence(stop) and len(stop) > 0
               and all(_is_sequence(s) for s in stop))
    lists = [list(s) for s in stop] if per_row else [list(stop) if _is_sequence(stop) else stop]
    if per_row and len(lists) != rows:
        raise GenerationError(f"stop has {len(lists)} lists for {rows} prompts")
    for strings in lists:
        if not isinstance(strings, list) or len(strings) > MAX_STOPS or not all(
                isinstance(s, str) and s for s in strings):
            raise GenerationError(f"stop must hold at most {MAX_STOPS} non-empty strings, got "
                                  f"{strings!r}")
    if any(lists) and tokenizer is None:
        raise GenerationError("stop strings are found in the decoded text, and the target has "
                              "no tokenizer")
    table = tuple(tuple(s) for s in lists)
    return table if per_row else table * rows


def check_logprobs(logprobs, vocab: int) -> int:
    """How many alternatives each emitted token's log-probability comes with (OpenAI's cap)."""
    check_int("logprobs", logprobs, 0)
    if logprobs > min(MAX_LOGPROBS, vocab):
        raise GenerationError(f"logprobs must be at most {min(MAX_LOGPROBS, vocab)}, got "
                              f"{logprobs}")
    return int(logprobs)


def per_row_ints(name: str, value, rows: int, minimum: int) -> np.ndarray:
    """An integer for every row, or one per row: [rows] int32."""
    values = list(value) if _is_sequence(value) else [value] * rows
    if len(values) != rows:
        raise GenerationError(f"{name} has {len(values)} values for {rows} prompts")
    for v in _distinct(values):
        check_int(name, v, minimum)
    return np.asarray(values, np.int32)


STOP_SLOTS = 8


def check_stop_ids(eos_ids, rows: int) -> np.ndarray:
    """The ids that end each row, [rows, S] int32 padded with -1; S, the slots, is a power of
    two of at least `STOP_SLOTS`, so that other stop ids, or a few more, do not recompile.
    `eos_ids` is one sequence of ids for every row, or a sequence of one per row."""
    if not _is_sequence(eos_ids):
        raise GenerationError(f"eos_ids must be a list of token ids (or one list per prompt), "
                              f"got {eos_ids!r}")
    per_row = len(eos_ids) > 0 and all(_is_sequence(e) for e in eos_ids)
    lists = [list(e) for e in eos_ids] if per_row else [list(eos_ids)]
    if per_row and len(lists) != rows:
        raise GenerationError(f"eos_ids has {len(lists)} lists for {rows} prompts")
    for e in _distinct([e for ids in lists for e in ids]):
        if isinstance(e, bool) or not isinstance(e, numbers.Integral) or not 0 <= e < 2 ** 31:
            raise GenerationError(f"eos_ids must hold token ids >= 0, got {e!r}")
    longest = max(len(ids) for ids in lists)
    slots = max(STOP_SLOTS, 1 << (longest - 1).bit_length()) if longest else STOP_SLOTS
    table = np.full((len(lists), slots), -1, np.int32)
    for b, ids in enumerate(lists):
        table[b, :len(ids)] = ids
    return table if per_row else np.repeat(table, rows, axis=0)


def _check_beside(value, kind: type, what: str, keyword: str, method: str, target) -> None:
    """What a method reads beside the target (Medusa heads, an EAGLE drafter) must be there,
    of its kind, and trained on this target."""
    if value is None:
        raise GenerationError(f"method {method!r} needs {what} ({keyword}=specjax.load(DIR))")
    if not isinstance(value, kind):
        raise GenerationError(f"{keyword} must be {what} from specjax.load, got "
                              f"{type(value).__name__}")
    try:
        check_target(value, target)
    except ValueError as e:
        raise GenerationError(str(e)) from None


def check_heads(heads, tree, target):
    """Medusa's heads must be heads, trained on this target; returns the tree to use: the
    caller's, else the heads' own, else (published heads ship none) a chain of one candidate
    per head, as vLLM runs them."""
    _check_beside(heads, Heads, "Medusa heads", "heads", "medusa", target)
    if tree is not None:
        return tree
    return heads.tree if heads.tree is not None else Tree.chain(heads.config.num_heads)


def check_drafter(drafter, tree, target, k: int, all_greedy: bool = True):
    """EAGLE's drafter must be a drafter, trained on this target; returns the tree to use: the
    caller's, else the drafter's own (its sampled default when a row samples and it has one),
    else a chain of k."""
    _check_beside(drafter, Drafter, "an EAGLE drafter", "drafter", "eagle", target)
    taps = drafter.config.taps
    if taps and max(taps) >= target.config.n_layers:
        raise GenerationError(f"{drafter.name} reads the states after {list(taps)} layers, but "
                              f"{target.name} has {target.config.n_layers}")
    if tree is not None:
        return tree
    if not all_greedy and drafter.sampled_tree is not None:
        return drafter.sampled_tree
    return drafter.tree if drafter.tree is not None else Tree.chain(k)


# The methods with a drafter of their own, and the dtypes it can run in.
def check_drafter_dtype(dtype, method: str, target: Model, mesh=None) -> str:
    """The dtype the method's drafter runs in: `dtype`, else the target's."""
    if dtype is None:
        return target.config.dtype
    if "drafter_dtype" not in REGISTRY[method].options:
        raise GenerationError(f"drafter_dtype applies to methods "
                              f"{', '.join(methods_taking('drafter_dtype'))}, not {method!r}")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise GenerationError(f"drafter_dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype in EIGHT_BIT and mesh is not None:
        raise GenerationError(f"drafter_dtype {dtype!r} does not run on a device mesh (8-bit "
                              "matrices have no sharding table): use float32 or bfloat16")
    return dtype


def check_tree_fits_heads(tree: Tree, heads: Heads) -> None:
    if tree.max_depth > heads.config.num_heads:
        raise GenerationError(f"the tree is {tree.max_depth} deep but {heads.name} has "
                              f"{heads.config.num_heads} heads (one per depth)")
    if tree.max_width > heads.config.subset_size:
        raise GenerationError(f"the tree has {tree.max_width} children at a node, more than the "
                              f"{heads.config.subset_size} tokens the heads can propose")


def check_tree(method, tree, candidates, all_greedy: bool, target):
    """The tree as a `Tree` and the candidate scheme, or (None, "top") without a tree."""
    if tree is None:
        if candidates is not None:
            raise GenerationError("candidates applies to token trees; pass tree=... too")
        return None, "top"
    if method == "autoregressive":
        raise GenerationError("a token tree needs method 'speculative', 'ngram', 'medusa' or "
                              "'eagle', not 'autoregressive'")
    if isinstance(tree, DynamicTree):
        if method != "eagle":
            raise GenerationError(f"a dynamic tree is EAGLE-2's: it needs method 'eagle', not "
                                  f"{method!r}")
        if candidates not in (None, "top"):
            raise GenerationError(f"a dynamic tree's candidates are the drafter's top tokens; "
                                  f"candidates={candidates!r} does not apply")
        if tree.size >= target.config.max_positions:
            raise GenerationError(f"the tree has {tree.size} nodes; a target call on it needs "
                                  f"more than the context window of {target.name} "
                                  f"({target.config.max_positions})")
        reach = (tree.depth - 1) * tree.top_k       # the drafter's frontiers, past the tree
        if reach >= target.config.max_positions:
            raise GenerationError(f"a dynamic tree of depth {tree.depth} and top_k {tree.top_k} "
                                  f"drafts {reach} frontier slots, more than the context "
                                  f"window of {target.name} ({target.config.max_positions})")
        return tree, "top"
    if not isinstance(tree, Tree):
        try:
            tree = Tree.from_paths(tree)
        except TreeError as e:
            raise GenerationError(str(e)) from None
    if tree.size >= target.config.max_positions:
        raise GenerationError(f"the tree has {tree.size} nodes; a target call on it needs more "
                              f"than the context window of {target.name} "
                              f"({target.config.max_positions})")
    if method == "ngram":
        if candidates not in (None, "top"):
            raise GenerationError(f"n-gram lookup fills a tree with deterministic candidates; "
                                  f"candidates={candidates!r} applies to a draft model")
        return tree, "top"
    if candidates is None:
        candidates = "top" if all_greedy else "distinct"
    if candidates not in SCHEMES:
        raise GenerationError(f"candidates must be one of {', '.join(SCHEMES)}; "
                              f"got {candidates!r}")
    if all_greedy and candidates != "top":
        # Sampled from a one-hot p, every candidate would be the draft's argmax.
        raise GenerationError(f"at temperature 0 the draft's distribution is one-hot, so "
                              f"candidates={candidates!r} would draw its argmax only; use 'top'")
    if tree.max_width > target.config.vocab_size:
        raise GenerationError(f"the tree has {tree.max_width} children at a node, more than the "
                              f"vocabulary ({target.config.vocab_size})")
    return tree, candidates


def check_schedule(method, tree, k, k_schedule, k_start, threshold) -> dict:
    """The lookahead schedule's spec fields (`decoding.lookahead`), checked."""
    if k_schedule not in SCHEDULES:
        raise GenerationError(f"k_schedule must be one of {', '.join(SCHEDULES)}; "
                              f"got {k_schedule!r}")
    if k_schedule == "confidence" and method == "ngram":
        raise GenerationError("k_schedule='confidence' needs a draft model's probabilities "
                              "(method 'speculative'); n-gram lookup has none")
    if k_schedule != "constant":
        if k_schedule not in REGISTRY[method].schedules:
            takers = [m.name for m in REGISTRY.values() if k_schedule in m.schedules]
            raise GenerationError(f"k_schedule={k_schedule!r} applies to "
                                  f"method{'s' * (len(takers) > 1)} {listing(takers)}, "
                                  f"not {method!r}")
        if tree is not None:
            raise GenerationError(f"k_schedule={k_schedule!r} drafts a chain; a token tree's "
                                  "shape is fixed (use k_schedule='constant')")
    if k_start is not None and k_schedule != "heuristic":
        raise GenerationError("k_start applies to k_schedule='heuristic'")
    if threshold is not None and k_schedule != "confidence":
        raise GenerationError("confidence_threshold applies to k_schedule='confidence'")
    fields = dict(k_schedule=k_schedule)
    if k_schedule == "heuristic":
        if k_start is None:
            k_start = min(DEFAULT_K_START, k)
        check_int("k_start", k_start, 1)
        if k_start > k:
            raise GenerationError(f"k_start={k_start} is more than k={k}, the most a step drafts "
                                  "under the heuristic schedule")
        fields["k_start"] = k_start
    if k_schedule == "confidence":
        if threshold is None:
            threshold = DEFAULT_CONFIDENCE_THRESHOLD
        if (isinstance(threshold, bool) or not isinstance(threshold, numbers.Real)
                or not 0.0 <= threshold <= 1.0):
            raise GenerationError(f"confidence_threshold must be a number in [0, 1], "
                                  f"got {threshold!r}")
        fields["confidence_threshold"] = float(threshold)
    return fields


def bucket(n: int) -> int:
    """Rounds lengths up so that new prompt lengths rarely recompile: powers of two up to 256,
    then four sizes per octave (320, 384, 448, 512, 640, ...), so that a buffer is at most
    1.25x what the request needs."""
    if n <= 256:
        return max(8, 1 << (n - 1).bit_length())
    step = 1 << (n.bit_length() - 3)
    return -(-n // step) * step
