"""The suite compiles with faster settings (tests/conftest.py: LLVM at -O1, XLA's loop emitters
for fusions) to save compile time; this checks that the programs it tests compute the same bits
as the ones users run, in this process and in one at XLA's defaults: logits of the shipped tiny
targets (with the CPU kernels and with XLA's formulation) and their sampling distributions,
weights drawn from seeds, and the tokens of sampled speculative, tree and EAGLE decoding (XLA's
own formulation of the Llama target is held to 5e-5 and its ranking, `NEAR`: since the decoder
became a scan it rounds differently under these flags, measured, not yet understood). Its
negative control was run by hand: at -O0 the drawn weights differ in the last bit and this test
fails, which is why the suite uses -O1. (94 s alone on the 2-core Zen 3 host, most of it
compiling at XLA's defaults; `SPECJAX_TEST_XLA_OPT=default` makes both sides XLA's defaults.)"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import specjax
from specjax import kernels
from specjax.presets import WEIGHTS
from specjax.sampling.logits import SamplingParams, probs_from_logits
from specjax.testing.law import build_pair

from tests.conftest import SUITE_XLA_FLAGS, suite_xla_flags

PROMPTS = ["def add(a, b):\n    return", "class Stack:\n    def push(self, item):"]

SCRIPT = """
import json, sys
sys.path.insert(0, {root!r})
from tests.docs.test_compile_level import outputs
print(json.dumps(outputs()))
"""


def outputs() -> dict:
    """Logits (as the bytes of their float32 values) and tokens of the runs compared."""
    # Both paths: `forward` with the CPU kernels and with XLA's formulation (its run option).
    result = {}
    for name in ("llama-target", "gpt2-target"):
        target = specjax.load(WEIGHTS / name)
        ids = target.tokenizer.encode(PROMPTS[0]).ids
        for path, on in (("kernels", True), ("xla", False)):
            logits, _ = specjax.forward(target.params, target.config, np.array([ids]),
                                        np.arange(len(ids))[None], kernels=on)
            result[f"{name} {path}"] = np.asarray(logits, np.float32).tobytes().hex()
            probs = probs_from_logits(logits[0], SamplingParams(0.7, top_p=0.9))
            result[f"{name} {path} probabilities"] = np.asarray(probs).tobytes().hex()
    # Weights drawn from seeds (jax.random's normal: polynomials XLA compiles), which -O0 changes.
    pair = build_pair("close")
    result["drawn weights"] = hashlib.sha256(b"".join(
        np.asarray(leaf).tobytes() for model in (pair.target, pair.draft)
        for leaf in jax.tree.leaves(model.params))).hexdigest()
    target, draft = specjax.load(WEIGHTS / "llama-target"), specjax.load(WEIGHTS / "llama-draft")
    drafter = specjax.load(WEIGHTS / "llama-eagle")
    runs = {"speculative": dict(method=specjax.Speculative(draft=draft, k=3)),
            "tree": dict(method=specjax.Speculative(draft=draft, tree=specjax.Tree.full((2, 2)))),
            "eagle": dict(method=specjax.Eagle(drafter=drafter))}
    for name, kwargs in runs.items():
        result[name] = specjax.generate(target, PROMPTS,
                                        sampling=specjax.SamplingParams(temperature=1.0, top_p=0.9),
                                        max_new_tokens=24, seed=3, **kwargs).tokens
    return result


@pytest.mark.slow
def test_the_suites_compile_level_gives_the_shipped_bits():
    here_flags = os.environ.get("XLA_FLAGS", "").split()
    assert SUITE_XLA_FLAGS[0] in suite_xla_flags() or os.environ.get(
        "SPECJAX_TEST_XLA_OPT") == "default"
    root = str(Path(__file__).resolve().parents[2])
    flags = " ".join(f for f in here_flags if f not in SUITE_XLA_FLAGS)
    # (SPECJAX_TEST_XLA_OPT=default: importing this module imports conftest, which would add it)
    env = dict(os.environ, XLA_FLAGS=flags, SPECJAX_COMPILE_CACHE="off",
               SPECJAX_TEST_XLA_OPT="default")
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(root=root)], env=env, cwd=root,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shipped = json.loads(proc.stdout.strip().splitlines()[-1])
    here = outputs()
    assert here.keys() == shipped.keys()
    differ = [name for name in here if here[name] != shipped[name]]
    # One measured exception since the decoder became a scan (issue 74): XLA's own formulation
    # of the Llama target (the kernels off) rounds differently at -O1 and with the loop
    # emitters, each flag alone (at most 9.5e-6 apart in a logit, 2-core Zen 5 host). It is held
    # to that size and to the same ranking here; everything else, the kernels' path that the
    # suite and users run on a CPU included, stays bit for bit.
    for name in NEAR:
        if name in differ:
            a, b = (np.frombuffer(bytes.fromhex(x[name]), np.float32) for x in (here, shipped))
            assert np.max(np.abs(a - b)) <= NEAR[name], (name, np.max(np.abs(a - b)))
            vocab = specjax.load(WEIGHTS / "llama-target").config.vocab_size
            assert (a.reshape(-1, vocab).argmax(-1) == b.reshape(-1, vocab).argmax(-1)).all()
            differ.remove(name)
    assert differ == [], f"the suite's flags and XLA's defaults differ in {differ}"


# The outputs allowed to differ by at most this much (the test's comment says why).
NEAR = {"llama-target xla": 5e-5, "llama-target xla probabilities": 5e-6}
