"""specjax: GPT-2 and Llama inference in JAX with exact autoregressive, speculative (a draft
model), n-gram, Medusa, EAGLE and DFlash decoding (`specjax.api.methods`).

    import specjax
    target = specjax.load("weights/llama-target")
    draft = specjax.load("weights/llama-draft")
    result = specjax.generate(target, ["def add(a, b):"], specjax.Speculative(draft, k=4),
                              specjax.SamplingParams(temperature=0.0), max_new_tokens=64)

The names here are what a user of `load`, `generate`, `stream`, `explain` and `forward` needs:
the calls, the method objects, `SamplingParams`, the trees, what comes back and the errors a
call raises. The rest stays in its own module (making and writing heads and drafters:
`specjax.heads.*`, `specjax.io.*`; device meshes: `specjax.mesh`; `random_model` and `save`:
`specjax.io.checkpoint`); CHANGELOG.md lists where each name moved.
"""

from specjax.api.checks import GenerationError
from specjax.api.explain import explain, format_steps
from specjax.api.forward import forward
from specjax.api.generate import generate, stream
from specjax.api.methods import Autoregressive, DFlash, Eagle, Medusa, NGram, Speculative
from specjax.api.results import GenerationResult, Stats
from specjax.io.checkpoint import CheckpointError, load
from specjax.model.config import ModelConfig
from specjax.model.transformer import Model
from specjax.sampling.params import SamplingParams
from specjax.sampling.tree import DynamicTree, Tree, TreeError

__all__ = ["load", "generate", "stream", "explain", "format_steps", "forward",
           "Autoregressive", "Speculative", "NGram", "Medusa", "Eagle", "DFlash",
           "SamplingParams", "Tree", "DynamicTree",
           "GenerationResult", "Stats", "Model", "ModelConfig",
           "GenerationError", "CheckpointError", "TreeError"]
