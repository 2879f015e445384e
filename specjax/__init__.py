"""specjax: GPT-2 and Llama inference in JAX with exact autoregressive, speculative (a draft
model), n-gram, Medusa, EAGLE and DFlash decoding (`specjax.decoding.methods`).

    import specjax
    target = specjax.load("weights/llama-target")
    draft = specjax.load("weights/llama-draft")
    result = specjax.generate(target, ["def add(a, b):"], specjax.Speculative(draft, k=4),
                              specjax.SamplingParams(temperature=0.0), max_new_tokens=64)
"""

from specjax.api.drafters import drafter_log_probs
from specjax.api.explain import explain, format_steps
from specjax.api.forward import forward
from specjax.api.checks import GenerationError
from specjax.api.generate import generate, release_programs, stream
from specjax.api.methods import Autoregressive, DFlash, Eagle, Medusa, NGram, Speculative
from specjax.api.results import GenerationResult, Stats
from specjax.heads.eagle import Drafter, DrafterConfig, init_drafter
from specjax.heads.medusa import Heads, HeadsConfig, init_heads
from specjax.io.checkpoint import CheckpointError, load, random_model, save
from specjax.io.eagle import save_drafter
from specjax.io.medusa import save_heads
from specjax.mesh import MeshError, make_mesh
from specjax.model.config import ConfigError, ModelConfig
from specjax.model.params import init_params
from specjax.model.transformer import Model
from specjax.sampling.params import SamplingParams
from specjax.sampling.tree import DynamicTree, Tree, TreeError

__all__ = ["Autoregressive", "CheckpointError", "DFlash", "Eagle", "Medusa", "NGram",
           "Speculative", "ConfigError", "Drafter", "DrafterConfig", "DynamicTree",
           "GenerationError",
           "GenerationResult", "Heads", "HeadsConfig", "MeshError", "Model", "ModelConfig",
           "SamplingParams", "Stats", "Tree", "TreeError", "drafter_log_probs", "explain", "format_steps", "forward",
           "generate", "init_drafter", "init_heads", "init_params", "load", "make_mesh",
           "random_model", "release_programs", "save", "save_drafter", "save_heads", "stream"]
