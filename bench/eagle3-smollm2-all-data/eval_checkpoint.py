"""A mid-run look at `runs/eagle3-4k.sh`'s training: a copy of its checkpoint resumed with no
further step (the same run: target, data, config), then compared with the shipped drafter on
EVAL_QUESTIONS (scripts/eagle3_smollm2.py's compare)."""
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import numpy as np  # noqa: E402
import specjax  # noqa: E402
from specjax.train import data, eagle3  # noqa: E402

from eagle3_smollm2 import compare  # noqa: E402

snapshot = ROOT / "runs/eagle3-4k.snapshot"
shutil.rmtree(snapshot, ignore_errors=True)
shutil.copytree(ROOT / "runs/eagle3-4k.work/checkpoint", snapshot)
step = int(__import__("json").loads((snapshot / "state.json").read_text())["step"])
target = specjax.load("/tmp/sjcache/smollm2-135m-instruct")
sequences, _ = data.read(ROOT / "runs/eagle2", target)
features = eagle3.features(target, sequences, (2, 15, 27), dtype=np.float16,
                           directory=ROOT / "runs/eagle2-features")
config = eagle3.TrainConfig(kind="eagle3", steps=4000, batch=4, learning_rate=1e-3, unroll=3,
                            draft_vocab=8192, checkpoint_every=100)
drafter = eagle3.train(target, features, config, checkpoint=snapshot, stop_after=0)
started = time.time()
out = ROOT / f"runs/eagle3-4k-step{step}"
out.mkdir(exist_ok=True)
compare(target, drafter, {"run": "runs/eagle3-4k.sh", "step": step, "of_steps": 4000}, out,
        lambda text: print(f"[{time.time() - started:6.0f} s] {text}", flush=True))
