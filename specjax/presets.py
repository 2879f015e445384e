"""What `specjax generate` and `specjax bench` share: the model presets (which checkpoints
`--preset smollm2` names), the model arguments that choose and load them, the error a
command-line mistake raises, and JAX's persistent compilation cache.

Layer: above the public API and file I/O (it may import `specjax.io`, `specjax.mesh` and
`specjax.api`), below both command-line front ends (`specjax.cli`, `specjax.bench`), which
import it; it imports neither of them.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
from pathlib import Path

import jax

from specjax import kernels
from specjax import mesh as meshes
from specjax.api.methods import CLASSES
from specjax.io.checkpoint import load
from specjax.io.fetch import FetchError, cache_root, fetch
from specjax.model.config import DTYPES

WEIGHTS = Path(__file__).resolve().parent.parent / "weights"
DEFAULT_PRESET = "tiny-llama"          # bench's default
GENERATE_PRESET = "smollm2"            # generate's, unless $SPECJAX_PRESET names another
TINY_NOTE = ("the tiny pair shows that every method is exact, not how fast it is "
             "(--preset smollm2 runs the real model)")


class CLIError(ValueError):
    """A command-line mistake that no library function catches (missing draft, no prompt...)."""


@dataclasses.dataclass(frozen=True)
class Preset:
    target: str             # a directory under weights/, or "fetch:<name>" for specjax.io.fetch
    draft: str | None       # a directory under weights/ (may not exist for fetched targets)
    heads: str | None = None    # Medusa heads under weights/, for method medusa
    drafter: str | None = None  # an EAGLE drafter under weights/, for method eagle


PRESETS = {
    "tiny-llama": Preset("llama-target", "llama-draft", "llama-medusa", "llama-eagle"),
    "tiny-gpt2": Preset("gpt2-target", "gpt2-draft"),
    "smollm2": Preset("fetch:smollm2", "smollm2-draft", "smollm2-medusa", "smollm2-eagle"),
}


GENERATE_DEFAULT_HELP = (f"{GENERATE_PRESET}, fetched on first use, or $SPECJAX_PRESET; offline, "
                         "the tiny pair")


def add_model_arguments(parser: argparse.ArgumentParser,
                        default_help: str = DEFAULT_PRESET) -> None:
    group = parser.add_argument_group("models")
    group.add_argument("--preset", choices=sorted(PRESETS),
                       help=f"embedded or fetched model pair (default: {default_help}; "
                            "tiny-* work offline)")
    group.add_argument("--target", metavar="DIR|FILE.gguf",
                       help="target checkpoint: a Hugging Face directory or a GGUF file")
    group.add_argument("--draft", metavar="DIR|FILE.gguf",
                       help="draft checkpoint for speculative sampling (same tokenizer)")
    group.add_argument("--heads", metavar="DIR",
                       help="Medusa heads for method medusa (default: the preset's)")
    group.add_argument("--drafter", metavar="DIR",
                       help="an EAGLE drafter for method eagle (default: the preset's)")
    group.add_argument("--dtype", choices=DTYPES, default="float32",
                       help="the weights' dtype (default: float32); int8: 8-bit matrices "
                            "(GGUF Q8_0's layout), float32 activations; q8_0: the same "
                            "matrices, activations quantised at each product (llama.cpp's Q8_0)")
    group.add_argument("--drafter-dtype", choices=DTYPES,
                       help="the dtype the draft model, Medusa heads or EAGLE drafter runs in "
                            "(default: --dtype)")
    group.add_argument("--mesh", metavar="data=N,model=M",
                       help="run on a device mesh: rows split over N devices, the target's "
                            "heads, MLP and vocabulary over M (default: one device; on a CPU "
                            "set XLA_FLAGS=--xla_force_host_platform_device_count=N*M)")


def generate_preset(args) -> tuple[str | None, str | None]:
    """The preset `generate` runs when no --preset or --target names one, and a note for the
    user, or (args.preset, None) when one is named. The default is $SPECJAX_PRESET, else
    SmolLM2, fetched on first use; when it cannot be fetched (offline, no package index), the
    tiny pair, with a note that says why."""
    if args.preset or args.target:
        return args.preset, None
    name = os.environ.get("SPECJAX_PRESET", "").strip() or GENERATE_PRESET
    if name not in PRESETS:
        raise CLIError(f"$SPECJAX_PRESET must be one of {', '.join(sorted(PRESETS))}; "
                       f"got {name!r}")
    preset = PRESETS[name]
    if preset.target.startswith("fetch:"):
        try:
            fetch(preset.target.removeprefix("fetch:"))
        except FetchError as error:
            return "tiny-llama", (f"{name} could not be fetched ({error}); running the tiny "
                                  f"pair instead: {TINY_NOTE}")
    return name, None


def parse_mesh(text: str | None) -> tuple[int, int] | None:
    """--mesh data=N,model=M -> (N, M); an axis left out is 1; None -> None (one device)."""
    if text is None:
        return None
    sizes = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in ("data", "model") or name in sizes:
            raise CLIError(f"--mesh takes data=N,model=M (each axis once), got {text!r}")
        try:
            sizes[name] = int(value)
        except ValueError:
            sizes[name] = 0
        if sizes[name] < 1:
            raise CLIError(f"--mesh {name} must be an integer >= 1, got {value.strip()!r}")
    return sizes.get("data", 1), sizes.get("model", 1)


@functools.lru_cache(maxsize=None)
def make_mesh(shape: tuple[int, int] | None):
    """The `specjax.mesh.make_mesh` of a parsed --mesh, or None (built once per shape: the bench
    asks for it at every run)."""
    if shape is None:
        return None
    return meshes.make_mesh(*shape)


def load_model(path, dtype: str, mesh=None, shard: bool = True):
    """`specjax.load` onto `mesh` if given: split like a target, or replicated (a draft)."""
    if mesh is None or shard:
        return load(path, dtype=dtype, mesh=mesh)
    model = load(path, dtype=dtype)
    params = meshes.shard_params(model.params, model.config, mesh, shard=False)
    return dataclasses.replace(model, params=params)


def model_paths(args, want_draft: bool) -> tuple[Path, Path | None, str]:
    """The target and draft checkpoints the arguments name, and a note on why there is no draft
    ("" when there is one or none was wanted)."""
    if args.target:
        if args.preset:
            raise CLIError("give either --preset or --target/--draft, not both")
        draft = Path(args.draft) if args.draft and want_draft else None
        return Path(args.target), draft, "" if draft or not want_draft else "no --draft given"
    name = args.preset or DEFAULT_PRESET
    preset = PRESETS[name]
    if preset.target.startswith("fetch:"):
        target = fetch(preset.target.removeprefix("fetch:"))
    else:
        target = _embedded(preset.target)
    if not want_draft:
        return target, None, ""
    if args.draft:
        return target, Path(args.draft), ""
    draft = WEIGHTS / preset.draft
    if preset.target.startswith("fetch:") and not draft.exists():
        return target, None, f"preset {name} has no draft model ({draft} does not exist)"
    return target, _embedded(preset.draft), ""


def heads_path(args) -> tuple[Path | None, str]:
    """The Medusa heads directory the arguments name, or None and why there is none."""
    return _beside_target(args, args.heads, "heads", "Medusa heads", "heads")


def drafter_path(args) -> tuple[Path | None, str]:
    """The EAGLE drafter directory the arguments name, or None and why there is none."""
    return _beside_target(args, args.drafter, "drafter", "EAGLE drafter", "drafter")


# The methods that read --drafter, and the kind of drafter each takes.
DRAFTER_KINDS = {m.name: (m.kind(), m.what) for m in CLASSES if m.loads == "drafter"}


def load_drafters(args, methods) -> tuple[dict, dict]:
    """The drafters `methods` read (--drafter's directory or the preset's, which holds an
    EAGLE drafter or a DFlash drafter): ({method: drafter}, {method: why it has none}) over
    the methods of `DRAFTER_KINDS` that are asked for. --drafter without such a method is a
    CLIError."""
    wanted = [m for m in DRAFTER_KINDS if m in methods]
    if not wanted:
        if args.drafter:
            raise CLIError(f"--drafter applies to --method {' or '.join(DRAFTER_KINDS)} (or "
                           f"--methods with one of them)")
        return {}, {}
    path, missing = drafter_path(args)
    loaded = load(path) if path is not None else None
    found, why = {}, {}
    for method in wanted:
        kind, what = DRAFTER_KINDS[method]
        if isinstance(loaded, kind):
            found[method] = loaded
        else:
            why[method] = missing if loaded is None else _mismatch(args, path, loaded, what)
    return found, why


def _mismatch(args, path: Path, loaded, what: str) -> str:
    """Why a loaded drafter directory does not serve a method: what it holds instead, and
    whether the preset chose it."""
    holds = next((m.what for m in CLASSES if m.kind() is type(loaded)),
                 type(loaded).__name__)
    if args.drafter:
        return f"{path} holds {holds}, not {what}"
    return f"preset {args.preset or DEFAULT_PRESET}'s drafter ({path}) holds {holds}, not {what}"


def _beside_target(args, given, field: str, what: str, flag: str) -> tuple[Path | None, str]:
    """A directory that works beside the target (heads, a drafter): the one given, else the
    preset's, or None and why there is none."""
    if given:
        return Path(given), ""
    if args.target:
        return None, f"no --{flag} given"
    name = args.preset or DEFAULT_PRESET
    directory = getattr(PRESETS[name], field)
    if directory is None:
        return None, f"preset {name} has no {what}"
    if not (WEIGHTS / directory / "config.json").exists():
        return None, f"preset {name}'s {what} ({WEIGHTS / directory}) do not exist"
    return WEIGHTS / directory, ""


def _embedded(name: str) -> Path:
    path = WEIGHTS / name
    if not (path / "config.json").exists():
        raise CLIError(f"embedded checkpoint {path} is missing; it is trained by "
                       "scripts/train.py (see weights/README.md), or pass --target/--draft")
    return path


def enable_compile_cache() -> None:
    """JAX's persistent compilation cache, so that a rerun does not recompile: <cache>/xla/KEY,
    where <cache> is $SPECJAX_CACHE or ~/.cache/specjax and KEY is the kernels' build key
    (`specjax.kernels.build_key`: their source, compiler, jaxlib, the CPU's model and features;
    JAX's own key already holds the program, its dtypes and XLA's flags), so a program compiled
    on another CPU or against other kernels is never loaded. SPECJAX_COMPILE_CACHE=DIR moves it
    (to DIR/KEY), SPECJAX_COMPILE_CACHE=off turns it off."""
    setting = os.environ.get("SPECJAX_COMPILE_CACHE")
    if setting is not None and setting.strip().lower() in ("", "0", "off", "no", "false"):
        return
    root = Path(setting).expanduser() if setting else cache_root() / "xla"
    directory = root / kernels.build_key()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return   # a read-only home is no reason to fail; compile every time instead
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
