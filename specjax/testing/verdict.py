"""A set of checks run together: entries (a sampler and the verdict expected of it), one
family-wise level over all of them, and the verdict table `python -m specjax check` prints."""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from specjax.sampling.logits import SamplingParams
from specjax.testing.check import Report, check
from specjax.testing.law import Pair

__all__ = ["Entry", "Verdict", "closing", "preface", "row", "run", "starting", "table"]


@dataclasses.dataclass(frozen=True)
class Entry:
    """A sampler to check, and what it should get: `lossless` True (an exact scheme), False
    (a known bug) or None (a client whose verdict is reported as measured)."""

    name: str
    lossless: bool | None
    source: str
    idea: str
    make: Callable[[], Callable]          # -> the sampler
    sampling: SamplingParams = SamplingParams(1.0)
    pair: "str | Pair" = "close"          # a pair's name (`testing.PAIRS`), or a `Pair`
    samples: int = 100_000
    controls: dict | None = None          # penalties and bias (`check`'s `controls`)
    length: int = 3                       # tokens per continuation (`check`'s `length`)


@dataclasses.dataclass(frozen=True)
class Verdict:
    entry: Entry
    report: Report

    @property
    def as_expected(self) -> bool:
        return self.entry.lossless is None or self.entry.lossless == self.report.lossless


def run(entries: Sequence[Entry], *, level: float = 0.01, seed: int = 0,
        samples: int | None = None, progress: Callable[[Verdict], None] | None = None,
        start: Callable[[Entry, int], None] | None = None) -> list[Verdict]:
    """Check every entry at level / len(entries) (Bonferroni: the whole run is one family at
    `level`); `samples` replaces every entry's own sample size. `start(entry, samples)` is
    called before each check, `progress(verdict)` after it."""
    verdicts = []
    for entry in entries:
        if start:
            start(entry, samples or entry.samples)
        report = check(entry.make(), pair=entry.pair, sampling=entry.sampling,
                       samples=samples or entry.samples, seed=seed, controls=entry.controls,
                       length=entry.length, level=level / len(entries), name=entry.name)
        verdicts.append(Verdict(entry, report))
        if progress:
            progress(verdicts[-1])
    return verdicts


def _setting(s: SamplingParams, controls: dict | None = None) -> str:
    return (f"T={s.temperature:g}" + (" +penalties" if controls else "")
            + (f" top-k={s.top_k}" if s.top_k else "")
            + (f" top-p={s.top_p:g}" if s.top_p < 1 else "")
            + (f" min-p={s.min_p:g}" if s.min_p else ""))


def row(v: Verdict) -> str:
    r, e = v.report, v.entry
    expected = {True: "exact", False: "bug", None: "client"}[e.lossless]
    verdict = "lossless" if r.lossless else "REJECTED"
    mark = "" if v.as_expected else "  <- UNEXPECTED"
    p = f"{r.p_value:.2g}" if r.p_value > 0 else "<1e-300"     # below float64's range
    return (f"{e.name:<38} {expected:<7} {verdict:<9} {p:>9} {r.samples:>9,} "
            f"{r.detectable_kl:>9.1e} {_setting(r.sampling, r.controls):<16} {r.seconds:>6.1f}  "
            f"{e.source}"
            + mark)


def starting(entry: Entry, samples: int) -> str:
    """The line announcing a check before it runs: what runs, its setting, its sample size."""
    pair = entry.pair if isinstance(entry.pair, str) else "given"
    return (f"starting {entry.name}: {entry.idea}; {_setting(entry.sampling, entry.controls)}, "
            f"pair {pair}, {samples:,} samples")


HEADER = (f"{'sampler':<38} {'kind':<7} {'verdict':<9} {'adj. p':>9} {'samples':>9} "
          f"{'sees KL':>9} {'setting':<16} {'time s':>6}  source")


def preface(checks: int, level: float) -> str:
    return (f"Family-wise level {level:g} over {checks} checks (Bonferroni). Each check: a G-test "
            f"of whole continuations and one per position against the target's exact law; "
            f"'adj. p' is the check's smallest p-value times its number of tests, 'sees KL' the "
            f"divergence (nats) it rejects with probability 0.9.")


def closing(verdicts: Sequence[Verdict]) -> str:
    wrong = [v.entry.name for v in verdicts if not v.as_expected]
    return ("Every verdict as expected." if not wrong
            else f"UNEXPECTED verdicts: {', '.join(wrong)}")


def table(verdicts: Sequence[Verdict], level: float) -> str:
    """The verdict table, one line per check, with its family-wise level stated."""
    return "\n".join([preface(len(verdicts), level), "", HEADER, *map(row, verdicts), "",
                      closing(verdicts)])
