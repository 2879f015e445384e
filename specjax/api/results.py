"""What `specjax.generate` returns: the tokens and texts of each row and the run's statistics
(`GenerationResult`, `Stats`, `RowStats`), read back from the decode state (`result`)."""

from __future__ import annotations

import dataclasses

import numpy as np
from jax.experimental import multihost_utils

from specjax.api.checks import GenerationError
from specjax.decoding.state import DecodeState



def acceptance_by_position(histogram) -> list[float | None]:
    """From a histogram of accepted drafts per step (`Stats.accepted_histogram`), for i = 1..K:
    of the steps that accepted at least i - 1 drafts, the fraction that accepted at least i
    (None where no step got that far). With K drafts every step this is the probability that
    draft i is accepted given drafts 1..i-1 were, which the i.i.d. theory (Leviathan et al.
    2023) assumes to be one constant a; with fewer drafts (n-gram misses, dynamic lookahead) a
    step that drafted fewer than i counts as not accepting i."""
    if not histogram:
        return []
    reached = [sum(histogram[j:]) for j in range(len(histogram))]
    return [reached[i] / reached[i - 1] if reached[i - 1] else None
            for i in range(1, len(histogram))]


@dataclasses.dataclass(frozen=True)
class Stats:
    method: str
    rows: int
    new_tokens: int            # over all rows
    target_calls: int          # decoding-loop calls of the target, summed over rows (no prefill)
    draft_calls: int
    drafted: int
    accepted: int
    tree_size: int             # candidates verified per target call: k for a chain, 0 for AR
    compile_s: float
    run_s: float
    # Steps that accepted exactly j drafted tokens, j = 0..K (or a tree's depth); () for AR.
    accepted_histogram: tuple[int, ...] = ()
    # Iterations of the decoding loop: every row pays for each, finished or not.
    steps: int = 0

    @property
    def acceptance_by_position(self) -> list[float | None]:
        """`acceptance_by_position` of this run's histogram."""
        return acceptance_by_position(self.accepted_histogram)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_target_call(self) -> float:
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def mean_draft_length(self) -> float:
        """Tokens drafted per target call: K for a constant chain, less under a dynamic
        lookahead schedule or an n-gram lookup that finds fewer."""
        return self.drafted / self.target_calls if self.target_calls else 0.0

    @property
    def idle_fraction(self) -> float:
        """Of the rows x loop iterations the batch paid for, the share spent on rows that had
        already finished (EOS or max_new_tokens): the cost of ragged lengths in one batch."""
        paid = self.rows * self.steps
        return 1.0 - self.target_calls / paid if paid else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.run_s if self.run_s > 0 else 0.0

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(acceptance_rate=self.acceptance_rate,
                 tokens_per_target_call=self.tokens_per_target_call,
                 mean_draft_length=self.mean_draft_length, idle_fraction=self.idle_fraction,
                 acceptance_by_position=self.acceptance_by_position,
                 tokens_per_second=self.tokens_per_second)
        return d


@dataclasses.dataclass(frozen=True)
class RowStats:
    """One row's share of the work (the counters of `Stats`, per row)."""
    new_tokens: int
    target_calls: int
    draft_calls: int
    drafted: int
    accepted: int
    # Steps of this row that accepted exactly j drafted tokens, j = 0..K; () for AR.
    accepted_histogram: tuple[int, ...] = ()

    @property
    def tokens_per_target_call(self) -> float:
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def acceptance_by_position(self) -> list[float | None]:
        return acceptance_by_position(self.accepted_histogram)

    def as_dict(self) -> dict:
        return dict(dataclasses.asdict(self), tokens_per_target_call=self.tokens_per_target_call,
                    acceptance_by_position=self.acceptance_by_position)


@dataclasses.dataclass(frozen=True)
class TokenLogprob:
    """A new token's log-probability under the target's distribution at its position (after
    every control), and the most likely tokens' there, best first: (id, log-probability)."""
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]

    def as_dict(self) -> dict:
        """For JSON: a log-probability of -inf (a token the filters removed) is null."""
        finite = lambda x: x if x > -float("inf") else None                 # noqa: E731
        return {"token": self.token, "logprob": finite(self.logprob),
                "top": [[token, finite(x)] for token, x in self.top]}


@dataclasses.dataclass(frozen=True)
class GenerationResult:
    tokens: list[list[int]]            # new tokens of each row (max_new_tokens unless EOS or a
    #                                    stop string came first: `cut_at_stop`)
    stats: Stats                       # the whole batch
    texts: list[str] | None = None
    row_stats: list[RowStats] = dataclasses.field(default_factory=list)   # one per row
    # With logprobs=N: each row's new tokens' `TokenLogprob`s; else None.
    logprobs: list[list[TokenLogprob]] | None = None
    # Why each row ended (`FINISH_REASONS`), as OpenAI's and vLLM's finish_reason says it.
    finish_reasons: list[str] = dataclasses.field(default_factory=list)


# Why a row ended: "eos", one of its stop ids (eos_ids) was drawn; "stop", a stop string came
# (the row is cut before it); "length", it reached max_new_tokens without either; "constraint",
# its regex or JSON schema was matched in full with no way on, so that only a stop id was
# allowed (the match is complete). A row that draws a stop id where the constraint also allowed
# more text ended by "eos". vLLM and OpenAI say "stop" for both an EOS and a stop string.
FINISH_REASONS = ("eos", "stop", "length", "constraint")


# -- From the decode state -----------------------------------------------------------------------


def result(request, state: DecodeState, compile_s: float, run_s: float) -> GenerationResult:
    """The result of a finished run of `request` (an `api.generate.Request`)."""
    if bool(host(state.nan_seen)):
        raise GenerationError("the model produced NaN logits; its weights or inputs are broken")
    real = request.rows            # rows past these pad the batch on a mesh
    tokens, length, start = (host(a) for a in (state.tokens, state.length,
                                                request.prompt_length))
    # Whole arrays to Python lists once, then row by row (a distribution test has 100,000 rows).
    rows = [row[s:n] for row, s, n in zip(tokens[:real].tolist(), start.tolist(), length.tolist())]
    # The statistics count every token the loop made; what is returned ends at a stop string.
    cuts = [cut_at_stop(request.tokenizer, row, stops) if stops else None
            for row, stops in zip(rows, request.stop or [()] * real)]
    counters = {name: host(getattr(state, name))[:real].astype(int) for name in
                ("target_calls", "draft_calls", "drafted", "accepted")}
    histograms = (np.zeros((real, 0), int) if state.accepted_histogram is None else
                  host(state.accepted_histogram)[:real].astype(int))
    row_stats = [RowStats(len(row), *numbers, accepted_histogram=tuple(histogram))
                 for row, histogram, *numbers in zip(rows, histograms.tolist(),
                                                     *(c.tolist() for c in counters.values()))]
    stats = Stats(method=request.spec.method.name, rows=len(rows),
                  new_tokens=int(sum(len(r) for r in rows)),
                  **{name: int(np.sum(values)) for name, values in counters.items()},
                  tree_size=request.spec.method.width, compile_s=compile_s, run_s=run_s,
                  steps=int(host(state.step)),
                  accepted_histogram=tuple(np.sum(histograms, axis=0).tolist()))
    reasons = finish_reasons(request, rows, cuts)
    rows = [row if cut is None else row[:cut[0]] for row, cut in zip(rows, cuts)]
    texts = None
    if request.tokenizer is not None:
        texts = [request.tokenizer.decode(r) if cut is None else cut[1]
                 for r, cut in zip(rows, cuts)]
    return GenerationResult(rows, stats, texts, row_stats, _logprobs(state, rows, start),
                            reasons)


def finish_reasons(request, rows: list[list[int]], cuts) -> list[str]:
    """Each row's `FINISH_REASONS` entry, from its new tokens (before any cut), its stop-string
    cut (`cut_at_stop`, None without stop strings) and its settings."""
    settings = request.settings
    stop_ids = host(settings.stop_ids)
    constraint = settings.constraint
    table = active = starts = None
    if np.any(host(constraint.active)):
        table, active, starts = (host(a) for a in (constraint.table, constraint.active,
                                                   constraint.start))
    reasons = []
    for b, (row, cut) in enumerate(zip(rows, cuts)):
        ids = stop_ids[b][stop_ids[b] >= 0]
        if cut is not None and cut[2]:
            reasons.append("stop")
        elif not row or row[-1] not in ids:
            reasons.append("length")
        elif table is not None and active[b] and _nothing_but(ids, table, starts[b], row[:-1]):
            reasons.append("constraint")
        else:
            reasons.append("eos")
    return reasons


def _nothing_but(stop_ids: np.ndarray, table: np.ndarray, state: int, tokens: list[int]) -> bool:
    """Whether the automaton, after `tokens` from `state`, allows only the stop ids."""
    for token in tokens:
        state = int(table[state, token])
    allowed = table[state] >= 0
    allowed[stop_ids] = False
    return not allowed.any()


def cut_at_stop(tokenizer, tokens: list[int], stops) -> tuple[int, str, bool]:
    """Where a row's first stop string (of `stops`) begins in the text of its new `tokens`:
    (how many tokens lie wholly before it, the text before it, True), or (all of them, their
    text, False) when none occurs."""
    text = tokenizer.decode(tokens)
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    if not found:
        return len(tokens), text, False
    end = min(found)
    return _tokens_within(tokenizer, tokens, end), text[:end], True


def safe_prefix(tokenizer, tokens: list[int], stops, done: bool) -> tuple[int, bool]:
    """For streaming: how many of a row's new tokens can be shown now, and whether a stop
    string ended the row. Without one yet, an unfinished row holds back the tokens whose text
    could still begin a stop string (the last len(longest) - 1 characters)."""
    kept, text, cut = cut_at_stop(tokenizer, tokens, stops)
    if cut or done:
        return kept, cut
    return _tokens_within(tokenizer, tokens, len(text) - max(map(len, stops)) + 1), False


def _tokens_within(tokenizer, tokens: list[int], end: int) -> int:
    """The most leading tokens whose text ends at or before character `end`."""
    j = len(tokens)
    while j and len(tokenizer.decode(tokens[:j])) > end:
        j -= 1
    return j


def _logprobs(state: DecodeState, rows, start) -> list[list[TokenLogprob]] | None:
    if state.logprobs is None:
        return None
    chosen, ids, top = (host(a) for a in state.logprobs)
    return [[TokenLogprob(token, float(chosen[b, s + i]),
                          tuple(zip(ids[b, s + i].tolist(), top[b, s + i].tolist())))
             for i, token in enumerate(row)]
            for b, (row, s) in enumerate(zip(rows, start.tolist()))]


def host(array) -> np.ndarray:
    """All of `array` as a numpy array; on a mesh across processes, gathered from all."""
    if getattr(array, "is_fully_addressable", True):
        return np.asarray(array)
    return np.asarray(multihost_utils.process_allgather(array, tiled=True))
