"""The command line, `python -m specjax generate | bench | check | fetch` (`main`).

Layer: the top. It may import everything below it: the public API (`specjax.api`), file I/O
(`specjax.io`), the presets (`specjax.presets`), the benchmarks (`specjax.bench`, for the
`bench` subcommand) and the lossless check (`specjax.testing`, for `check`); nothing in specjax
imports it.
"""

from specjax.cli.main import main

__all__ = ["main"]
