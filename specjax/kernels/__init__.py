"""The CPU kernels as a plug-in: builds `few_rows.cc` with the machine's C++ compiler and
registers its XLA FFI targets; their calls (`ffi.KERNELS`, a `specjax.model.linear.Kernels`)
are data that a program's config carries (`ModelConfig.kernels`), and the model's one
interface to kernels, `specjax.model.linear`, decides which calls they serve.

    from specjax import kernels
    kernels.ensure()          # True once built and registered; False (with a warning) if not
    kernels.plugin()          # ffi.KERNELS where ensure() is True, else None

`specjax.generate` and `specjax.forward` call `plugin()` when their `kernels` run option is on
(the default, unless `SPECJAX_KERNELS=off` or `--no-kernels`). It does nothing on a GPU or TPU backend: the kernels
are for the CPU, and programs for other platforms never contain them.

The source is compiled for the CPU it runs on (-march=native), against the FFI headers that ship
with jaxlib, once per source, compiler, jaxlib and CPU: the library is cached as
<cache>/kernels/few_rows-<key>.so, where <cache> is `specjax.io.fetch.cache_root()`
($SPECJAX_CACHE or ~/.cache/specjax). Without a compiler the build fails, `ensure()` is False
with a warning that says why, and every product stays XLA's: the same numbers up to float32
rounding, slower verify calls.

`ffi` holds the custom calls by target name. Layer: above the file I/O it reads its cache root
from, below the API that calls it; the core never imports it (it may not import subprocess or
ctypes).
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
import jaxlib

from specjax.io.fetch import cache_root
from specjax.kernels import ffi
from specjax.model.linear import Kernels

__all__ = ["BuildError", "SOURCE", "build", "build_key", "ensure", "load", "paths", "plugin"]

SOURCE = Path(__file__).with_name("few_rows.cc")
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-std=c++17", "-fPIC", "-shared")


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


@functools.cache
def build_key() -> str:
    """What the kernels' library depends on, hashed: their source, the flags, the compiler's
    version, jaxlib's and the CPU's model and features ("no-compiler" without a compiler, then
    still the CPU's). The persistent compilation cache is kept apart per key
    (`specjax.presets.enable_compile_cache`): a program compiled for another CPU or against
    another build of the kernels is never loaded."""
    compiler = _compiler()
    version = (subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
               if compiler else "no-compiler")
    return hashlib.sha256("\0".join([SOURCE.read_text(), " ".join(FLAGS), version,
                                     jaxlib.__version__, _cpu()]).encode()).hexdigest()[:16]


def build(cache_dir: Path | None = None) -> Path:
    """Compiles the kernels if no library for this source, compiler, jaxlib and CPU is cached
    under `cache_dir` (default `cache_root()`); returns the library's path. Raises BuildError
    with the compiler's message."""
    compiler = _compiler()
    if compiler is None:
        raise BuildError("no C++ compiler found (set $CXX, or install g++)")
    key = build_key()
    directory = Path(cache_dir or cache_root()) / "kernels"
    library = directory / f"few_rows-{key}.so"
    if library.exists():
        return library
    directory.mkdir(parents=True, exist_ok=True)
    # Built under a temporary name and renamed: two processes building at once both succeed.
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        partial = Path(scratch) / library.name
        result = subprocess.run([compiler, *FLAGS, f"-I{jax.ffi.include_dir()}", str(SOURCE),
                                 "-o", str(partial)], capture_output=True, text=True)
        if result.returncode != 0:
            raise BuildError(f"{compiler} failed on {SOURCE}:\n{result.stderr[-2000:]}")
        os.replace(partial, library)
    return library


def load(cache_dir: Path | None = None) -> bool:
    """Builds (or finds) the kernels and registers them with XLA's CPU backend. False, with a
    warning, when they cannot be built or loaded here; nothing on a non-CPU backend."""
    if jax.default_backend() != "cpu":
        return False
    try:
        library = ctypes.cdll.LoadLibrary(str(build(cache_dir)))
        _loaded.append(library)
        for target in ffi.TARGETS:
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, target)),
                                        platform="cpu")
    except (BuildError, OSError) as error:
        warnings.warn(f"specjax: the few-row kernels are not available, so few-token calls use "
                      f"XLA's products and attention (slower): {error}", RuntimeWarning,
                      stacklevel=2)
        return False
    return True


# The library `load` registered (the last one, if it was called more than once).
_loaded: list = []


def paths() -> dict[str, str]:
    """Which instructions the built kernels multiply with, by dtype, as this CPU's build chose
    them (-march=native): bfloat16 "avx512-bf16" (VDPBF16PS pairs) or "widened"; q8_0
    "avx512-vnni" (VPDPBUSD on packed weights), "avx-vnni" (the same in 256 bits), "avx2"
    (VPMADDUBSW on packed weights) or "per-output". {} before `ensure()` succeeds.
    `bench` records it with the machine."""
    if not ensure() or not _loaded:
        return {}
    library = _loaded[-1]
    named = {}
    for dtype, symbol in (("bfloat16", "specjax_bf16_path"), ("q8_0", "specjax_q8_0_path")):
        function = getattr(library, symbol)
        function.restype = ctypes.c_char_p
        named[dtype] = function().decode()
    return named


@functools.cache
def ensure() -> bool:
    """`load()` once per process: whether the kernels are registered."""
    return load()


def plugin() -> Kernels | None:
    """The kernels' calls for a program's config to name (`ModelConfig.kernels`): `ffi.KERNELS`
    once built and registered (`ensure`), None where they cannot be (XLA's formulations)."""
    return ffi.KERNELS if ensure() else None
