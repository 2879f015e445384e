"""specjax: GPT-2 and Llama inference in JAX with exact speculative and n-gram decoding."""

from specjax.checkpoint import CheckpointError, Model, load, random_model, save
from specjax.config import ConfigError, ModelConfig
from specjax.model import forward, init_params

__all__ = ["CheckpointError", "ConfigError", "Model", "ModelConfig", "forward", "init_params",
           "load", "random_model", "save"]
