"""Drafters in their target's dtype: the draft model, Medusa heads and EAGLE drafters run in the
target's dtype by default (`drafter_dtype=` / `--drafter-dtype` override it), and every product
they make goes through `specjax.model.linear`, so the CPU kernels serve it as they serve the
target's. Each dtype keeps greedy decoding equal to greedy autoregressive decoding."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax import kernels as specjax_kernels
from specjax.api.generate import GenerationError, generate, prepare
from specjax.cli.main import main
from specjax.heads import eagle, medusa
from specjax.heads.medusa import HeadsConfig, init_heads
from specjax.io.checkpoint import random_model
from specjax.model.cache import KVCache
from specjax.decoding.loop import with_kernels
from specjax.model.quant import Int8Weight, Q8_0Weight
from specjax.model.transformer import in_dtype
from specjax.testing.law import llama_config

V = 16
PROMPTS = [[1, 2, 3, 4, 5], [7, 3, 9]]


@pytest.fixture(scope="module")
def models():
    """A target (64 wide: 8-bit blocks of 32) and a smaller draft, float32."""
    target = random_model(llama_config(V, d=64, layers=2, heads=4, kv_heads=2), seed=1,
                                  std=0.5)
    draft = random_model(llama_config(V, d=32, layers=1, heads=2, kv_heads=1), seed=2,
                                 std=0.5)
    ids = np.random.default_rng(0).permutation(V)[:12]
    drafter = eagle.init_drafter(target, token_ids=ids, seed=3, std=0.3, style="specjax",
                                 tree=specjax.Tree.full((2, 2)))
    heads = init_heads(HeadsConfig(num_heads=3, num_blocks=1, hidden_size=64,
                                                   vocab_size=V, subset_size=12),
                               target, ids, seed=4, std=0.3, tree=specjax.Tree.full((2, 2)))
    return target, draft, drafter, heads


def _leaves(tree):
    return jax.tree.leaves(tree, is_leaf=lambda a: isinstance(a, Int8Weight))


def _floating_dtypes(tree) -> set[str]:
    return {str(a.dtype) for a in _leaves(tree)
            if not isinstance(a, Int8Weight) and jnp.issubdtype(a.dtype, jnp.floating)}


@pytest.mark.parametrize("dtype", ["bfloat16", "int8", "q8_0"])
def test_drafters_follow_the_target_dtype_unless_told(models, dtype):
    target, draft, drafter, heads = models
    t = in_dtype(target, dtype)
    for override in (None, "float32"):
        want = override or dtype
        greedy = specjax.SamplingParams(temperature=0.0)
        r = prepare(t, PROMPTS, specjax.Eagle(drafter, drafter_dtype=override), greedy)
        assert r.spec.method.drafter_config.layer.dtype == want
        w = r.weights.drafter
        m = prepare(t, PROMPTS, specjax.Medusa(heads, drafter_dtype=override), greedy).weights
        s = prepare(t, PROMPTS, specjax.Speculative(draft, drafter_dtype=override), greedy)
        assert s.spec.method.draft_config.dtype == want
        if want in ("int8", "q8_0"):
            for matrix in (w["fc"]["w"], w["proj"], w["layers"][0]["wq"],
                           m.heads["blocks"][0][0]["w"], m.heads["proj"],
                           s.weights.draft["layers"]["w_up"]):
                assert type(matrix) is (Q8_0Weight if want == "q8_0" else Int8Weight)
            # The target's own 8-bit rows, not quantised again.
            head = t.params["lm_head"]
            assert np.array_equal(w["proj"].values, head.values[drafter.token_ids])
            assert _floating_dtypes((w, m.heads, s.weights.draft)) == {"float32"}
        else:
            assert _floating_dtypes((w, m.heads, s.weights.draft)) == {want}


@pytest.mark.parametrize("dtype", ["bfloat16", "int8", "q8_0"])
def test_greedy_decoding_with_drafters_in_the_target_dtype_equals_autoregressive(models, dtype):
    target, draft, drafter, heads = models
    t = in_dtype(target, dtype)
    want = generate(t, PROMPTS, sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=12).tokens
    # EAGLE on its own tree, or a chain of 4 (not the dtype's chain of 2, `EAGLE_TREES`).
    eagle = (specjax.Eagle(drafter, tree=drafter.tree) if drafter.tree is not None
             else specjax.Eagle(drafter, k=4))
    for method in (specjax.Speculative(draft, k=3), specjax.Medusa(heads), eagle):
        got = generate(t, PROMPTS, method, specjax.SamplingParams(temperature=0.0),
                       max_new_tokens=12)
        assert got.tokens == want, method.name


@pytest.mark.fast
@pytest.mark.skipif(not specjax_kernels.ensure(), reason="needs the CPU kernels (a C++ compiler)")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "q8_0"])
def test_every_drafter_product_is_a_kernel_call(models, dtype):
    # A drafting call of each drafter (EAGLE: 4 pairs read with its cache), lowered for the CPU
    # with configs that name the kernels: no XLA dot is left in it (an einsum beside `linear`
    # would be one).
    target, _, drafter, heads = models
    t = in_dtype(target, dtype)
    d = eagle.with_dtype(drafter, dtype)
    plugin = specjax_kernels.plugin()
    weights, config = eagle.runtime_weights(d, t), with_kernels(d.config, plugin)
    h = jnp.zeros((1, 4, 64), t.config.compute_dtype)
    tokens = jnp.zeros((1, 4), jnp.int32)

    def eagle_call(weights, h):
        cache = KVCache.init(config.layer, 1, 16, first=config.first_slot)
        out, _ = eagle.draft_features(weights, config, eagle.embedding(weights, t.params), h,
                                      tokens, jnp.arange(4)[None], cache)
        return eagle.draft_logits(weights, config, out)

    def medusa_call(weights, h):      # two rows' states (one row is XLA's mat-vec in float32)
        return medusa.subset_logits(weights, h[0, :2], kernels=plugin)

    heads_weights = medusa.runtime_weights(heads, t, dtype)
    for fn, w in ((eagle_call, weights), (medusa_call, heads_weights)):
        text = jax.jit(fn).lower(w, h).as_text()
        assert "specjax_few_rows" in text, fn.__name__
        assert "dot_general" not in text, fn.__name__


@pytest.mark.fast
def test_bad_drafter_dtypes_are_named_errors(models):
    target, draft, drafter, _ = models
    with pytest.raises(GenerationError, match="drafter_dtype must be one of"):
        prepare(target, PROMPTS, method=specjax.Eagle(drafter=drafter, drafter_dtype="float16"))
    with pytest.raises(GenerationError, match="drafter_dtype must be one of"):
        prepare(target, PROMPTS, method=specjax.Speculative(draft=draft, drafter_dtype=32))
    with pytest.raises(GenerationError, match="drafter_dtype does not apply to method 'ngram'; "
                                              "it is an option of 'speculative', 'medusa'"):
        prepare(target, PROMPTS, specjax.api.methods.build("ngram", drafter_dtype="bfloat16"))


def test_the_cli_refuses_a_bad_drafter_dtype():
    out = subprocess.run([sys.executable, "-m", "specjax", "generate", "--preset", "tiny-llama",
                          "--method", "autoregressive", "--drafter-dtype", "bfloat16",
                          "--prompt", "hi", "-n", "2"], capture_output=True, text=True)
    assert out.returncode == 2, out
    assert out.stderr.strip().count("\n") == 0, out.stderr
    assert "--drafter-dtype does not apply to --method autoregressive" in out.stderr, out.stderr
    out = subprocess.run([sys.executable, "-m", "specjax", "generate", "--drafter-dtype",
                          "float16"], capture_output=True, text=True)
    assert out.returncode == 2 and "--drafter-dtype" in out.stderr


@pytest.mark.fast
@pytest.mark.parametrize("run", ["--oracle", "--settings"])
def test_the_bench_refuses_a_drafter_dtype_its_run_would_ignore(run, capsys, tmp_path):
    assert main(["bench", "--quick", run, "--drafter-dtype", "bfloat16",
                 "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and f"--drafter-dtype does not apply to {run}" in err[0], err
    assert not (tmp_path / "results.json").exists()
