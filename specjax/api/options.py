"""The decoding options that `python -m specjax generate` and `python -m specjax bench` both
take, declared once: each flag's type, default and help. `add(parser, name, ...)` puts them on
an argparse parser or group; a command may change a declaration's help or default where its
meaning there differs (the bench's seed is the first timed run's), never its type or its name.

The values are checked once, by `prepare` (`api.checks`), whichever command passes them.
"""

from __future__ import annotations

DECODING = {
    "temperature": dict(type=float, default=0.0, help="0 = greedy (default)"),
    "top_p": dict(type=float, default=1.0,
                  help="nucleus mass in (0, 1] with --temperature > 0; 1 = off (default)"),
    "seed": dict(type=int, default=0, help="random seed in [0, 2^32) (default: 0)"),
    "max_ngram": dict(type=int, default=3, help="longest n-gram looked up (default 3)"),
    "confidence_threshold": dict(type=float, default=None, metavar="P",
                                 help="the confidence schedule's threshold in [0, 1] "
                                      "(default: 0.4)"),
}


def flag(name: str) -> str:
    """The command-line spelling of an option: top_p is --top-p."""
    return "--" + name.replace("_", "-")


def add(parser, *names: str, **changes: dict) -> None:
    """Adds the declared options `names` to `parser` (an argparse parser or group); `changes`
    maps a name to the fields its command declares otherwise (help, default)."""
    for name in names:
        declared = dict(DECODING[name])
        change = changes.get(name, {})
        if set(change) - {"help", "default"}:
            raise ValueError(f"{name}: only help and default may change, got {sorted(change)}")
        parser.add_argument(flag(name), **{**declared, **change})
