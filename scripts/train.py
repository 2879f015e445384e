"""Trains the tiny checkpoints shipped in weights/ and their tokenizer, then measures them.

The tiny pairs train on the Python standard library's source, with a tokenizer trained on it:
the corpus and tokenizer training that `python -m specjax train` does not do (it trains drafters
for a target that exists).

    python scripts/train.py tokenizer --out runs/tokenizer.json
    python scripts/train.py model --arch llama --layers 2 --d-model 128 ... --out weights/llama-draft
    python scripts/train.py evaluate --draft weights/llama-draft --target weights/llama-target
    python scripts/train.py index

The shipped drafters for a target (the SmolLM2 draft, the Medusa heads, the EAGLE drafters) are
made by `python -m specjax train` now: their cards give the commands, and what each remade gives
next to the shipped weights. This script's recipes that first made them, and made their data
in data/eagle/ and data/eagle2/ (which `train data --import` reads), were retired after git
commit 3dd0334 (`git checkout 3dd0334 -- scripts` restores them).

The data is the standard library of the running Python (see scripts/_corpus.py). Everything is
seeded: the same command on the same Python and library versions gives the same weights.
`--minutes` picks the number of steps from a short timing run when `--steps` is not given; the
number it picks is written to train_log.json and to the model card's regenerate command, which
always names `--steps` so that a rerun does not depend on the machine's speed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # specjax, without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

# The stages, one module each: the corpus and tokenizer, training, evaluation and the model
# cards (scripts/cards/*.md are the cards' templates).
import _corpus  # noqa: E402
from _cards import write_index  # noqa: E402
from _evaluation import evaluate_pair  # noqa: E402
from _training import train_model  # noqa: E402

DEFAULT_TOKENIZER = _corpus.REPO / "runs" / "tokenizer.json"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(required=True)

    p = sub.add_parser("tokenizer", help="train the byte-level BPE tokenizer on the corpus")
    p.add_argument("--out", type=Path, default=DEFAULT_TOKENIZER)
    p.set_defaults(func=lambda a: print(_corpus.train_tokenizer(a.out)))

    p = sub.add_parser("model", help="train one checkpoint")
    p.add_argument("--arch", choices=("gpt2", "llama"), required=True)
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--d-model", type=int, required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--kv-heads", type=int, default=0, help="llama only; default: --heads")
    p.add_argument("--d-ff", type=int, required=True)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--steps", type=int, default=0, help="default: as many as fit in --minutes")
    p.add_argument("--minutes", type=float, default=0.0, help="wall-clock cap")
    p.add_argument("--stop-after", type=int, default=0,
                   help="stop after this many steps of the --steps schedule (reproduces a run "
                        "that --minutes cut short)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    p.add_argument("--max-positions", type=int, default=0,
                   help="context window written to config.json; default: --context")
    p.add_argument("--teacher", default="",
                   help="distil from this checkpoint (same vocabulary): the loss mixes "
                        "cross-entropy against its next-token distribution into the data's")
    p.add_argument("--distill-weight", type=float, default=1.0,
                   help="weight of the teacher term, 0..1 (with --teacher)")
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=train_model)

    p = sub.add_parser("evaluate", help="greedy acceptance rate of a draft/target pair")
    p.add_argument("--draft", type=Path, required=True)
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    p.set_defaults(func=evaluate_pair)

    p = sub.add_parser("index", help="write weights/README.md from the checkpoints' records")
    p.set_defaults(func=write_index)

    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.func(args)


if __name__ == "__main__":
    main()
