"""The CPU kernels' one switch (`generate(kernels=)`, `SPECJAX_KERNELS`, `--no-kernels`): it is
part of the compiled program's key, the outputs are the same either way, and without a C++
compiler generate warns and runs XLA's formulation. (tests/engine/test_few_rows.py tests the kernels
themselves.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import specjax
from specjax import kernels, testing
from specjax.api.generate import GenerationError, prepare
from specjax.decoding import loop
from specjax.kernels import ffi
from tests.exactness.test_distribution import NGRAM_PROMPT, eagle_drafter, in_dtype

PROMPTS = [list(NGRAM_PROMPT), list(NGRAM_PROMPT[:5]), [3, 1]]


def method_of(name):
    pair = testing.pair()
    return {"speculative": lambda: specjax.Speculative(pair.draft, k=3),
            "speculative-tree": lambda: specjax.Speculative(pair.draft,
                                                            tree=specjax.Tree.full((2, 2))),
            "eagle": lambda: specjax.Eagle(eagle_drafter(pair.target),
                                           tree=specjax.DynamicTree(3, 2, 4))}[name]()


def lowered(spec_request) -> str:
    req = spec_request
    return loop.programs(req.spec).run.lower(req.weights, *req.inputs).as_text()


# A chain, a static tree and a dynamic tree (each verify call takes the few-row product and
# the few-query attention; test_smollm2.py adds autoregressive and EAGLE on SmolLM2).
@pytest.mark.parametrize("method", ["speculative", "speculative-tree", "eagle"])
def test_greedy_tokens_are_the_same_with_the_kernels_on_and_off(method):
    if not kernels.ensure():
        pytest.skip("the kernels cannot be built here (no C++ compiler)")
    target = testing.pair().target
    on, off = (specjax.generate(target, PROMPTS, method_of(method),
                                specjax.SamplingParams(temperature=0.0), max_new_tokens=12,
                                eos_ids=(), kernels=k)
               for k in (True, False))
    assert on.tokens == off.tokens
    assert on.stats.target_calls == off.stats.target_calls


@pytest.mark.parametrize("dtype", ["bfloat16", "int8", "q8_0"])
def test_low_precision_greedy_tokens_are_the_same_with_the_kernels_on_and_off(dtype):
    # The kernels' path per dtype (int8: the 8-bit kernel; off: XLA's product of the
    # dequantised weights; q8_0: its kernel, off: its law in XLA) against XLA's, through a
    # chain's verify calls.
    if not kernels.ensure():
        pytest.skip("the kernels cannot be built here (no C++ compiler)")
    pair = testing.pair()
    target, draft = in_dtype((pair.target, pair.draft), dtype)
    on, off = (specjax.generate(target, PROMPTS, method=specjax.Speculative(draft=draft, k=3),
                                sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=12,
                                eos_ids=(), kernels=k)
               for k in (True, False))
    assert on.tokens == off.tokens
    assert on.stats.target_calls == off.stats.target_calls


def test_the_switch_is_part_of_the_programs_key():
    if not kernels.ensure():
        pytest.skip("the kernels cannot be built here (no C++ compiler)")
    target, draft = testing.pair().target, testing.pair().draft
    request = {k: prepare(target, PROMPTS, method=specjax.Speculative(draft=draft, k=3),
                          max_new_tokens=8, kernels=k) for k in (True, False)}
    assert request[True].spec != request[False].spec
    assert ffi.PRODUCT_TARGET in lowered(request[True])
    assert ffi.ATTENTION_TARGET in lowered(request[True])
    # Traced after the kernels' program, in the same process: still none of them.
    text = lowered(request[False])
    assert ffi.PRODUCT_TARGET not in text and ffi.ATTENTION_TARGET not in text


def test_the_environment_variable_and_bad_values(monkeypatch):
    target = testing.pair().target
    monkeypatch.setenv("SPECJAX_KERNELS", "off")
    assert not prepare(target, PROMPTS, max_new_tokens=4).spec.kernels
    assert prepare(target, PROMPTS, max_new_tokens=4, kernels=True).spec.kernels == \
        kernels.ensure()                                   # the argument wins
    monkeypatch.setenv("SPECJAX_KERNELS", "maybe")
    with pytest.raises(GenerationError, match="SPECJAX_KERNELS must be on or off, got 'maybe'"):
        prepare(target, PROMPTS, max_new_tokens=4)
    with pytest.raises(GenerationError, match="kernels must be True, False or None, got 'yes'"):
        prepare(target, PROMPTS, max_new_tokens=4, kernels="yes")


SCRIPT = """
import json, warnings
import specjax
from specjax import testing
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    pair = testing.pair()
    result = specjax.generate(pair.target, {prompts}, specjax.Speculative(pair.draft, k=3),
                              specjax.SamplingParams(temperature=0.0), max_new_tokens=12,
                              eos_ids=())
print(json.dumps(dict(tokens=result.tokens, warnings=[str(w.message) for w in caught])))
"""


def test_without_a_compiler_generate_warns_and_runs_xla(tmp_path):
    # A fresh cache (no library built before) and no compiler on the PATH: the build fails, a
    # warning says why, and the tokens are the greedy tokens XLA's formulation gives.
    env = dict(os.environ, PATH=str(tmp_path), SPECJAX_CACHE=str(tmp_path / "cache"),
               SPECJAX_COMPILE_CACHE="off")
    env.pop("CXX", None)
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(prompts=PROMPTS)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert any("kernels are not available" in w and "no C++ compiler" in w
               for w in out["warnings"]), out["warnings"]
    pair = testing.pair()
    want = specjax.generate(pair.target, PROMPTS, method=specjax.Speculative(draft=pair.draft, k=3),
                            sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=12,
                            eos_ids=(), kernels=False)
    assert out["tokens"] == want.tokens
    assert not (tmp_path / "cache" / "kernels").exists() or not any(
        (tmp_path / "cache" / "kernels").glob("*.so"))


def test_the_cli_switch(tmp_path):
    env = dict(os.environ, SPECJAX_COMPILE_CACHE="off")
    run = [sys.executable, "-m", "specjax", "generate", "--preset", "tiny-llama", "--method",
           "autoregressive", "-n", "4", "--prompt", "def f(x):", "--json"]
    proc = subprocess.run([*run, "--no-kernels"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["results"][0]["tokens"]) == 4
    proc = subprocess.run(run, env=dict(env, SPECJAX_KERNELS="maybe"), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "specjax: error: SPECJAX_KERNELS must be on or off, got 'maybe'"]


FORWARD_SCRIPT = """
import json
import jax, jax.numpy as jnp, numpy as np
import specjax
from specjax import testing
from specjax.kernels import ffi
from specjax.model import linear
target = testing.pair().target
tokens, positions = jnp.asarray([[1, 2, 3, 4, 5]], jnp.int32), jnp.arange(5)[None]
def text(kernels):
    f = jax.jit(lambda p, x, q: specjax.forward(p, target.config, x, q, kernels=kernels)[0])
    return f.lower(target.params, tokens, positions).as_text()
before = np.asarray(specjax.forward(target.params, target.config, tokens, positions)[0])
on, off = text(None), text(False)
with linear.use_kernels(False):           # an enclosing switch holds when kernels=None
    inside_off = text(None)
specjax.generate(target, [[1, 2, 3]], max_new_tokens=2)
after = np.asarray(specjax.forward(target.params, target.config, tokens, positions)[0])
print(json.dumps(dict(on=ffi.PRODUCT_TARGET in on, off=ffi.PRODUCT_TARGET in off,
                      inside_off=ffi.PRODUCT_TARGET in inside_off,
                      same_bits=before.tobytes() == after.tobytes())))
"""


def test_forward_uses_the_kernels_before_any_generate():
    # In a fresh process, `specjax.forward` as its first call takes the kernels as generate
    # does (it used to take them only once a generate had registered them, so its last bits
    # changed after one); `kernels=False`, or an enclosing `use_kernels(False)`, leaves them out.
    if not kernels.ensure():
        pytest.skip("the kernels cannot be built here (no C++ compiler)")
    proc = subprocess.run([sys.executable, "-c", FORWARD_SCRIPT], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, SPECJAX_COMPILE_CACHE="off"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == dict(on=True, off=False, inside_off=False,
                                                            same_bits=True)
