"""The checks of a request's sampling, on the host (`specjax.generate`): the one
`SamplingParams` (or one a row), bound to the rows as the loop's per-row settings (temperature,
top-k, top-p, min-p, the controls, the structured-output constraints, the stop strings and stop
ids, log-probabilities), each bad value a `GenerationError` naming it."""

from __future__ import annotations

import dataclasses
import numbers
from typing import Sequence

import numpy as np

from specjax.decoding.state import RowSettings
from specjax.model.transformer import Model
from specjax.sampling.constraints import (Automaton, ConstraintError, compile_json_schema,
                                          compile_regex, constraints_of)
from specjax.sampling.controls import Controls
from specjax.sampling.logits import Sampling
from specjax.sampling.params import (MAX_LOGPROBS, GenerationError, SamplingParams, bias_tables,
                                     check_int, distinct, is_sequence, per_row, schema_key,
                                     stop_lists, stops_per_row)


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
