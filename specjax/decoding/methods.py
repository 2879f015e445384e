"""The decoding methods by name (`config.METHODS`): each a module with the same three functions.

  init(spec, weights, prompts, prompt_length) -> (target cache, carry)
      the prefill, and the method's own state (`DecodeState.carry`; None if it has none);
  step(spec, weights, state) -> state
      one step for every row, over a chain or a token tree (`spec.tree`);
  layout(spec, rows, cache) -> carry of shardings
      where the carry lives on a device mesh (`decoding.sharding`).

Chains and trees are two steps of one module where a method has both (speculative, n-gram):
docs/layout.md says why they stay apart.
"""

from __future__ import annotations

from specjax.decoding import autoregressive, dflash, eagle, medusa, ngram, speculative

MODULES = {"autoregressive": autoregressive, "speculative": speculative, "ngram": ngram,
           "medusa": medusa, "eagle": eagle, "dflash": dflash}
