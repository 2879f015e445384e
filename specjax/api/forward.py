"""`specjax.forward`: the model's forward pass with the CPU kernels exactly as `generate` uses
them.

`model.transformer.forward` uses the few-row kernels only once something has registered them
(`specjax.kernels.ensure`), so called on its own at the start of a process it would give XLA's
products, and after a first `generate` the kernels' (equal up to float32 rounding, not to the
bit). The public `forward` settles the switch first, as `generate` does: on (built and
registered) unless `kernels=False` or $SPECJAX_KERNELS=off, so its bits do not depend on what
ran before it. It is compiled, once per shape, config and kernel switch, and the program is
reused: a loop over it dispatches one program a call, not every operation of the model.
"""

from __future__ import annotations

import contextlib
import functools

import jax

from specjax import kernels as specjax_kernels
from specjax.api.checks import kernels_switch
from specjax.model import transformer
from specjax.model import linear
from specjax.model.linear import use_kernels

__all__ = ["forward", "kernels_as_generate", "kernels_on"]


def kernels_on(kernels: bool | None = None) -> bool:
    """Whether functions traced now should use the CPU kernels, as `generate` decides with the
    same `kernels` argument (None: an enclosing `use_kernels(...)` if there is one, else
    $SPECJAX_KERNELS, on by default); where they should, they are built and registered."""
    on = kernels_switch(kernels) if kernels is not None or linear.switch() is None \
        else linear.switch()
    return bool(on) and specjax_kernels.ensure()


@contextlib.contextmanager
def kernels_as_generate(kernels: bool | None = None):
    """Within it, functions traced use the CPU kernels as `kernels_on(kernels)` says."""
    with use_kernels(kernels_on(kernels)):
        yield


def forward(params, config, tokens, positions, cache=None, tree=None, *,
            kernels: bool | None = None):
    """`specjax.model.transformer.forward` (its docstring has the arguments and results), with
    the kernels switched as `generate` switches them (`kernels`, else an enclosing
    `use_kernels`, else $SPECJAX_KERNELS), compiled: the first call of a shape compiles a
    program (`jax.jit`, the config static), later calls of that shape run it. With the kernels
    off, a call on a cache takes the one law's width (`transformer.lawful`)."""
    return _compiled(kernels_on(kernels))(params, config, tokens, positions, cache, tree)


@functools.cache
def _compiled(kernels: bool):
    """The jitted forward traced with the kernels on or off: the switch is read while tracing,
    so each setting has its own program cache."""
    def traced(params, config, tokens, positions, cache, tree):
        with use_kernels(kernels):
            return transformer.forward(params, transformer.lawful(config, kernels), tokens,
                                       positions, cache, tree)
    return jax.jit(traced, static_argnums=1)
