"""A look at runs/eagle1-scratch (eagle1-scratch.sh here, --slots 4096
--steps 2400): a copy of its checkpoint resumed with no further step (the run key is checked), then
compared with the shipped drafter on EVAL_QUESTIONS (scripts/eagle3_smollm2.py's compare)."""
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import numpy as np  # noqa: E402
import specjax  # noqa: E402
from specjax.train import data, eagle3  # noqa: E402

from eagle3_smollm2 import compare  # noqa: E402

snapshot = ROOT / "runs/eagle1-scratch.snapshot"
shutil.rmtree(snapshot, ignore_errors=True)
shutil.copytree(ROOT / "runs/eagle1-scratch.work/checkpoint", snapshot)
step = int(json.loads((snapshot / "state.json").read_text())["step"])
target = specjax.load("/tmp/sjcache/smollm2-135m-instruct")
sequences, _ = data.read(ROOT / "runs/eagle2", target)
features = eagle3.features(target, sequences, (0,), dtype=np.float16,
                           directory=ROOT / "runs/eagle2-features", final_only=True)
config = eagle3.TrainConfig(kind="eagle1", style="specjax", subset=8192, steps=2400,
                            learning_rate=0.002, warmup=50, unroll=2, decay=0.8, clip=1.0,
                            noise=0.1, seed=0, checkpoint_every=50, slots=4096)
drafter = eagle3.train(target, features, config, checkpoint=snapshot, stop_after=0)
started = time.time()
out = ROOT / f"runs/eagle1-scratch-step{step}"
out.mkdir(exist_ok=True)
compare(target, drafter, {"run": "runs/eagle1-scratch", "step": step, "of_steps": 2400}, out,
        lambda text: print(f"[{time.time() - started:6.0f} s] {text}", flush=True))
