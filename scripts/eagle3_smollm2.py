"""Measurement: a published EAGLE-3 drafter for SmolLM2 trained by `specjax.train.eagle3` on a
part of data/eagle2, against the shipped drafter (weights/smollm2-eagle, specjax's EAGLE-1
style), on the held-out chat questions its card uses (scripts/_corpus.py EVAL_QUESTIONS, in the
chat template, 64 new tokens, EAGLE-2's dynamic tree of 4 levels of the top 4, 8 nodes).

    python scripts/eagle3_smollm2.py --shards 0 1 2 --steps 600 --out runs/eagle3-smollm2

Stages are kept in --out (the features, memory-mapped, and the training checkpoint); running
the same command again resumes whichever was interrupted. All 19 shards:
`--shards $(seq 0 18)` (about 4.4 GB of features in float16 at --max-length 384). The trained drafter is written to --out/drafter in the
EAGLE repo's layout and the comparison to --out/results.json.

With --drafter DIR it trains nothing and compares that drafter (one written by
`python -m specjax train eagle3`, say) with the shipped one:

    python scripts/eagle3_smollm2.py --drafter runs/eagle3-4k --out runs/eagle3-4k-eval
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import specjax  # noqa: E402
from specjax.io import chat  # noqa: E402
from specjax.io.fetch import fetch  # noqa: E402
from specjax.train import eagle3  # noqa: E402

from _corpus import EVAL_QUESTIONS  # noqa: E402
from _eagle_data import load_sequences  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(ROOT / "data/eagle2/smollm2"))
    parser.add_argument("--shards", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--max-length", type=int, default=384, help="documents are cut here")
    parser.add_argument("--taps", default="2,15,27")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--unroll", type=int, default=2)
    parser.add_argument("--draft-vocab", type=int, default=8192)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--out", default=str(ROOT / "runs/eagle3-smollm2"))
    parser.add_argument("--drafter", help="compare this drafter instead of training one")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()

    def say(text):
        print(f"[{time.time() - started:7.0f} s] {text}", flush=True)

    target = specjax.load(fetch("smollm2"))
    if args.drafter:
        compare(target, specjax.load(args.drafter), {"drafter": args.drafter}, out, say)
        return
    raw = load_sequences(Path(args.data), args.shards)
    keep = np.flatnonzero(~raw["held_out"])
    starts, tokens = raw["starts"], raw["tokens"].astype(np.int32)
    n, t = len(keep), args.max_length
    seq = np.zeros((n, t), np.int32)
    length = np.zeros(n, np.int32)
    for row, i in enumerate(keep):
        doc = tokens[starts[i]:starts[i + 1]][:t]
        seq[row, :len(doc)] = doc
        length[row] = len(doc)
    prompt_length = np.minimum(raw["prompt_length"][keep], length).astype(np.int32)
    sequences = eagle3.Sequences(seq, length, prompt_length)
    say(f"{n} training documents of shards {args.shards}, "
        f"{int(np.sum(length - prompt_length))} generated tokens (cut at {t})")
    taps = tuple(int(x) for x in args.taps.split(","))
    data = eagle3.features(target, sequences, taps, dtype=np.float16,
                           progress=lambda done, total: done % 160 == 0 and say(
                               f"features {done}/{total}"),
                           directory=out / "features")     # on disk, resumable
    say(f"features: {(data.tapped.nbytes + data.final.nbytes) / 2**30:.2f} GiB")
    config = eagle3.TrainConfig(steps=args.steps, batch=args.batch,
                                learning_rate=args.learning_rate, warmup=min(50, args.steps),
                                unroll=args.unroll, draft_vocab=args.draft_vocab,
                                checkpoint_every=args.checkpoint_every)

    def progress(step, parts, _):
        if step % 25 == 0 or step == args.steps:
            say(f"step {step}/{args.steps}: " + " ".join(f"{a:.3f}/{b:.2f}" for a, b in parts))

    drafter = eagle3.train(target, data, config, checkpoint=out / "checkpoint",
                           progress=progress)
    specjax.save_drafter(drafter, out / "drafter", format="eagle")
    say("trained; evaluating")
    compare(target, drafter, {"shards": args.shards, "documents": n, "max_length": t,
                              "taps": list(taps), "config": vars(config),
                              "train_s": round(time.time() - started, 1)}, out, say)


def compare(target, drafter, results: dict, out: Path, say) -> None:
    """Tokens per target call and acceptance by depth of `drafter` and of the shipped drafter
    on EVAL_QUESTIONS, at T = 0 and 1, into results and out/results.json."""
    prompts = [chat.encode(target, chat.render(target, q)) for q in EVAL_QUESTIONS]
    tree = specjax.DynamicTree(depth=4, top_k=4, total_tokens=8)
    shipped = specjax.load(ROOT / "weights/smollm2-eagle")
    for name, d in (("eagle3", drafter), ("shipped", shipped)):
        for temperature in (0.0, 1.0):
            r = specjax.generate(target, prompts, method="eagle", drafter=d, tree=tree,
                                 max_new_tokens=64, temperature=temperature, seed=0)
            results[f"{name}_t{temperature:g}"] = {
                "tokens_per_target_call": round(r.stats.tokens_per_target_call, 3),
                "acceptance_by_position": [round(float(a), 3)
                                           for a in r.stats.acceptance_by_position]}
            say(f"{name} T={temperature:g}: {r.stats.tokens_per_target_call:.3f} tokens per call")
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
