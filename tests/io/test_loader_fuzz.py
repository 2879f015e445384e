"""Fuzzing the checkpoint readers: a damaged file loads as the original or names itself.

One tiny random Llama is written twice, once per module: as a sharded safetensors checkpoint
directory by `specjax.io.checkpoint.save` (config.json, two shards and their index, tokenizer.json,
generation_config.json, tokenizer_config.json) and as a GGUF file by the gguf package's
GGUFWriter. Hypothesis then damages one file at a time: truncates it, overwrites a few bytes,
inserts garbage, or sets a length, count or number in a header to a huge value. Every case must
finish within TIME_LIMIT seconds (a hang fails the test instead of hanging it) and either raise
`CheckpointError` whose message names the damaged file (the .gguf, or the checkpoint directory),
or load a model whose weights are bit for bit the original's. The one exception: a byte
overwritten inside tensor data is another weight, so each such byte may change one weight (and
when nothing else was touched, the config must be the original's).

A successful load may still bring a different config or tokenizer: a digit changed in
rope_theta or in a token's text is a different valid file, not a broken one.

The published drafters are fuzzed the same way (written by `save_drafter` / `save_heads` for
that model): an EAGLE-3 drafter in the EAGLE repo's layout and in speculators', an EAGLE-1
drafter, Medusa-1 heads and a two-layer DFlash drafter in its authors' layout (config.json and
one safetensors file each). For them a loaded
result is compared on its weights and its draft vocabulary (`token_ids`, from `d2t`): a byte
inside `d2t` may map one draft id elsewhere.

Each test runs EXAMPLES cases (25; SPECJAX_FUZZ_EXAMPLES=2000 for a longer run), the same
ones on every run (derandomize).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specjax
from specjax import CheckpointError

gguf = pytest.importorskip("gguf")
from safetensors.numpy import load_file, save_file  # noqa: E402
from tokenizers import Tokenizer, models  # noqa: E402

from specjax.heads.dflash import init_block_drafter  # noqa: E402
from specjax.heads.eagle import init_drafter
from specjax.heads.medusa import HeadsConfig, init_heads
from specjax.io.checkpoint import random_model, save
from specjax.io.dflash import save_block_drafter  # noqa: E402
from specjax.io.eagle import save_drafter
from specjax.io.gguf_write import write_llama  # noqa: E402
from specjax.io.medusa import save_heads
from tests.support.gguf_files import tiny_vocab, write_gguf  # noqa: E402

# gguf's reader adds a damaged tensor offset to the data start in uint64 and says so.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in scalar add:RuntimeWarning")

EXAMPLES = int(os.environ.get("SPECJAX_FUZZ_EXAMPLES", "25"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])
TIME_LIMIT = 5.0    # seconds per case; most take a few milliseconds
HUGE = {4: [2**16, 2**31, 2**32 - 1], 8: [2**32, 2**40, 2**63 - 1, 2**64 - 1]}
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


@dataclass(frozen=True)
class Checkpoint:
    """The valid files, their bytes, and what loading them gives."""
    path: Path                  # the checkpoint directory, or the .gguf file
    files: dict[str, bytes]     # file name -> original bytes
    data_start: dict[str, int]  # for files holding tensors: where the tensor data begins
    original: specjax.Model

    def __repr__(self):         # what Hypothesis prints for a failing case
        return f"Checkpoint({str(self.path)!r})"


def _llama_config() -> specjax.ModelConfig:
    vocab = len(tiny_vocab()[0])    # the GGUF tokenizer's size: 3 specials + 256 bytes + 8 merges
    return specjax.ModelConfig(arch="llama", vocab_size=vocab, d_model=16, n_layers=2, n_heads=2,
                               n_kv_heads=1, head_dim=8, d_ff=32, max_positions=64, norm_eps=1e-6,
                               activation="silu", tie_embeddings=False, bos_token_id=1,
                               eos_token_ids=(2,))


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A scratch directory; .gguf files load through the cache under it."""
    root = tmp_path_factory.mktemp("fuzz")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECJAX_CACHE", str(root / "cache"))
        yield root


@pytest.fixture(scope="module")
def checkpoints(work) -> dict[str, Checkpoint]:
    tokens = tiny_vocab()[0]
    tokenizer = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token=tokens[0]))
    model = random_model(_llama_config(), seed=3, std=0.5, tokenizer=tokenizer)

    directory = save(model, work / "safetensors")
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    tensors = load_file(directory / "model.safetensors")
    write_gguf(work / "tiny.gguf", model.config.to_hf(), tensors)
    # Two shards and an index, so that the index and the second file are fuzzed too.
    names = sorted(tensors)
    for shard, part in zip(SHARDS, (names[::2], names[1::2])):
        save_file({n: tensors[n] for n in part}, directory / shard)
    index = {"weight_map": {n: SHARDS[i % 2] for i, n in enumerate(names)}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    (directory / "model.safetensors").unlink()

    out = {"safetensors": _directory(directory), "gguf": _gguf_file(work / "tiny.gguf"),
           # specjax's own GGUF writer (`io.gguf_write`, what the llama.cpp clients run), with
           # the tokenizer of the file above: its output is fuzzed as llama.cpp's converter's is.
           "gguf-written": _gguf_file(write_llama(model, work / "written.gguf",
                                                  like=work / "tiny.gguf"))}
    # The published drafters of the same model; the EAGLE-3 draft vocabulary is 100 of 267.
    vocab = model.config.vocab_size
    draft_ids = np.random.default_rng(0).permutation(vocab)[:100]
    eagle3 = init_drafter(model, token_ids=draft_ids, kind="eagle3", taps=(0, 1), std=0.3)
    eagle1 = init_drafter(model, kind="eagle1", std=0.3)
    heads = init_heads(HeadsConfig(num_heads=2, num_blocks=1, hidden_size=16,
                                                   vocab_size=vocab, subset_size=vocab,
                                                   head="own"), model, std=0.3)
    for name, saved in (
            ("eagle3", save_drafter(eagle3, work / "eagle3", format="eagle")),
            ("speculators", save_drafter(eagle3, work / "spec", format="speculators")),
            ("eagle1", save_drafter(eagle1, work / "eagle1", format="eagle")),
            ("medusa1", save_heads(heads, work / "medusa1", format="medusa")),
            ("dflash", save_block_drafter(init_block_drafter(model, layers=2, block_size=4,
                                                             taps=(1, 2), std=0.3),
                                          work / "dflash"))):
        out[name] = _directory(saved)
    return out


def _gguf_file(path: Path) -> Checkpoint:
    return Checkpoint(path, {path.name: path.read_bytes()},
                      {path.name: gguf.GGUFReader(path).data_offset}, specjax.load(path))


def _directory(directory: Path) -> Checkpoint:
    """A checkpoint directory as it is now: its files, where each safetensors file's data
    begins, and what it loads as."""
    files = {p.name: p.read_bytes() for p in sorted(directory.iterdir())}
    starts = {n: 8 + int.from_bytes(b[:8], "little") for n, b in files.items()
              if n.endswith(".safetensors")}
    return Checkpoint(directory, files, starts, specjax.load(directory))


@pytest.fixture(scope="module")
def gguf_int_fields(checkpoints) -> list[tuple[int, int]]:
    """(offset, size) of every integer in the GGUF header that is not an array element: the
    counts, string and array lengths, value types, tensor dimensions and offsets, and the
    integer metadata (block_count, ...)."""
    reader = gguf.GGUFReader(checkpoints["gguf"].path)
    base = reader.data.ctypes.data
    fields = list(reader.fields.values()) + [t.field for t in reader.tensors]
    out = []
    for field in fields:
        elements = set(field.data) if field.types[:1] == [gguf.GGUFValueType.ARRAY] else set()
        for i, part in enumerate(field.parts):
            if i not in elements and part.dtype.kind in "ui" and part.dtype.itemsize in HUGE:
                size = part.dtype.itemsize
                out += [(part.ctypes.data - base + j * size, size) for j in range(part.size)]
    return sorted(set(out))


# -- Running one case -------------------------------------------------------------------------

class Hang(BaseException):
    """Not an Exception, so that the readers' `except Exception` cannot swallow it."""


@contextlib.contextmanager
def time_limit(seconds: float):
    def expire(signum, frame):
        raise Hang(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    start = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - start < seconds


def _weights(loaded) -> np.ndarray:
    """All parameters as one vector of float32 bit patterns (NaN == NaN, -0 != +0), and a
    drafter's or heads' draft vocabulary (`token_ids`) after them."""
    ids = getattr(loaded, "token_ids", None)
    return np.concatenate([np.asarray(a, np.float32).ravel().view(np.uint32)
                           for a in jax.tree.leaves(loaded.params)]
                          + ([] if ids is None else [np.asarray(ids, np.int64).ravel()
                                                     .astype(np.uint32)]))


def load_damaged(ck: Checkpoint, name: str, damaged: bytes, data_bytes: int = 0,
                 only_data: bool = False):
    """Writes `damaged` over file `name` of `ck`, loads, checks the outcome, restores the file.

    data_bytes: how many bytes inside tensor data were overwritten; that many weights may
    differ. only_data: nothing else was damaged, so the config must be the original's.
    Returns the error, or None if it loaded.
    """
    file = ck.path if ck.path.suffix == ".gguf" else ck.path / name
    file.write_bytes(damaged)
    try:
        with time_limit(TIME_LIMIT):
            try:
                model = specjax.load(ck.path)
            except CheckpointError as e:
                error = e
            else:
                error = None
    finally:
        file.write_bytes(ck.files[name])
    if error is not None:
        assert str(ck.path) in str(error), f"the error does not name {ck.path}: {error}"
        return error
    got, want = _weights(model), _weights(ck.original)
    assert got.shape == want.shape, "a damaged file loaded with other weights"
    differ = int(np.sum(got != want))
    assert differ <= data_bytes, f"a damaged file loaded with {differ} other weights"
    if only_data:
        assert model.config == ck.original.config
    return None


# -- Strategies -------------------------------------------------------------------------------

DIRECTORIES = ["safetensors", "eagle3", "speculators", "eagle1", "medusa1", "dflash"]
FORMATS = ["safetensors", "gguf", "gguf-written", *DIRECTORIES[1:]]
# Mostly any byte, sometimes one that keeps a JSON file valid UTF-8 and close to valid JSON.
byte_values = st.integers(0, 255) | st.sampled_from(b'0129-.e ":,{}[]')


@st.composite
def overwrites(draw, ck: Checkpoint):
    """(file name, {position: new byte}): up to 4 bytes anywhere, or only inside tensor data."""
    name = draw(st.sampled_from(sorted(ck.files)))
    start = ck.data_start.get(name)
    low = start if start is not None and draw(st.booleans()) else 0
    positions = st.integers(low, len(ck.files[name]) - 1)
    return name, draw(st.dictionaries(positions, byte_values, min_size=1, max_size=4))


def _int_paths(obj, path=()):
    """Paths to the integers (not bools) inside a parsed JSON value."""
    if isinstance(obj, int) and not isinstance(obj, bool):
        yield path
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _int_paths(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _int_paths(v, (*path, i))


def _set(obj, path, value):
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value


# -- The fuzz tests ---------------------------------------------------------------------------

@pytest.mark.fast(cases=["safetensors", "gguf", "eagle3", "speculators", "eagle1", "medusa1"])
@pytest.mark.parametrize("fmt", FORMATS)
@FUZZ
@given(data=st.data())
def test_truncated_files(checkpoints, fmt, data):
    ck = checkpoints[fmt]
    name = data.draw(st.sampled_from(sorted(ck.files)))
    cut = data.draw(st.integers(0, len(ck.files[name]) - 1))
    load_damaged(ck, name, ck.files[name][:cut])


@pytest.mark.fast(cases=["safetensors", "gguf", "eagle3", "speculators", "eagle1", "medusa1"])
@pytest.mark.parametrize("fmt", FORMATS)
@FUZZ
@given(data=st.data())
def test_overwritten_bytes(checkpoints, fmt, data):
    ck = checkpoints[fmt]
    name, changes = data.draw(overwrites(ck))
    damaged = bytearray(ck.files[name])
    for i, value in changes.items():
        damaged[i] = value
    in_data = [i for i in changes if i >= ck.data_start.get(name, len(damaged))]
    load_damaged(ck, name, bytes(damaged), len(in_data), only_data=len(in_data) == len(changes))


@pytest.mark.fast(cases=["safetensors", "gguf", "eagle3", "speculators", "eagle1", "medusa1"])
@pytest.mark.parametrize("fmt", FORMATS)
@FUZZ
@given(data=st.data())
def test_inserted_garbage(checkpoints, fmt, data):
    ck = checkpoints[fmt]
    name = data.draw(st.sampled_from(sorted(ck.files)))
    original = ck.files[name]
    at = data.draw(st.integers(0, len(original)))
    garbage = data.draw(st.binary(min_size=1, max_size=64))
    load_damaged(ck, name, original[:at] + garbage + original[at:])


@pytest.mark.fast
@FUZZ
@given(data=st.data())
def test_huge_gguf_header_fields(checkpoints, gguf_int_fields, data):
    # Counts, string and array lengths, types, dimensions, offsets and integer metadata.
    ck = checkpoints["gguf"]
    offset, size = data.draw(st.sampled_from(gguf_int_fields))
    value = data.draw(st.sampled_from(HUGE[size]))
    damaged = bytearray(ck.files["tiny.gguf"])
    damaged[offset:offset + size] = value.to_bytes(size, "little")
    load_damaged(ck, "tiny.gguf", bytes(damaged))


@pytest.mark.fast(cases=["safetensors", "eagle3", "speculators", "eagle1", "medusa1"])
@pytest.mark.parametrize("fmt", DIRECTORIES)
@FUZZ
@given(data=st.data())
def test_huge_safetensors_numbers(checkpoints, fmt, data):
    # The 8-byte header length, a shape or data offset in a shard's JSON header, or any integer
    # in the JSON files (vocab_size, num_hidden_layers, eos ids, token ids in tokenizer.json,
    # draft_vocab_size, medusa_num_heads, the taps).
    ck = checkpoints[fmt]
    names = [n for n in sorted(ck.files)
             if n in ck.data_start or any(_int_paths(json.loads(ck.files[n])))]
    name = data.draw(st.sampled_from(names))
    original = ck.files[name]
    value = data.draw(st.sampled_from([2**31, 2**53 + 1, 2**63, 2**64 - 1, 10**30]))
    if name in ck.data_start:
        header_end = ck.data_start[name]
        header = json.loads(original[8:header_end])
        if data.draw(st.booleans()):
            damaged = min(value, 2**64 - 1).to_bytes(8, "little") + original[8:]
        else:
            _set(header, data.draw(st.sampled_from(list(_int_paths(header)))), value)
            text = json.dumps(header, separators=(",", ":")).encode()
            damaged = len(text).to_bytes(8, "little") + text + original[header_end:]
    else:
        contents = json.loads(original)
        _set(contents, data.draw(st.sampled_from(list(_int_paths(contents)))), value)
        damaged = json.dumps(contents).encode()
    load_damaged(ck, name, damaged)


# -- The cases the fuzzers rely on, and the bugs they found -----------------------------------

def test_the_gguf_writer_round_trips(checkpoints):
    # What specjax writes as GGUF loads back as the model it wrote: every weight, the config
    # and the tokenizer (the template file's), before any fuzzing.
    written, template = checkpoints["gguf-written"].original, checkpoints["gguf"].original
    np.testing.assert_array_equal(_weights(written), _weights(template))
    assert written.config == template.config
    text = "the cat sat"
    assert written.tokenizer.encode(text).ids == template.tokenizer.encode(text).ids


@pytest.mark.fast(cases=["safetensors", "gguf", "eagle3", "speculators", "eagle1", "medusa1"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_fuzzers_see_both_outcomes(checkpoints, fmt):
    # Negative control: damage must be seen as an error; and a load that goes through must be
    # compared, so one weight changed in tensor data shows up as exactly one weight.
    ck = checkpoints[fmt]
    for name in ck.files:
        assert load_damaged(ck, name, ck.files[name][:10]) is not None, name
    for name, start in ck.data_start.items():
        damaged = bytearray(ck.files[name])
        damaged[_first_float(ck, name) + 3] ^= 0x40     # its high byte: a large change
        assert load_damaged(ck, name, bytes(damaged), data_bytes=1, only_data=True) is None
        with pytest.raises(AssertionError, match="other weights"):
            load_damaged(ck, name, bytes(damaged))


def _first_float(ck: Checkpoint, name: str) -> int:
    """Where the first float32 weight of file `name` begins (a drafter's first tensor may be
    its integer `d2t`)."""
    start = ck.data_start[name]
    if not name.endswith(".safetensors"):
        return start
    header = json.loads(ck.files[name][8:start])
    return start + min(v["data_offsets"][0] for k, v in header.items()
                       if k != "__metadata__" and v["dtype"] == "F32")


def _damage_gguf_field(ck: Checkpoint, field: str, part: int, value: int, item_type=None) -> bytes:
    """The GGUF with one integer of a metadata field (or tensor info) overwritten."""
    reader = gguf.GGUFReader(ck.path)
    fields = {**reader.fields, **{t.name: t.field for t in reader.tensors}}
    target = fields[field].parts[part]
    offset = target.ctypes.data - reader.data.ctypes.data
    damaged = bytearray(ck.files["tiny.gguf"])
    damaged[offset:offset + target.nbytes] = value.to_bytes(target.nbytes, "little")
    if item_type is not None:   # an array's item type sits just before its count
        damaged[offset - 4:offset] = int(item_type).to_bytes(4, "little")
    return bytes(damaged)


@pytest.mark.fast
def test_gguf_array_longer_than_the_file_fails_fast(checkpoints):
    # gguf's reader, once past the end of the file, reads nothing and loops again: an array of
    # 2^64 - 1 one-byte items used to hang, growing a list by about 130 MB a second.
    ck = checkpoints["gguf"]
    damaged = _damage_gguf_field(ck, "tokenizer.ggml.token_type", 4, 2**64 - 1,
                                 item_type=gguf.GGUFValueType.UINT8)
    error = load_damaged(ck, "tiny.gguf", damaged)
    assert "an array of 18446744073709551615 items" in str(error)


@pytest.mark.fast
def test_gguf_huge_block_count_fails_fast(checkpoints):
    # Used to build a name table of 9 entries per block before looking at a single tensor.
    ck = checkpoints["gguf"]
    error = load_damaged(ck, "tiny.gguf", _damage_gguf_field(ck, "llama.block_count", 3, 2**31))
    assert "block_count=2147483648" in str(error)


@pytest.mark.fast
def test_gguf_tensor_data_must_sit_where_the_header_says(checkpoints):
    # Both used to load shifted weights without an error: an offset of 2^64 - 1, which wraps
    # around to the byte before the data section (llama.cpp requires the tensors back to back),
    # and one byte inserted before the data section.
    ck = checkpoints["gguf"]
    damaged = _damage_gguf_field(ck, "blk.0.attn_q.weight", 5, 2**64 - 1)
    assert "'blk.0.attn_q.weight' has offset" in str(load_damaged(ck, "tiny.gguf", damaged))
    original, start = ck.files["tiny.gguf"], ck.data_start["tiny.gguf"]
    damaged = original[:start - 1] + b"\0" + original[start - 1:]
    assert "1 bytes after the last tensor" in str(load_damaged(ck, "tiny.gguf", damaged))


@pytest.mark.fast
def test_config_with_a_huge_layer_count_fails_fast(checkpoints):
    # Used to build a list of 2^40 layer shapes (MemoryError or minutes) before any tensor.
    ck = checkpoints["safetensors"]
    config = json.loads(ck.files["config.json"])
    config["num_hidden_layers"] = 2**40
    error = load_damaged(ck, "config.json", json.dumps(config).encode())
    assert "config.json has 1099511627776 layers" in str(error)


@pytest.mark.fast
def test_json_files_that_are_not_utf8_are_named(checkpoints):
    # config.json, generation_config.json and tokenizer_config.json used to raise
    # UnicodeDecodeError.
    ck = checkpoints["safetensors"]
    for name in ck.files:
        if name.endswith(".json"):
            error = load_damaged(ck, name, b"\xff" + ck.files[name])
            assert name in str(error), error


@pytest.mark.fast
def test_safetensors_shards_stay_in_their_directory(checkpoints):
    ck = checkpoints["safetensors"]
    index = json.loads(ck.files["model.safetensors.index.json"])
    first = next(iter(index["weight_map"]))
    for elsewhere in ("/dev/zero", "../model-00001-of-00002.safetensors"):
        index["weight_map"][first] = elsewhere
        error = load_damaged(ck, "model.safetensors.index.json", json.dumps(index).encode())
        assert "outside its directory" in str(error)


@pytest.mark.fast
def test_published_drafter_configs_with_huge_sizes_fail_fast(checkpoints):
    # Both used to hang: an EAGLE-1 config's vocab_size of 2^31 built its 2^31 draft ids (it
    # has no tensor of that size to check first), and medusa_num_heads of 2^31 listed the
    # tensors 2^31 heads need before looking at the file.
    ck = checkpoints["eagle1"]
    config = json.loads(ck.files["config.json"])
    for key, words in (("vocab_size", "vocab_size must be an integer in [1, 16777216]"),
                       ("num_hidden_layers", "published EAGLE drafters have one layer")):
        error = load_damaged(ck, "config.json", json.dumps(dict(config, **{key: 2**31})).encode())
        assert words in str(error), error
    ck = checkpoints["medusa1"]
    config = json.loads(ck.files["config.json"])
    error = load_damaged(ck, "config.json",
                         json.dumps(dict(config, medusa_num_heads=2**31)).encode())
    assert "says 2147483648 head(s) of 1 block(s)" in str(error), error
