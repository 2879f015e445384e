"""A target's own continuations of a prompt set, written as resumable shards with their
provenance: the data a drafter trains on (`python -m specjax train data`).

    from specjax.train import data
    data.write(target, prompts, "runs/data", max_new_tokens=256, temperature=1.0, top_p=0.9,
               shard_size=256, held_out=8)
    sequences, held_out = data.read("runs/data")     # eagle3.Sequences, held-out prompts

The directory holds `data.json` (what made it: the target, the prompts' digest, the settings,
the held-out prompts as token ids, and each finished shard's prompt range and token count) and
`shard-NNNNN.npz` (an `eagle3.Sequences` each). A shard is written under a temporary name and
renamed, then recorded in data.json, so an interrupted run leaves only finished shards; running
the same request again skips them and makes the rest. A request that differs (another target,
other prompts or settings) into a directory that holds shards is refused. Rows are sampled
each with its own seed (`seed` + the prompt's index), so the shards do not depend on the batch
size or on where a run was interrupted.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

from specjax.api.checks import encode_prompts
from specjax.heads.shared import tokenizer_digest
from specjax.model.transformer import Model
from specjax.train.eagle3 import Sequences, TrainError, continuations
from specjax.train.state import duration

__all__ = ["FORMAT", "Progress", "import_shards", "read", "write"]

FORMAT = "specjax.train.data/1"


class Progress:
    """Prompts and tokens done, tokens per second and the time left: a line rewritten in place
    on a terminal, a plain line per update otherwise (a log)."""

    def __init__(self, total: int, stream=None):
        self.total, self.stream = total, stream or sys.stderr
        self.started, self.tty = time.time(), self.stream.isatty()

    def update(self, done: int, tokens: int, first: int = 0) -> None:
        """`done` prompts of `total` finished, `tokens` generated, `first` of them finished
        before this run started (they take no time here)."""
        elapsed = max(time.time() - self.started, 1e-9)
        rate = tokens / elapsed
        left = (self.total - done) * elapsed / (done - first) if done > first else 0.0
        line = (f"data: {done}/{self.total} prompts, {tokens:,} tokens, {rate:,.0f} tokens/s, "
                f"{duration(left)} left")
        if self.tty:
            self.stream.write("\r" + line + ("\n" if done == self.total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def write(target: Model, prompts, directory, *, max_new_tokens: int = 64,
          temperature: float = 0.0, top_p: float = 1.0, seed: int = 0, shard_size: int = 256,
          batch: int = 64, held_out: int = 0, progress: Progress | None = None) -> Path:
    """The target's continuations of all but the last `held_out` of `prompts` (texts or token
    ids), in shards of `shard_size` prompts under `directory`; the held-out prompts are kept
    (as token ids) in data.json for evaluation. Resumes an interrupted run of the same request.
    Returns the directory."""
    for name, value in (("shard_size", shard_size), ("max_new_tokens", max_new_tokens)):
        if not isinstance(value, int) or value < 1:
            raise TrainError(f"{name} must be an integer >= 1, got {value!r}")
    if not isinstance(held_out, int) or not 0 <= held_out < len(prompts):
        raise TrainError(f"held_out must be in [0, {len(prompts)}) for {len(prompts)} prompts, "
                         f"got {held_out!r}")
    rows = encode_prompts(target, list(prompts))
    train, kept = rows[:len(rows) - held_out], rows[len(rows) - held_out:]
    directory = Path(directory)
    settings = dict(max_new_tokens=max_new_tokens, temperature=float(temperature),
                    top_p=float(top_p), seed=seed, shard_size=shard_size)
    request = {"format": FORMAT, "target": target.name,
               "prompts_sha256": hashlib.sha256(json.dumps(rows).encode()).hexdigest(),
               "prompts": len(train), "settings": settings, "held_out": kept}
    record = _start(directory, request)
    done = {s["file"] for s in record["shards"]}
    progress = progress or Progress(len(train))
    first = sum(s["prompts"][1] - s["prompts"][0] for s in record["shards"])
    tokens = sum(s["tokens"] for s in record["shards"])
    for index, start in enumerate(range(0, len(train), shard_size)):
        name = f"shard-{index:05d}.npz"
        if name in done:
            continue
        part = train[start:start + shard_size]
        sequences = continuations(target, part, max_new_tokens=max_new_tokens,
                                  temperature=temperature, top_p=top_p, seed=seed + start,
                                  batch=batch)
        generated = int(np.sum(sequences.length - sequences.prompt_length))
        _save(directory / name, sequences)
        record["shards"].append({"file": name, "prompts": [start, start + len(part)],
                                 "tokens": generated})
        _write_json(directory / "data.json", record)
        tokens += generated
        progress.update(start + len(part), tokens, first)
    return directory


def import_shards(source, target: Model, directory, *, max_length: int = 384,
                  held_out_setting: str = "greedy", leave_out: tuple[str, ...] = ()) -> Path:
    """Continuations made by `scripts/train.py` as a `write` directory, so that the trainers
    read them with `--data`: the shards of `eagle-data` (a directory, as `data/eagle2/smollm2`,
    the shipped SmolLM2 EAGLE drafter's data: tokens, document starts, prompt lengths and a
    held-out flag per document) or one sequence set of `medusa-data` (a file, as
    `data/eagle/llama.npz`, the tiny drafters' data), each beside its provenance SOURCE.json.
    Documents are cut at `max_length` tokens. The held-out documents are left out of the
    training set; their prompts, once each, from the `held_out_setting` documents, are the
    held-out prompts. A sequence set holds out the scripts' rule: document i when i % 16 == 15,
    an original-text document with its generated twin, a repeated document kept once; its
    documents of the kinds in `leave_out` (e.g. "text-original") are then dropped, which
    changes no held-out prompt. The source's tokenizer digest, when recorded, must be the
    target's."""
    source, directory = Path(source), Path(directory)
    files, recorded = _import_sources(source, target, leave_out)
    if not isinstance(max_length, int) or max_length < 2:
        raise TrainError(f"max_length must be an integer >= 2, got {max_length!r}")
    imported = _imported_parts(files, source.is_file(), target, max_length, held_out_setting,
                               leave_out)
    request = {"format": FORMAT, "target": target.name,
               "prompts_sha256": imported.digest.hexdigest(), "prompts": imported.prompts,
               "settings": {"imported_from": str(source), "max_length": max_length,
                            "generated_by": recorded.get("generated_by"),
                            **({"left_out": sorted(leave_out)} if leave_out else {})},
               "held_out": [list(p) for p in imported.held]}
    _write_parts(directory, _start(directory, request), imported.parts)
    return directory


def _import_sources(source: Path, target: Model, leave_out) -> tuple[list[Path], dict]:
    """(the files to import, their provenance as recorded beside them), checked: files there
    are, kinds are left out of a sequence set only, and the tokenizer is the target's."""
    if source.is_file():
        files, provenance = [source], source.with_suffix(".json")
    else:
        files = sorted(source.glob("shard-[0-9][0-9][0-9].npz"))
        provenance = source.with_name(source.name + ".json")
    if not files:
        raise TrainError(f"{source}: no shard-NNN.npz of `scripts/train.py eagle-data`")
    if leave_out and not source.is_file():
        raise TrainError(f"{source}: leaving kinds out applies to a sequence set (a .npz of "
                         f"`medusa-data`), whose documents have kinds")
    recorded = {}
    if provenance.is_file():
        try:
            recorded = json.loads(provenance.read_text())
        except ValueError as e:
            raise TrainError(f"{provenance}: cannot read it ({e})") from None
    digest = recorded.get("tokenizer_sha256")
    if digest and digest != tokenizer_digest(target.tokenizer):
        raise TrainError(f"{source} was made with another tokenizer than {target.name}'s "
                         f"(its {provenance.name} records {digest[:12]}...)")
    return files, recorded


class Imported(NamedTuple):
    """What `import_shards` reads from its files (`_imported_parts`)."""
    parts: list          # each file's (name, its documents cut at max_length as `Sequences`,
    #                      the number of its first prompt)
    held: dict           # the held-out prompts (token tuples), in order
    prompts: int         # the prompts counted
    digest: object       # the files' sha256


def _imported_parts(files, sequence_set: bool, target: Model, max_length: int,
                    held_out_setting: str, leave_out) -> Imported:
    """The files' training documents, held-out prompts, count and digest (`Imported`)."""
    parts, held, first, contents = [], {}, 0, hashlib.sha256()
    for file in files:
        contents.update(file.read_bytes())
        documents, prompt_length, out, setting = (
            _sequence_set(file, leave_out) if sequence_set else _eagle_data_shard(file))
        if max((int(d.max(initial=0)) for d in documents), default=0) >= target.config.vocab_size:
            raise TrainError(f"{file} holds token ids past {target.name}'s vocabulary")
        for doc, n, gone, name in zip(documents, prompt_length, out, setting):
            if gone and name == held_out_setting:
                held.setdefault(tuple(int(t) for t in doc[:n]), None)
        keep = [i for i in range(len(documents)) if not out[i]]
        rows = np.zeros((len(keep), max_length), np.int32)
        length = np.zeros(len(keep), np.int32)
        for row, i in enumerate(keep):
            doc = documents[i][:max_length]
            rows[row, :len(doc)], length[row] = doc, len(doc)
        parts.append((file.name, Sequences(rows, length, np.minimum(
            prompt_length[keep], length).astype(np.int32)), first))
        first += len(keep)
    return Imported(parts, held, first, contents)


def _write_parts(directory: Path, record: dict, parts) -> None:
    """The parts as shards, each recorded in data.json as it is written (skipping those a
    record already holds)."""
    done = {s["file"] for s in record["shards"]}
    for index, (name, sequences, start) in enumerate(parts):
        shard = f"shard-{index:05d}.npz"
        if shard in done:
            continue
        _save(directory / shard, sequences)
        record["shards"].append({"file": shard, "prompts": [start, start + len(sequences.length)],
                                 "tokens": int(np.sum(sequences.length - sequences.prompt_length)),
                                 "from": name})
        _write_json(directory / "data.json", record)



# `scripts/train.py medusa-data`'s held-out rule: one document in this many.
SEQUENCE_SET_HELD_OUT_EVERY = 16


def _eagle_data_shard(file: Path):
    """An `eagle-data` shard's documents, prompt lengths, held-out flags and setting names."""
    try:
        with np.load(file) as shard:             # never pickles (allow_pickle is off)
            tokens, starts = shard["tokens"].astype(np.int32), shard["starts"]
            prompt_length, out = shard["prompt_length"], shard["held_out"].astype(bool)
            setting = shard["setting_names"][shard["setting"]]
        _check_starts(tokens, starts, prompt_length, out, setting)
    except (OSError, KeyError, ValueError, IndexError, TypeError) as e:
        raise TrainError(f"{file}: not an eagle-data shard ({e})") from None
    return [tokens[a:b] for a, b in zip(starts[:-1], starts[1:])], prompt_length, out, setting


def _sequence_set(file: Path, leave_out: tuple[str, ...] = ()):
    """A `medusa-data` sequence set's documents, prompt lengths, held-out flags (the scripts'
    rule, in `import_shards`) and settings (all greedy); a repeated document is dropped, and
    so are the documents of the kinds in `leave_out` (after the rule has run)."""
    try:
        with np.load(file) as saved:             # never pickles (allow_pickle is off)
            tokens, starts = saved["tokens"].astype(np.int32), saved["starts"]
            prompt_length = saved["prompt_length"]
            kinds = [str(k) for k in saved["kind_names"][saved["kind"]]]
        _check_starts(tokens, starts, prompt_length, kinds, kinds)
    except (OSError, KeyError, ValueError, IndexError, TypeError) as e:
        raise TrainError(f"{file}: not a sequence set of `scripts/train.py medusa-data` "
                         f"({e})") from None
    unknown = sorted(set(leave_out) - set(kinds))
    if unknown:
        raise TrainError(f"{file} has no documents of kind {unknown[0]!r}; its kinds are "
                         f"{', '.join(sorted(set(kinds)))}")
    documents, lengths, out, seen, held_prompts = [], [], [], set(), set()
    for i, kind in enumerate(kinds):
        doc, n = tokens[starts[i]:starts[i + 1]], int(prompt_length[i])
        if kind == "text-original":          # after every generated document: with its twin
            gone = doc[:n].tobytes() in held_prompts
        else:
            gone = i % SEQUENCE_SET_HELD_OUT_EVERY == SEQUENCE_SET_HELD_OUT_EVERY - 1
            if gone:
                held_prompts.add(doc[:n].tobytes())
        if (kind, doc.tobytes()) not in seen and kind not in leave_out:
            seen.add((kind, doc.tobytes()))
            documents.append(doc), lengths.append(n), out.append(gone)
    return (documents, np.array(lengths, np.int32), np.array(out, bool),
            ["greedy"] * len(documents))


def _check_starts(tokens, starts, prompt_length, out, setting) -> None:
    """Raises ValueError unless the documents' starts cover the tokens in order and every
    per-document field has one entry a document."""
    if not (len(starts) == len(prompt_length) + 1 == len(out) + 1 == len(setting) + 1
            and starts[0] == 0 and starts[-1] == len(tokens)
            and np.all(np.diff(starts) >= 0) and np.all(prompt_length >= 0)):
        raise ValueError("its documents' starts and fields do not agree")


def read(directory, target: Model | None = None) -> tuple[Sequences, list[list[int]]]:
    """The shards of a `write` directory as one `Sequences` (in prompt order, padded to the
    longest), and its held-out prompts as token ids. With `target`, the data must be that
    target's."""
    directory = Path(directory)
    record = _record(directory)
    if record is None:
        raise TrainError(f"{directory}: no data.json of {FORMAT} (made by `train data`)")
    if target is not None and record["target"] != target.name:
        raise TrainError(f"{directory} holds continuations of {record['target']!r}, not of "
                         f"the target {target.name!r}")
    parts = []
    for shard in sorted(record["shards"], key=lambda s: s["prompts"][0]):
        try:
            with np.load(directory / shard["file"]) as saved:
                parts.append(Sequences(saved["tokens"], saved["length"], saved["prompt_length"]))
        except (OSError, KeyError, ValueError) as e:
            raise TrainError(f"{directory / shard['file']}: cannot read it ({e})") from None
    covered = sum(len(p.length) for p in parts)
    if covered != record["prompts"]:
        raise TrainError(f"{directory}: its shards hold {covered} of {record['prompts']} "
                         f"prompts; run `train data` again with the same request to finish it")
    width = max(p.tokens.shape[1] for p in parts)
    tokens = np.concatenate([np.pad(p.tokens, ((0, 0), (0, width - p.tokens.shape[1])))
                             for p in parts])
    return (Sequences(tokens, np.concatenate([p.length for p in parts]),
                      np.concatenate([p.prompt_length for p in parts])),
            [list(map(int, p)) for p in record["held_out"]])


def _start(directory: Path, request: dict) -> dict:
    """data.json for `request`: the one in `directory` if it is the same request (its shards
    are kept), a new one if there is none; another request's is refused."""
    record = _record(directory)
    if record is not None:
        mine = {k: v for k, v in record.items() if k != "shards"}
        if mine != json.loads(json.dumps(request)):
            changed = sorted(k for k in request if mine.get(k) != json.loads(json.dumps(
                request[k])))
            raise TrainError(f"{directory} holds data of another request (it differs in "
                             f"{', '.join(changed)}); use another directory")
        return record
    directory.mkdir(parents=True, exist_ok=True)
    record = dict(request, shards=[])
    _write_json(directory / "data.json", record)
    return record


def _record(directory: Path) -> dict | None:
    try:
        record = json.loads((directory / "data.json").read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise TrainError(f"{directory / 'data.json'}: cannot read it ({e})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise TrainError(f"{directory / 'data.json'}: not {FORMAT}")
    return record


def _save(path: Path, sequences: Sequences) -> None:
    """Written under a temporary name and renamed: a shard on disk is a whole one."""
    try:
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".npz", delete=False) as handle:
            np.savez(handle, tokens=sequences.tokens, length=sequences.length,
                     prompt_length=sequences.prompt_length)
        os.replace(handle.name, path)
    except OSError as e:       # a full disk, a directory that went away
        raise TrainError(f"{path}: cannot write it ({e.strerror or e})") from None


def _write_json(path: Path, value: dict) -> None:
    partial = path.with_suffix(".json.tmp")
    try:
        partial.write_text(json.dumps(value, indent=1) + "\n")
        os.replace(partial, path)
    except OSError as e:
        raise TrainError(f"{path}: cannot write it ({e.strerror or e})") from None
