"""The model layer: GPT-2 and Llama-family transformers as pure functions.

`config` (ModelConfig, read from a Hugging Face config.json), `layers` (norms, rotary
embeddings, attention, MLPs), `cache` (the KV cache: fixed buffers, per-row lengths, masks from
absolute positions), `linear` (every weight product, and the one interface to a CPU plug-in:
`specjax.kernels` registers its kernels there, and it alone decides which products, RoPE and
attention calls they serve), `quant` (8-bit matrices in GGUF Q8_0's layout: `Int8Weight`, the
quantiser, dequantising), `params` (the parameter tree: shapes, logical axes, random init) and
`transformer` (`forward`, and `Model`, what `specjax.load` returns).

Layer: the bottom. It imports jax, numpy and the standard library's pure modules (never
subprocess or ctypes: building and loading the kernels is `specjax.kernels`'s), and no other
specjax package.
"""

from specjax.model.cache import KVCache, TreeAttention
from specjax.model.config import ConfigError, ModelConfig
from specjax.model.params import Params, init_params
from specjax.model.transformer import Model, forward, hidden_states, lm_head

__all__ = ["ConfigError", "KVCache", "Model", "ModelConfig", "Params", "TreeAttention", "forward",
           "hidden_states", "init_params", "lm_head"]
