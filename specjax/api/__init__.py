"""The public API: `generate.generate` and `generate.stream` (`generate.prepare` checks every
option with `checks`, then the decoding layer runs the request and `results` reads it back) and
`explain.explain` (the numbers of a few verify steps, for study). Users reach them as
`specjax.generate`, `specjax.stream` and `specjax.explain`.

Layer: above decoding and file I/O (it may import everything below it); below the presets, the
CLI and the benchmarks.
"""
