"""specjax.reference: the whole algorithm in plain NumPy, to read first and to test the engine by.

    import numpy as np, specjax
    from specjax import reference

    target, draft = specjax.load("weights/llama-target"), specjax.load("weights/llama-draft")
    logits = reference.forward(target, [1, 2, 3])                        # [3, V] float32
    tokens = reference.speculative(target, draft, [1, 2, 3], 16, np.random.default_rng(0),
                                   specjax.SamplingParams(temperature=0.7, top_p=0.9), k=4)

Read in this order, each a short module of pure functions over one sequence:

1. `model.py`: the GPT-2 and Llama forward passes (LayerNorm and RMSNorm, RoPE with its scaling
   variants, grouped-query attention, GELU and SwiGLU, tied or untied heads, biases, Qwen3's
   q/k norm), reading the parameter tree `specjax.load` gives.
2. `sampling.py`: temperature, top-k, top-p and min-p as `specjax.sampling.logits` defines
   them; the accept test and the residual of Algorithm 2 for a chain (`verify_row`), and the
   walk over a token tree's siblings (`verify_tree`); the coupled rule's draws and walks
   (`coupled_verify_row`, `coupled_verify_tree`).
3. `decoding.py`: the methods as whole loops: autoregressive, speculative (Algorithm 2),
   n-gram (prompt lookup) and a token tree of draft candidates; autoregressive and speculative
   sampling under the coupled rule, whose tokens are equal for the same seed.

No JAX, no cache, no batching: the engine (`specjax.generate`) adds those, and is tested
against this (tests/exactness/test_reference.py): equal logits, the same accept decisions on the same
uniform draws, equal greedy tokens, and the lossless verdict of `specjax.testing`, which ships
these samplers as its reference (`specjax.testing.REFERENCE`). Next: docs/walkthrough.md, then
the engine. It imports nothing from the rest of specjax (an import-linter contract).
"""

from specjax.reference.decoding import (
    autoregressive,
    coupled_autoregressive,
    coupled_speculative,
    ngram,
    ngram_lookup,
    speculative,
    speculative_step,
    speculative_tree,
)
from specjax.reference.model import Plain, forward, plain
from specjax.reference.sampling import (
    RULES,
    Sampling,
    coupled_verify_row,
    coupled_verify_tree,
    draw,
    gumbel_draw,
    probs,
    residual,
    settings,
    verify_row,
    verify_tree,
)
