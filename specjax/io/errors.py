"""The error every bad checkpoint file raises, whichever reader found it.

Loading a model, a GGUF file or a drafter's directory fails with `CheckpointError`, its message
naming the file (and the tensor or field where there is one), so that a user catches one type
for every file mistake. This module imports nothing from specjax: every reader can import it.
"""


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names the file and the tensor."""
