"""A first SmolLM2 DFlash drafter on data/eagle (greedy, 180k tokens): a rough data point for
issue 63 item 5, run in the background with checkpoints."""
import sys, time, json
from pathlib import Path
import numpy as np
import specjax
from specjax.io.fetch import fetch
from specjax.io import chat
from specjax.api.generate import generate
from specjax.bench.prompts import SUITE
from specjax.train import eagle3, dflash as tdf
from specjax.io.dflash import save_block_drafter

out = Path("/work/scratch/dflash-smollm2")
steps = int(sys.argv[1])
target = specjax.load(fetch("smollm2"))
d = np.load("/work/main/data/eagle/smollm2.npz")
starts, flat = d["starts"], d["tokens"]
n = len(d["prompt_length"])
lengths = np.diff(starts).astype(np.int32)
width = int(lengths.max())
tokens = np.zeros((n, width), np.int32)
for i in range(n):
    tokens[i, :lengths[i]] = flat[starts[i]:starts[i + 1]]
seqs = eagle3.Sequences(tokens, lengths, d["prompt_length"].astype(np.int32))
t0 = time.time()
feats = eagle3.features(target, seqs, taps=(16,), batch=32, dtype=np.float16,
                        directory=out / "features")
print("features", round(time.time() - t0), "s", flush=True)
cfg = tdf.TrainConfig(steps=steps, batch=8, learning_rate=6e-4, warmup=50, block_size=8,
                      anchors=8, checkpoint_every=100)
t0 = time.time()
def prog(step, m, model):
    if step % 25 == 0:
        print("step", step, np.round(np.asarray(m)[0], 3), round(time.time() - t0), "s", flush=True)
drafter = tdf.train(target, feats, cfg, checkpoint=out / f"checkpoint-{steps}", progress=prog)
print("train", round(time.time() - t0), "s", flush=True)
save_block_drafter(drafter, out / f"drafter-{steps}")
prompts = [chat.encode(target, chat.render(target, p["prompt"])) if p.get("chat") else p["prompt"]
           for p in SUITE["prompts"] if p["category"] != "long-code-editing"]
eagle = specjax.load("/work/main/weights/smollm2-eagle")
res = {}
for name, opts in (("dflash", dict(method=specjax.DFlash(drafter=drafter))),
                   ("eagle", dict(method=specjax.Eagle(drafter=eagle)))):
    r = generate(target, prompts, sampling=specjax.SamplingParams(temperature=0.0),
                 max_new_tokens=64, **opts)
    res[name] = dict(tokens_per_call=r.stats.tokens_per_target_call,
                     acceptance_by_position=[None if a is None else float(a) for a in r.stats.acceptance_by_position])
    print(name, res[name], flush=True)
(out / f"result-{steps}.json").write_text(json.dumps(dict(steps=steps, result=res), indent=1))
