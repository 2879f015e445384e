"""The training corpus of the shipped checkpoints: the running interpreter's standard library.

Every `.py` file under `sysconfig.get_paths()["stdlib"]`, recursively and in sorted order, is a
document, except files under `site-packages` (third-party code), under test directories
(`test`, `tests`, `idle_test`: CPython's test suite is larger than the library and very
repetitive) and files that are not valid UTF-8. A file goes to the validation split when
`md5(relative path) mod 50 == 0` (about 2% of the files), so no validation file is ever seen in
training, whatever the window sampling does. Documents are joined with `<|endoftext|>`
(token id 0), which also opens the stream.

The tokenized splits are cached as .npy files under `runs/corpus/`, keyed by the Python version
and a hash of tokenizer.json, so that each training run does not re-tokenize. Any tokenizer with
an `<|endoftext|>` token and fewer than 65536 entries works (the shipped SmolLM2 draft's retired
recipe read it with SmolLM2's own tokenizer, where `<|endoftext|>` is also id 0).
"""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path

import numpy as np

# The documents, their split and the code prompts live in the package (`train data --prompts
# builtin:code`); the tokenizer and the tokenized corpus of the tiny checkpoints stay here.
from specjax.train.stdlib import EXCLUDED_DIRS, HOLDOUT_MODULUS, documents, stdlib_root

EOT = "<|endoftext|>"
EOT_ID = 0
VOCAB_SIZE = 4096
REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / "runs" / "corpus"


def train_tokenizer(out: Path) -> Path:
    """Byte-level BPE (vocab 4096) on the training split; `<|endoftext|>` is id 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    train, _, _ = documents()
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator((text for _, text in train), trainer=trainer)
    assert tokenizer.token_to_id(EOT) == EOT_ID, "the special token must be id 0"
    out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out))
    return out


def tokenizer_config() -> dict:
    """tokenizer_config.json, so that transformers' AutoTokenizer also reads tokenizer.json."""
    return {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": EOT, "eos_token": EOT,
            "unk_token": EOT, "model_max_length": 256, "clean_up_tokenization_spaces": False}


def eot_id(tokenizer) -> int:
    """The id of `<|endoftext|>` in `tokenizer`, the document separator of the corpus."""
    eot = tokenizer.token_to_id(EOT)
    if eot is None:
        raise ValueError(f"the tokenizer has no {EOT!r} token to separate documents with")
    return eot


def _encode(tokenizer, docs: list[tuple[str, str]]) -> np.ndarray:
    # One EOT before every document: the stream opens with BOS and documents are separated.
    if tokenizer.get_vocab_size(with_added_tokens=True) > 2 ** 16:
        raise ValueError("the corpus is stored as uint16: the tokenizer has too many entries")
    eot = eot_id(tokenizer)
    ids = [eot]
    for encoding in tokenizer.encode_batch([text for _, text in docs], add_special_tokens=False):
        ids.extend(encoding.ids)
        ids.append(eot)
    return np.asarray(ids, np.uint16)


def corpus(tokenizer_path: Path) -> dict:
    """The tokenized splits (uint16 arrays) and a description of the data, cached on disk."""
    from tokenizers import Tokenizer

    digest = hashlib.sha256(Path(tokenizer_path).read_bytes()).hexdigest()[:12]
    key = f"py{platform.python_version()}-{digest}"
    files = {s: CACHE / f"{key}-{s}.npy" for s in ("train", "validation")}
    meta_file = CACHE / f"{key}.json"
    if all(f.exists() for f in files.values()) and meta_file.exists():
        meta = json.loads(meta_file.read_text())
    else:
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
        train, validation, skipped = documents()
        CACHE.mkdir(parents=True, exist_ok=True)
        for split, docs in (("train", train), ("validation", validation)):
            np.save(files[split], _encode(tokenizer, docs))
        meta = {"python": platform.python_version(), "stdlib": str(stdlib_root()),
                "train_files": len(train), "validation_files": [r for r, _ in validation],
                "skipped_not_utf8": skipped, "excluded_dirs": sorted(EXCLUDED_DIRS),
                "holdout_rule": f"md5(relative path) mod {HOLDOUT_MODULUS} == 0",
                "train_bytes": sum(len(t.encode()) for _, t in train),
                "validation_bytes": sum(len(t.encode()) for _, t in validation)}
        meta_file.write_text(json.dumps(meta, indent=1) + "\n")
    out = {split: np.load(f).astype(np.int32) for split, f in files.items()}
    meta["train_tokens"] = int(out["train"].size)
    meta["validation_tokens"] = int(out["validation"].size)
    return {**out, "meta": meta}
