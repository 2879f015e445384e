"""`specjax.forward`: the model's forward pass with the CPU kernels exactly as `generate` uses
them.

Which products a program uses is part of its static config (`ModelConfig.kernels`), so a
model's own config (which names none) runs XLA's formulations wherever it is traced. The public
`forward` chooses them as `generate` does, from the same run option: the kernels (built and
registered here) unless `kernels=False` or $SPECJAX_KERNELS=off, so its bits do not depend on
what ran before it. It is compiled, once per shape and config (the choice included), and the
program is reused: a loop over it dispatches one program a call, not every operation of the
model.
"""

from __future__ import annotations

import jax

from specjax import kernels as specjax_kernels
from specjax.api.checks import kernels_switch
from specjax.model import transformer
from specjax.model.config import ModelConfig
from specjax.model.linear import Kernels

__all__ = ["forward", "kernels_of", "run_config"]


def kernels_of(kernels: bool | None = None) -> Kernels | None:
    """The run option `kernels` (True, False, or None: $SPECJAX_KERNELS, on by default) as a
    program's configs name it: the CPU plug-in where it is on and the kernels build and
    register here (`specjax.kernels.plugin`), else None (XLA's formulations)."""
    return specjax_kernels.plugin() if kernels_switch(kernels) else None


def run_config(config: ModelConfig, kernels: bool | None = None) -> ModelConfig:
    """The config a program traced for the run option `kernels` runs (`transformer.lawful`):
    the plug-in it names, and the one law's width where it names none."""
    return transformer.lawful(config, kernels_of(kernels))


def forward(params, config, tokens, positions, cache=None, tree=None, *,
            kernels: bool | None = None):
    """`specjax.model.transformer.forward` (its docstring has the arguments and results), with
    the kernels chosen as `generate` chooses them (`kernels`, else $SPECJAX_KERNELS),
    compiled: the first call of a shape compiles a program (`jax.jit`, the config static),
    later calls of that shape run it. Without the kernels, a call on a cache takes the one
    law's width (`transformer.lawful`)."""
    return _compiled(params, run_config(config, kernels), tokens, positions, cache, tree)


_compiled = jax.jit(transformer.forward, static_argnums=1)
