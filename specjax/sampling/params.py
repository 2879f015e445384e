"""What a request asks of sampling, in one validated object: `SamplingParams`.

    sampling = SamplingParams(temperature=0.7, top_p=0.9, repetition_penalty=1.1,
                              stop=["\\n\\n"], json_schema=schema, logprobs=2)

vLLM's names where vLLM has the control. Each field is one value for every row, or a sequence of
one per row (a list of dicts for `logit_bias`, of lists for `stop`). A value out of range is a
`GenerationError` naming the field when the object is made; what needs the model (token ids
against the vocabulary, the stop strings against a tokenizer, the automaton of a regex) is
checked when a request binds it to a target (`specjax.api.checks`), and only there.

The first four fields are the law's: how logits become the distribution sampled from
(`specjax.sampling.logits`, with a row at temperature 0 greedy). The controls
(`repetition_penalty` .. `min_tokens`) shift the logits before them; `logprobs`, `stop` and the
constraint (`regex` or `json_schema`) say what to return and where to end.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from typing import Any, Sequence

import jax
import numpy as np

from specjax.sampling.constraints import Automaton


class GenerationError(ValueError):
    """Invalid input to `generate`: the message names the parameter and its value."""


# The ranges the controls take: OpenAI's for the presence and frequency penalties and the
# logit bias; a repetition penalty of any positive size (1 is off, below 1 favours repeats).
PENALTY_RANGE = 2.0
BIAS_RANGE = 100.0
MAX_STOPS = 16            # stop strings a row may have
MAX_LOGPROBS = 20         # alternatives per emitted token (OpenAI's cap)
_MAX_TOP_K = 2 ** 31 - 1  # top_k is an int32 per row


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling and controls (module docstring); every field a value for every row
    or a sequence of one per row, except `logprobs` (one for the request).

    Attributes:
      temperature: >= 0 and finite; 0 is greedy (the one-hot of the argmax).
      top_k: the most likely tokens kept, >= 0; 0 is off, a value >= V keeps everything.
      top_p: the nucleus mass in (0, 1]; 1 is off.
      min_p: in [0, 1]: keep tokens at least min_p times as likely as the likeliest; 0 is off.
      repetition_penalty: > 0: divide the positive logits and multiply the negative ones of
        every token seen in the prompt or the output; 1 is off.
      presence_penalty, frequency_penalty: in [-2, 2]: subtract from a token's logit once if it
        was generated, and once per time; 0 is off.
      logit_bias: {token id: bias in [-100, 100]}, added to the logits; None is off.
      min_tokens: >= 0: the stop ids (eos_ids) are masked until this many tokens are out.
      logprobs: N in [0, 20]: each new token's log-probability under the target's distribution
        after every control, with the N likeliest tokens' (`GenerationResult.logprobs`).
      stop: non-empty strings (at most 16) that end a row at their first occurrence in its new
        text, across token boundaries; the row's text ends just before it.
      regex, json_schema: constrained output: the row's text matches the regex in full, or is a
        JSON document valid under the schema (a dict or its JSON text); None is free. A regex
        may also be an `Automaton` compiled before (`sampling.constraints.compile_regex`).
    """

    temperature: Any = 1.0
    top_k: Any = 0
    top_p: Any = 1.0
    min_p: Any = 0.0
    repetition_penalty: Any = 1.0
    presence_penalty: Any = 0.0
    frequency_penalty: Any = 0.0
    logit_bias: Any = None
    min_tokens: Any = 0
    logprobs: int = 0
    stop: Any = None
    regex: Any = None
    json_schema: Any = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises a `GenerationError` naming the first field out of range."""
        for name, check in _LAW.items():
            for value in _values(name, getattr(self, name)):
                check(value)
        for name, (ok, allowed) in _PENALTIES.items():
            for value in _values(name, getattr(self, name)):
                if (isinstance(value, bool) or not isinstance(value, numbers.Real)
                        or not math.isfinite(value) or not ok(value)):
                    raise GenerationError(f"{name} must be {allowed}, got {value!r}")
        for value in _values("min_tokens", self.min_tokens):
            check_int("min_tokens", value, 0)
        check_int("logprobs", self.logprobs, 0)
        if self.logprobs > MAX_LOGPROBS:
            raise GenerationError(f"logprobs must be at most {MAX_LOGPROBS}, got {self.logprobs}")
        for table in bias_tables(self.logit_bias):
            _check_bias(table)
        for strings in stop_lists(self.stop):
            _check_stops(strings)
        _check_constraint(self.regex, self.json_schema)

    @property
    def greedy(self) -> bool:
        """True when every row's temperature is 0: each distribution is the one-hot of its
        argmax."""
        return not np.any(np.asarray(self.temperature, np.float64))

    def replace(self, **changes) -> SamplingParams:
        return dataclasses.replace(self, **changes)


def _check_temperature(t) -> None:
    if isinstance(t, bool) or not isinstance(t, numbers.Real) or not math.isfinite(t) or t < 0:
        raise GenerationError(f"temperature must be a finite number >= 0, got {t!r}")


def _check_top_k(k) -> None:
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 0:
        raise GenerationError(f"top_k must be an integer >= 0 (0 = off), got {k!r}")
    if k > _MAX_TOP_K:
        raise GenerationError(f"top_k must be at most {_MAX_TOP_K} (0 = off), got {k!r}")


def _check_top_p(p) -> None:
    # `not 0 < p <= 1` is also True for NaN, which fails every comparison.
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 < p <= 1.0:
        raise GenerationError(f"top_p must be in (0, 1] (1 = off), got {p!r}")


def _check_min_p(m) -> None:
    if isinstance(m, bool) or not isinstance(m, numbers.Real) or not 0.0 <= m <= 1.0:
        raise GenerationError(f"min_p must be in [0, 1] (0 = off), got {m!r}")


_LAW = {"temperature": _check_temperature, "top_k": _check_top_k, "top_p": _check_top_p,
        "min_p": _check_min_p}
_WITHIN = (lambda v: -PENALTY_RANGE <= v <= PENALTY_RANGE,
           f"in [-{PENALTY_RANGE:g}, {PENALTY_RANGE:g}] (0 = off)")
_PENALTIES = {"repetition_penalty": (lambda v: v > 0, "a finite number > 0 (1 = off)"),
              "presence_penalty": _WITHIN, "frequency_penalty": _WITHIN}


def check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise GenerationError(f"{name} must be an integer >= {minimum}, got {value!r}")


def is_sequence(value) -> bool:
    """A list, tuple or array of values (not a string, not a 0-d array)."""
    return (isinstance(value, (Sequence, np.ndarray, jax.Array)) and not isinstance(value, str)
            and getattr(value, "ndim", 1) != 0)


def distinct(values: list) -> list:
    """Each value once (1 and True apart), so that a per-row list is validated per value."""
    return [v for _, v in dict.fromkeys((type(v), v) for v in values)]


def _values(name: str, value) -> list:
    """The distinct values of a field that is a value or a flat sequence of one per row."""
    if not is_sequence(value):
        return [value]
    array = np.asarray(value, dtype=object)
    if array.ndim != 1 or not len(array):
        raise GenerationError(f"{name} must be a number or a flat list of one per row, "
                              f"got {value!r}")
    return distinct(array.tolist())


def per_row(name: str, value, rows: int) -> list:
    """A field's value for each of `rows` rows: repeated, or its sequence checked for length."""
    values = list(value) if is_sequence(value) else [value] * rows
    if len(values) != rows:
        raise GenerationError(f"{name} has {len(values)} values for {rows} prompts")
    return values


def bias_tables(logit_bias) -> list:
    """The distinct bias tables of a `logit_bias` field: one dict, or one per row."""
    if isinstance(logit_bias, Sequence) and not isinstance(logit_bias, (str, dict)):
        return list(logit_bias)
    return [logit_bias]


def _check_bias(table) -> None:
    """A bias table: None, or {token id >= 0: bias in [-100, 100]} (the ids are checked
    against the vocabulary when the request binds it)."""
    if table is None:
        return
    if not isinstance(table, dict):
        raise GenerationError(f"logit_bias must be a dict {{token id: bias}} (or one per "
                              f"prompt), got {table!r}")
    for token, value in table.items():
        if isinstance(token, bool) or not isinstance(token, numbers.Integral) or token < 0:
            raise GenerationError(f"logit_bias has token id {token!r}, which is not a token "
                                  "id >= 0")
        if (isinstance(value, bool) or not isinstance(value, numbers.Real)
                or not -BIAS_RANGE <= value <= BIAS_RANGE):
            raise GenerationError(f"logit_bias[{token}] must be a number in "
                                  f"[-{BIAS_RANGE:g}, {BIAS_RANGE:g}], got {value!r}")


def stop_lists(stop) -> list:
    """The lists of stop strings of a `stop` field: one list for every row, or one per row
    (none for None)."""
    if stop is None:
        return []
    if isinstance(stop, str):
        raise GenerationError(f"stop must be a list of strings (or one list per prompt), got "
                              f"{stop!r}: write [{stop!r}]")
    if is_sequence(stop) and len(stop) > 0 and all(is_sequence(s) for s in stop):
        return [list(s) for s in stop]
    return [list(stop) if is_sequence(stop) else stop]


def stops_per_row(stop) -> bool:
    """Whether a `stop` field gives one list per row (else one list for every row)."""
    return (stop is not None and not isinstance(stop, str) and is_sequence(stop)
            and len(stop) > 0 and all(is_sequence(s) for s in stop))


def _check_stops(strings) -> None:
    if not isinstance(strings, list) or len(strings) > MAX_STOPS or not all(
            isinstance(s, str) and s for s in strings):
        raise GenerationError(f"stop must hold at most {MAX_STOPS} non-empty strings, got "
                              f"{strings!r}")


def _check_constraint(regex, json_schema) -> None:
    """A regex (a string or a compiled `Automaton`) or a JSON schema (a dict or its JSON text),
    one for every row or one per row, None where free; not both."""
    if regex is not None and json_schema is not None:
        raise GenerationError("pass regex or json_schema, not both")
    given, name = (regex, "regex") if regex is not None else (json_schema, "json_schema")
    values = given if isinstance(given, (list, tuple)) else [given]
    for value in values:
        if value is None:
            continue
        if name == "regex" and not isinstance(value, (str, Automaton)):
            raise GenerationError(f"regex must be a string (or one per prompt), got {value!r}")
        if name == "json_schema" and not isinstance(value, (str, dict)):
            raise GenerationError(f"json_schema must be a dict or its JSON text, got {value!r}")


def schema_key(value) -> str | None:
    """A JSON schema's text, the same for equal schemas (one compile per distinct one)."""
    return value if isinstance(value, str) or value is None else json.dumps(value, sort_keys=True)
