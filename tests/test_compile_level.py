"""The suite compiles at LLVM -O1 (tests/conftest.py) to save compile time; this checks that the
programs it tests compute the same bits as the ones users run: logits of the shipped tiny
targets, and the tokens of sampled speculative, tree and EAGLE decoding, in this process and
in one at XLA's default level."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import specjax
from specjax.presets import WEIGHTS

from tests.conftest import OPT_LEVEL

PROMPTS = ["def add(a, b):\n    return", "class Stack:\n    def push(self, item):"]

SCRIPT = """
import json, sys
sys.path.insert(0, {root!r})
from tests.test_compile_level import outputs
print(json.dumps(outputs()))
"""


def outputs() -> dict:
    """Logits (as the bytes of their float32 values) and tokens of the runs compared."""
    result = {}
    for name in ("llama-target", "gpt2-target"):
        target = specjax.load(WEIGHTS / name)
        ids = target.tokenizer.encode(PROMPTS[0]).ids
        logits, _ = specjax.forward(target.params, target.config, np.array([ids]),
                                    np.arange(len(ids))[None])
        result[name] = np.asarray(logits, np.float32).tobytes().hex()
    target, draft = specjax.load(WEIGHTS / "llama-target"), specjax.load(WEIGHTS / "llama-draft")
    drafter = specjax.load(WEIGHTS / "llama-eagle")
    runs = {"speculative": dict(method="speculative", draft=draft, k=3),
            "tree": dict(method="speculative", draft=draft, tree=specjax.Tree.full((2, 2))),
            "eagle": dict(method="eagle", drafter=drafter)}
    for name, kwargs in runs.items():
        result[name] = specjax.generate(target, PROMPTS, max_new_tokens=24, temperature=1.0,
                                        top_p=0.9, seed=3, **kwargs).tokens
    return result


def test_the_suites_compile_level_gives_the_shipped_bits():
    assert OPT_LEVEL in os.environ.get("XLA_FLAGS", "") or os.environ.get(
        "SPECJAX_TEST_XLA_OPT") == "default"
    root = str(Path(__file__).resolve().parents[1])
    flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if f != OPT_LEVEL)
    # (SPECJAX_TEST_XLA_OPT=default: importing this module imports conftest, which would add it)
    env = dict(os.environ, XLA_FLAGS=flags, SPECJAX_COMPILE_CACHE="off",
               SPECJAX_TEST_XLA_OPT="default")
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(root=root)], env=env, cwd=root,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shipped = json.loads(proc.stdout.strip().splitlines()[-1])
    here = outputs()
    assert here.keys() == shipped.keys()
    for name in here:
        assert here[name] == shipped[name], f"{name} differs between the suite's level and the default"
