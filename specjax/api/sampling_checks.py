"""The checks of a request's sampling, on the host (`specjax.generate`): the one
`SamplingParams` (or one a row), bound to the rows as the loop's per-row settings (temperature,
top-k, top-p, min-p, the controls, the structured-output constraints, the stop strings and stop
ids, log-probabilities), each bad value a `GenerationError` naming it."""

from __future__ import annotations

import dataclasses
import json
import numbers
from typing import Sequence

import numpy as np

from specjax.decoding.state import RowSettings
from specjax.model.transformer import Model
from specjax.sampling.constraints import (Automaton, ConstraintError, compile_json_schema,
                                          compile_regex, constraints_of)
from specjax.sampling.controls import Controls
from specjax.sampling.logits import Sampling
from specjax.sampling.params import (BIAS_RANGE, MAX_LOGPROBS, MAX_STOPS, PENALTY_RANGE,
                                     GenerationError, SamplingParams, check_int, distinct,
                                     is_sequence)


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
    """Each row's penalties, logit bias and minimum length (`specjax.sampling.controls`),
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
