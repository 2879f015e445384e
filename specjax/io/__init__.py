"""File I/O, the only layer that reads or writes disk: Hugging Face checkpoint directories
(`checkpoint`), GGUF files (`gguf`), fetching real checkpoints into a local cache (`fetch`),
chat templates (`chat`) and Medusa heads directories (`heads`).

Every bad file raises `CheckpointError` (`errors`), its message naming the file.

Layer: may import the model, sampling, heads and mesh layers (to build what it loads and place
it on a device mesh); never decoding, the API, the CLI or the benchmarks.
"""

from specjax.io.checkpoint import load, random_model, save
from specjax.io.errors import CheckpointError
from specjax.io.medusa import load_heads, save_heads

__all__ = ["CheckpointError", "load", "load_heads", "random_model", "save", "save_heads"]
