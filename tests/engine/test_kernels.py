"""The CPU kernels as a run option (`generate(kernels=)`, `forward(kernels=)`, `SPECJAX_KERNELS`,
`--no-kernels`) and as data (`ModelConfig.kernels`): the choice is part of the compiled
program's static config, so programs with and without the kernels are traced in one process
with no switch between them; the model layer holds no state that a trace reads; the outputs
are the same either way; and without a C++ compiler generate warns and runs XLA's formulation.
(tests/engine/test_few_rows.py tests the kernels themselves.)"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import specjax
from specjax import kernels, testing
from specjax.api.generate import GenerationError, prepare
from specjax.decoding import loop
from specjax.kernels import ffi
from specjax.model.config import ConfigError
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


def test_the_choice_is_part_of_the_programs_static_spec():
    if not kernels.ensure():
        pytest.skip("the kernels cannot be built here (no C++ compiler)")
    target, draft = testing.pair().target, testing.pair().draft
    request = {k: prepare(target, PROMPTS, method=specjax.Speculative(draft=draft, k=3),
                          max_new_tokens=8, kernels=k) for k in (True, False)}
    assert request[True].spec != request[False].spec
    assert request[True].spec.kernels is ffi.KERNELS and request[False].spec.kernels is None
    # The programs' spec names it in every model config: the target's and the draft's.
    for k, plugin in ((True, ffi.KERNELS), (False, None)):
        traced = loop.lawful(request[k].spec)
        assert traced.target_config.kernels is plugin
        assert traced.method.draft_config.kernels is plugin
        assert traced.target_config.law_width == (1 if k else 16)
    # On, then off, then on again, in one process and with nothing switched between: each
    # program is its own path's (the kernels' calls, or none of them).
    for k in (True, False, True):
        text = lowered(request[k])
        assert (ffi.PRODUCT_TARGET in text) == k and (ffi.ATTENTION_TARGET in text) == k


def test_the_environment_variable_and_bad_values(monkeypatch):
    target = testing.pair().target
    monkeypatch.setenv("SPECJAX_KERNELS", "off")
    assert prepare(target, PROMPTS, max_new_tokens=4).spec.kernels is None
    assert prepare(target, PROMPTS, max_new_tokens=4, kernels=True).spec.kernels is \
        kernels.plugin()                                   # the argument wins
    monkeypatch.setenv("SPECJAX_KERNELS", "maybe")
    with pytest.raises(GenerationError, match="SPECJAX_KERNELS must be on or off, got 'maybe'"):
        prepare(target, PROMPTS, max_new_tokens=4)
    for bad in ("yes", 1, ffi.KERNELS):      # a bool or None only, even the plug-in itself
        with pytest.raises(GenerationError, match="kernels must be True, False or None, got"):
            prepare(target, PROMPTS, max_new_tokens=4, kernels=bad)
        with pytest.raises(GenerationError, match="kernels must be True, False or None, got"):
            specjax.forward(target.params, target.config, [[1]], [[0]], kernels=bad)


def test_a_config_names_a_plug_in_or_none():
    config = testing.pair().target.config
    assert config.kernels is None                  # a loaded model's: a program's choice, not its
    named = config.replace(kernels=ffi.KERNELS)
    assert named != config and hash(named) != hash(config) and named.kernels is ffi.KERNELS
    assert "kernels=Kernels(CPU plug-in)" in repr(named)
    for bad in (True, "on", ffi.KERNELS.product):
        with pytest.raises(ConfigError, match="kernels must be a Kernels or None, got"):
            config.replace(kernels=bad)


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
target = testing.pair().target
tokens, positions = jnp.asarray([[1, 2, 3, 4, 5]], jnp.int32), jnp.arange(5)[None]
def text(kernels):
    f = jax.jit(lambda p, x, q: specjax.forward(p, target.config, x, q, kernels=kernels)[0])
    return f.lower(target.params, tokens, positions).as_text()
before = np.asarray(specjax.forward(target.params, target.config, tokens, positions)[0])
on, off, again = text(None), text(False), text(None)
specjax.generate(target, [[1, 2, 3]], max_new_tokens=2)
after = np.asarray(specjax.forward(target.params, target.config, tokens, positions)[0])
print(json.dumps(dict(on=ffi.PRODUCT_TARGET in on, off=ffi.PRODUCT_TARGET in off,
                      again=ffi.PRODUCT_TARGET in again,
                      same_bits=before.tobytes() == after.tobytes())))
"""


def test_forward_uses_the_kernels_before_any_generate():
    # In a fresh process, `specjax.forward` as its first call takes the kernels as generate
    # does (it used to take them only once a generate had registered them, so its last bits
    # changed after one); `kernels=False` leaves them out, and the next call's default takes
    # them again.
    if not kernels.ensure():
        pytest.skip("the kernels cannot be built here (no C++ compiler)")
    proc = subprocess.run([sys.executable, "-c", FORWARD_SCRIPT], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, SPECJAX_COMPILE_CACHE="off"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == dict(on=True, off=False, again=True,
                                                            same_bits=True)


# -- The model layer reads no state while a function is traced ----------------------------------

MODEL = Path(specjax.__file__).parent / "model"
MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault",
            "add", "discard", "popitem"}


def runtime_state(source: str) -> list[str]:
    """What in a module's source lets a traced function read state set at run time: a `global`
    or `nonlocal` statement, a module-level name changed inside a function (assigned through an
    item or an attribute, or by a mutating method), a cache decorator, or the environment."""
    tree = ast.parse(source)
    names = {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
             for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
             if isinstance(t, ast.Name)}
    found = []
    for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        for deco in function.decorator_list:
            if any(word in ast.unparse(deco) for word in ("cache", "lru_cache")):
                found.append(f"{function.name}: @{ast.unparse(deco)}")
        for node in ast.walk(function):
            if isinstance(node, (ast.Global, ast.Nonlocal)):
                found.append(f"{function.name}: {type(node).__name__.lower()} {node.names}")
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign))
                       else [])
            for t in targets:
                if isinstance(t, (ast.Subscript, ast.Attribute)) and \
                        isinstance(t.value, ast.Name) and t.value.id in names:
                    found.append(f"{function.name}: writes {t.value.id}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in MUTATORS and isinstance(node.func.value, ast.Name) and \
                    node.func.value.id in names:
                found.append(f"{function.name}: {node.func.value.id}.{node.func.attr}()")
    found += [f"reads {word}" for word in ("os.environ", "getenv") if word in source]
    return found


def test_the_model_layer_holds_no_state_a_trace_reads():
    # Which products a program uses is its config's `kernels`, nothing else: no module of
    # specjax/model/ keeps a switch, a registry or a cache that functions change, and none
    # reads the environment.
    modules = sorted(MODEL.glob("*.py"))
    assert len(modules) >= 8
    assert {m.name: runtime_state(m.read_text()) for m in modules} == \
        {m.name: [] for m in modules}


def test_the_state_check_finds_a_switch():
    # The negative control: the switch this layer had (issue 83), and a registry and a cache
    # written without `global`, are each found.
    switch = ("_switch = None\n"
              "def use_kernels(on):\n    global _switch\n    _switch = on\n"
              "def applies():\n    return _switch\n")
    registry = "_plugins = {}\ndef register(k):\n    _plugins['cpu'] = k\n"
    appended = "_seen = []\ndef note(x):\n    _seen.append(x)\n"
    cached = "import functools\n@functools.cache\ndef table(n):\n    return n\n"
    environ = "import os\ndef on():\n    return os.environ.get('SPECJAX_KERNELS')\n"
    assert runtime_state(switch) == ["use_kernels: global ['_switch']"]
    assert runtime_state(registry) == ["register: writes _plugins"]
    assert runtime_state(appended) == ["note: _seen.append()"]
    assert runtime_state(cached) == ["table: @functools.cache"]
    assert runtime_state(environ) == ["reads os.environ"]
