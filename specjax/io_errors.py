"""The error a bad checkpoint file raises, shared by the safetensors and GGUF readers.

A module of its own (importing nothing from specjax) so that both readers can raise it
without importing each other.
"""


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names the file (and the tensor)."""
