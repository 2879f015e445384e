"""The model layer: GPT-2 and Llama-family transformers as pure functions.

`config` (ModelConfig, read from a Hugging Face config.json), `layers` (norms, rotary
embeddings, attention, MLPs), `cache` (the KV cache: fixed buffers, per-row lengths, masks from
absolute positions), `linear` (every weight product, and the one place that chooses XLA's
formulation or a CPU kernel of the `specjax.kernels` plug-in, by target name), `quant` (8-bit
matrices in GGUF Q8_0's layout: `Int8Weight`, the quantiser, dequantising) and `transformer`
(the parameter tree, `forward`, and `Model`, what `specjax.load` returns).

Layer: the bottom. It imports jax, numpy and the standard library's pure modules (never
subprocess or ctypes: building and loading the kernels is `specjax.kernels`'s), and no other
specjax package.
"""

from specjax.model.cache import KVCache, TreeAttention
from specjax.model.config import ConfigError, ModelConfig
from specjax.model.transformer import Model, Params, forward, hidden_states, init_params, lm_head

__all__ = ["ConfigError", "KVCache", "Model", "ModelConfig", "Params", "TreeAttention", "forward",
           "hidden_states", "init_params", "lm_head"]
