"""The few-row kernels (`few_rows.cc`): built on first use, registered with XLA.

Two C++ XLA FFI custom calls for the CPU, for calls on a few tokens (decoding steps and verify
calls); `specjax.model.linear` decides when to use them:

- `product(x, w)` is `einsum("...I,OI->...O", x, w)` in float32, reading each weight once from
  memory whatever the number of rows (see the source's header for how);
- `attention(q, keys, values, mask, limit)` is `layers.attend` over a layer's whole cache
  buffer, reading only the slots below each row's limit, in place.

The source is compiled with the machine's C++ compiler (`$CXX`, else g++, else c++) for the
CPU it runs on (-march=native), against the FFI headers that ship with jaxlib, once per source,
compiler, jaxlib and CPU: the library is cached as <cache>/kernels/few_rows-<key>.so, where
<cache> is $SPECJAX_CACHE or ~/.cache/specjax. A build takes about 2 s. Without a compiler the
build fails, `available()` is False with a warning that says why, and every product stays
XLA's: the same numbers up to float32 rounding, slower verify calls.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxlib

SOURCE = Path(__file__).with_name("few_rows.cc")
TARGET = "specjax_few_rows"
ATTENTION_TARGET = "specjax_few_query_attention"
FLAGS = ("-O3", "-march=native", "-std=c++17", "-fPIC", "-shared")


class BuildError(RuntimeError):
    """The kernels could not be compiled here."""


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def _cpu() -> str:
    """What -march=native depends on: the CPU's model and feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    wanted = ("model name", "flags", "Features", "CPU part")
    return "\n".join(sorted({line for line in lines if line.split(":")[0].strip() in wanted}))


def build(cache_dir: Path | None = None) -> Path:
    """Compiles the kernels if no library for this source, compiler, jaxlib and CPU is cached;
    returns the library's path. Raises BuildError with the compiler's message."""
    compiler = _compiler()
    if compiler is None:
        raise BuildError("no C++ compiler found (set $CXX, or install g++)")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256("\0".join([SOURCE.read_text(), " ".join(FLAGS), version,
                                    jaxlib.__version__, _cpu()]).encode()).hexdigest()[:16]
    cache_dir = Path(cache_dir or os.environ.get("SPECJAX_CACHE")
                     or Path.home() / ".cache" / "specjax") / "kernels"
    library = cache_dir / f"few_rows-{key}.so"
    if library.exists():
        return library
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Built under a temporary name and renamed: two processes building at once both succeed.
    with tempfile.TemporaryDirectory(dir=cache_dir) as scratch:
        partial = Path(scratch) / library.name
        result = subprocess.run([compiler, *FLAGS, f"-I{jax.ffi.include_dir()}", str(SOURCE),
                                 "-o", str(partial)], capture_output=True, text=True)
        if result.returncode != 0:
            raise BuildError(f"{compiler} failed on {SOURCE}:\n{result.stderr[-2000:]}")
        os.replace(partial, library)
    return library


@functools.cache
def available() -> bool:
    """Builds (or finds) the kernels and registers them with XLA, once per process. False, with
    a warning, when they cannot be built or loaded here."""
    try:
        library = ctypes.cdll.LoadLibrary(str(build()))
        for target in (TARGET, ATTENTION_TARGET):
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, target)),
                                        platform="cpu")
    except (BuildError, OSError) as error:
        warnings.warn(f"specjax: the few-row kernels are not available, so few-token calls use "
                      f"XLA's products and attention (slower): {error}", RuntimeWarning,
                      stacklevel=2)
        return False
    return True


@jax.custom_jvp
def product(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [..., I] float32, w [O, I] float32 -> [..., O] float32, on the CPU (needs
    `available()`). Differentiable: its derivative is XLA's (the kernel has no transpose)."""
    out = jax.ShapeDtypeStruct((*x.shape[:-1], w.shape[0]), jnp.float32)
    return jax.ffi.ffi_call(TARGET, out, vmap_method="sequential")(x, w)


@product.defjvp
def _product_jvp(primals, tangents):
    (x, w), (dx, dw) = primals, tangents
    return product(x, w), (jnp.einsum("...I,OI->...O", dx, w)
                           + jnp.einsum("...I,OI->...O", x, dw))


def attention(q: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array,
              limit: jax.Array) -> jax.Array:
    """Grouped-query attention of q [B, T, N, H] to a cache's keys [B, K, H, S] and values
    [B, K, S, H] (float32), where mask [B, T, S] says which slots each query reads and no slot
    at or past limit [B] is read: `layers.attend` on the prefix, without copying it. -> [B, T,
    N, H] float32. Needs `available()`; not differentiable (decoding only)."""
    out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
    return jax.ffi.ffi_call(ATTENTION_TARGET, out, vmap_method="sequential")(
        q, keys, values, mask, limit.astype(jnp.int32))
