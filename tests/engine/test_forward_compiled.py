"""`specjax.forward` is compiled once per shape and reused (issue 74, item 5): a loop over
several call widths, dtypes and both kernel settings compiles each program once, a second pass
compiles nothing, and the process's memory maps stay bounded (an eager loop over SmolLM2 ran a
process out of them: every op dispatched on its own left compiled code behind). The maps a
compiled program holds are given back when `specjax.api.generate.release_programs` drops it."""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax.api import forward as public_forward
from specjax.model import transformer
from specjax.model.cache import KVCache

from specjax.api.generate import release_programs
from specjax.io.checkpoint import random_model
from tests.support.tiny import llama_config

WIDTHS = (1, 9, 40)
DTYPES = ("float32", "bfloat16", "int8", "q8_0")


def _maps() -> int:
    return len(Path("/proc/self/maps").read_text().splitlines())


def _calls(dtypes=DTYPES):
    """Every (model, tokens, positions, cache, kernels) of the loop: a prefill-shaped call and
    cached calls of each width, in each of `dtypes`, with the kernels on and off."""
    base = random_model(llama_config(64, layers=3), seed=3)
    for dtype in dtypes:
        model = transformer.in_dtype(base, dtype)
        for width in WIDTHS:
            tokens = np.arange(width, dtype=np.int32)[None] % model.config.vocab_size
            positions = np.arange(width, dtype=np.int32)[None]
            cache = KVCache.init(model.config, 1, 64)
            for kernels in (True, False):
                yield model, tokens, positions, cache, kernels


def _run_all(dtypes=DTYPES) -> list[np.ndarray]:
    out = []
    for model, tokens, positions, cache, kernels in _calls(dtypes):
        logits, _ = specjax.forward(model.params, model.config, tokens, positions, cache,
                                    kernels=kernels)
        out.append(np.asarray(logits))
    return out


def test_forward_compiles_each_shape_once_and_the_maps_stay_bounded():
    first = _run_all()
    programs = public_forward._compiled._cache_size()
    # One program per (dtype, width, kernel setting): 4 x 3 x 2 (the setting is the config's).
    assert programs == len(DTYPES) * len(WIDTHS) * 2
    before = _maps()
    second = _run_all()
    assert public_forward._compiled._cache_size() == programs
    assert _maps() - before < 50, "a second pass over the same shapes left new memory maps"
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


def test_the_compiled_forward_gives_the_models_own_bits():
    """The public forward's program is the model's forward traced with the same config: the
    same bits as tracing `transformer.forward` under `jit` directly, kernels on and off."""
    import jax
    model = random_model(llama_config(64, layers=3), seed=4)
    tokens, positions = jnp.arange(9)[None], jnp.arange(9)[None]
    outputs = {}
    for kernels in (True, False):
        ours, _ = specjax.forward(model.params, model.config, tokens, positions, kernels=kernels)

        config = public_forward.run_config(model.config, kernels)

        def direct(params, tokens, positions):
            return transformer.forward(params, config, tokens, positions)[0]
        want = jax.jit(direct)(model.params, tokens, positions)
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(want))
        outputs[kernels] = np.asarray(ours)
    # The two settings are two programs (float32 rounding apart), not one program twice.
    if public_forward.kernels_of(True) is not None:
        assert not np.array_equal(outputs[True], outputs[False])


def test_release_programs_gives_the_programs_memory_maps_back():
    """Each compiled program keeps its JIT-linked code mapped while it lives (measured on the
    2-core Zen 3 host: the loop's 24 programs added 4,528 maps, about 190 a program);
    `release_programs` drops them all, and the maps with them (back to 100 above the start).
    The loop's float32 calls alone (6 programs) show it, at a quarter of the compiling."""
    release_programs()
    before = _maps()
    _run_all(("float32",))
    grown = _maps() - before
    assert grown > 6 * 20, f"6 programs added only {grown} maps: nothing to release"
    release_programs()
    assert _maps() - before < grown / 4, "the released programs' maps were not given back"
    assert public_forward._compiled._cache_size() == 0
