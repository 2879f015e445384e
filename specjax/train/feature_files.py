"""The target's features on disk (`eagle3.features(directory=)`): memory-mapped arrays
(`tapped.npy`, `final.npy`) and a record of the pass (`features.json`: its key, taps, batch and
the batches done), so that an interrupted pass resumes, a finished one is reused, a directory of
other features is refused, and a disk without room is refused before the first write."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

from specjax.model.transformer import Model
from specjax.train.state import TrainError


def open_pass(directory: Path, target, sequences, taps, dtype, batch: int, shapes: dict,
              final_only: bool):
    """(arrays by name, the pass's record, the batches done) for a pass in `directory`, new or
    resumed; the batches done are None when `final_only` reuses a finished pass of other taps
    or batch (its arrays, read-only, and its record, which names its taps)."""
    directory.mkdir(parents=True, exist_ok=True)
    meta_file = directory / "features.json"
    key = features_key(target, sequences, taps, dtype, batch)
    done, meta = 0, None
    if meta_file.exists():
        try:
            meta = json.loads(meta_file.read_text())
            done = int(meta["batches_done"]) if meta["key"] == key else -1
        except (ValueError, KeyError, TypeError):
            done = -1
        if done < 0 and final_only and finished_pass(meta, target, sequences, dtype):
            return {name: read_array(directory / f"{name}.npy")
                    for name in ("tapped", "final")}, meta, None
        if done < 0:
            raise TrainError(f"{directory} holds features of other sequences, taps, dtype "
                             f"or batch; use a new directory or remove it")
    mode = "r+" if done else "w+"
    check_room(directory, {f"{name}.npy": int(np.prod(shape)) * np.dtype(dtype).itemsize
                           for name, shape in shapes.items()})
    arrays = {name: np.lib.format.open_memmap(directory / f"{name}.npy", mode=mode,
                                              dtype=dtype, shape=shape)
              for name, shape in shapes.items()}
    return arrays, {"key": key, "taps": list(taps), "batch": batch, "batches_done": done}, done


def check_room(directory: Path, sizes: dict[str, int]) -> None:
    """Refuses to start when the disk holding `directory` cannot take the files of `sizes`
    (name: bytes) beyond what they already hold: a memory-mapped write to a full disk kills the
    process (SIGBUS) instead of raising an error."""
    held = 0
    for name in sizes:
        try:
            held += (directory / name).stat().st_blocks * 512
        except OSError:
            pass
    missing = sum(sizes.values()) - held
    free = shutil.disk_usage(directory).free
    if missing > free:
        raise TrainError(f"{directory}: the features need {missing / 2**30:.2f} GiB more and "
                         f"the disk has {free / 2**30:.2f} GiB free")


def read_array(path: Path) -> np.ndarray:
    """A finished pass's array, memory-mapped read-only; a damaged file is a named error."""
    try:
        return np.load(path, mmap_mode="r")
    except (OSError, ValueError) as e:
        raise TrainError(f"{path}: not a features array ({e})") from None


def finished_pass(meta, target: Model, sequences, dtype) -> bool:
    """Whether `meta` (a features.json) records a finished pass over `sequences` in `dtype`,
    with the taps and batch it names."""
    try:
        taps, batch, done = tuple(meta["taps"]), int(meta["batch"]), int(meta["batches_done"])
        return meta["key"] == features_key(target, sequences, taps, dtype, batch) and \
            done * batch >= len(sequences.length)
    except (KeyError, TypeError, ValueError):
        return False


def features_key(target: Model, sequences, taps, dtype, batch: int) -> str:
    h = hashlib.sha256(json.dumps([target.name, str(target.config), list(taps),
                                   np.dtype(dtype).name, batch]).encode())
    for array in (sequences.tokens, sequences.length, sequences.prompt_length):
        h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()[:16]
