"""Issue 63, item 5: does a DFlash drafter for SmolLM2 gain from EAGLE-3's three taps (the
states after layers 2, 15 and 27) over the published one-layer default (the middle, 16)? The
same data, recipe and steps as bench/train-smollm2-dflash-first/'s 2,000-step run, which read
tap 16 alone; run in the background with checkpoints, then `evaluate.py` beside it.

    PYTHONPATH=. python bench/train-smollm2-dflash-taps/run.py WORK_DIR
"""
import sys
import time
from pathlib import Path

import numpy as np

import specjax
from specjax.io.dflash import save_block_drafter
from specjax.io.fetch import fetch
from specjax.train import dflash as train_dflash
from specjax.train import eagle3

TAPS, STEPS = (2, 15, 27), 2000
work = Path(sys.argv[1])
target = specjax.load(fetch("smollm2"))
d = np.load(Path(__file__).resolve().parents[2] / "data" / "eagle" / "smollm2.npz")
starts, flat = d["starts"], d["tokens"]
lengths = np.diff(starts).astype(np.int32)
tokens = np.zeros((len(lengths), int(lengths.max())), np.int32)
for i, n in enumerate(lengths):
    tokens[i, :n] = flat[starts[i]:starts[i + 1]]
sequences = eagle3.Sequences(tokens, lengths, d["prompt_length"].astype(np.int32))
started = time.time()
features = eagle3.features(target, sequences, taps=TAPS, batch=32, dtype=np.float16,
                           directory=work / "features")
print("features", round(time.time() - started), "s", flush=True)
config = train_dflash.TrainConfig(steps=STEPS, batch=8, learning_rate=6e-4, warmup=50,
                                  block_size=8, anchors=8, checkpoint_every=100)
started = time.time()


def progress(step, metrics, model):
    if step % 25 == 0:
        print("step", step, np.round(np.asarray(metrics)[0], 3),
              round(time.time() - started), "s", flush=True)


drafter = train_dflash.train(target, features, config, checkpoint=work / "checkpoint",
                             progress=progress)
print("train", round(time.time() - started), "s", flush=True)
save_block_drafter(drafter, work / "drafter")
