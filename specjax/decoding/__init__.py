"""The decoding layer: every method as a pure step function, and the jitted loop that runs it.

`state` (the decode state and the bookkeeping every step shares, the step ending written once),
`config` (the static description of one generation), `loop` (prefill, then a `lax.while_loop` over
the method's step), `prefill` (the prompts read into a fresh cache, shared by every method),
`sharding` (the loop's layout on a device mesh), one module per method, each declaring its
static spec (a `config.MethodSpec` that names the module) beside its `init`, `step`, `layout`
and own state, `speculative_tree` (the draft model's tree step), `trees`
(one target call over a token tree, and the tree fill every tree drafter shares), `lookahead`
(dynamic draft lengths) and `trace` (the verify numbers `specjax.explain` reads).

Layer: may import `specjax.model`, `specjax.sampling`, `specjax.heads` and `specjax.mesh`; never
file I/O, the API, the CLI or the benchmarks.
"""
