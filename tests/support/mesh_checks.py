"""Decoding on a device mesh equals decoding on one device (`specjax.mesh`).

Run by tests/engine/test_mesh.py in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8,
so that the rest of the suite keeps one device; the file name keeps pytest from collecting it
on its own. Every comparison is against the same function run on device 0 in this process.

What is compared, and why it may be exact: a split matrix product sums partial products on
each device and then adds the parts, a different order of float additions than one device's.
Logits are therefore compared to the parity tolerance (1e-4 of the logit scale, as against
transformers), and tokens exactly: greedy tokens flip only if two logits tie to within that
rounding, and sampled tokens (Gumbel-max, per-row keys that do not depend on the mesh) only if
a draw falls within it of a boundary. These models and seeds do neither; were a change to make
one flip, the failure would show the first differing row and position.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax import mesh as meshes
from specjax.api.generate import GenerationError, prepare
from specjax.cli.main import main
from specjax.decoding import loop
from specjax.heads.medusa import HeadsConfig, init_heads
from specjax.io.checkpoint import random_model, save
from specjax.mesh import make_mesh, MeshError
from specjax.model.cache import KVCache
from specjax.model.transformer import forward

MESHES = ((1, 8), (2, 4), (4, 2), (8, 1))
TOL = 1e-4          # of the logit scale, as in test_parity


def test_eight_devices():
    assert len(jax.devices()) == 8, "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"


def gpt2_config(heads=4):
    return specjax.ModelConfig(arch="gpt2", vocab_size=64, d_model=32, n_layers=2, n_heads=heads,
                               n_kv_heads=heads, head_dim=32 // heads, d_ff=128, max_positions=64,
                               norm_eps=1e-5, activation="gelu_tanh", tie_embeddings=True,
                               qkv_bias=True, out_bias=True, mlp_bias=True)


def llama_config(heads, kv_heads, head_dim=8, vocab=64, d_ff=64, layers=2):
    return specjax.ModelConfig(arch="llama", vocab_size=vocab, d_model=32, n_layers=layers,
                               n_heads=heads, n_kv_heads=kv_heads, head_dim=head_dim, d_ff=d_ff,
                               max_positions=64, norm_eps=1e-6, activation="silu",
                               tie_embeddings=False)


CONFIGS = {"gpt2": gpt2_config(), "llama-gqa": llama_config(8, 2), "llama-mqa": llama_config(8, 1),
           # 6 query and 3 key/value heads: model=4 divides neither, model=2 only the queries.
           "llama-6-heads": llama_config(6, 3)}


def logits(model, tokens, mesh=None):
    """Logits of a prefill-shaped call through a fresh cache (the path decoding takes)."""
    config, params = model.config, model.params
    b, t = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    cache = KVCache.init(config, b, 16)
    if mesh is not None:
        params = meshes.shard_params(params, config, mesh)
        rows = meshes.rows(mesh)
        tokens, positions = jax.device_put(tokens, rows), jax.device_put(positions, rows)
        heads = meshes.cache_sharding(config, mesh)
        cache = KVCache(jax.device_put(cache.k, heads), jax.device_put(cache.v, heads),
                        jax.device_put(cache.length, rows))
    out, _ = jax.jit(forward, static_argnums=1)(params, config, tokens, positions, cache)
    return np.asarray(out)


@pytest.mark.parametrize("name", CONFIGS)
def test_forward_logits_on_every_mesh(name):
    model = random_model(CONFIGS[name], seed=3, std=0.3)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (8, 6)), jnp.int32)
    expected = logits(model, tokens)
    scale = np.abs(expected).max()
    for data, model_axis in MESHES:
        got = logits(model, tokens, make_mesh(data, model_axis))
        diff = np.abs(got - expected).max()
        assert diff <= TOL * scale, f"{name} on {data}x{model_axis}: max |diff| {diff:.3g}"


def test_parameters_are_split_as_the_table_says(tmp_path):
    """load(mesh=) puts each weight straight onto its shards: heads, MLP width and vocabulary
    split over "model", norms whole on every device, the values those of a plain load."""
    config = llama_config(8, 4)
    path = save(random_model(config, seed=1), tmp_path / "m")
    mesh = make_mesh(2, 4)
    plain, sharded = specjax.load(path), specjax.load(path, mesh=mesh)
    layer = sharded.params["layers"]                   # stacked along L (2 layers), never split
    expected = {"wq": (2, 2, 8, 32), "wk": (2, 1, 8, 32), "wv": (2, 1, 8, 32),
                "wo": (2, 32, 2, 8), "w_gate": (2, 16, 32), "w_up": (2, 16, 32),
                "w_down": (2, 32, 16)}
    for name, shape in expected.items():
        assert meshes.shard_shape(layer[name]) == shape, name
        assert len(layer[name].sharding.device_set) == 8
    assert meshes.shard_shape(layer["attn_norm"]["scale"]) == (2, 32)
    assert meshes.shard_shape(sharded.params["embed"]) == (16, 32)
    assert meshes.shard_shape(sharded.params["lm_head"]) == (16, 32)
    for a, b in zip(jax.tree.leaves(plain.params), jax.tree.leaves(sharded.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # Each device holds a quarter of the split weights and all of the norms.
    whole = sum(a.nbytes for a in jax.tree.leaves(plain.params))
    assert meshes.bytes_per_device(sharded.params) < whole / 3


def test_heads_the_model_axis_does_not_divide_are_replicated():
    """The documented fallback: 6 query / 3 key-value heads on model=4 keep attention whole on
    every device (and the cache), while the MLP and vocabulary are still split; on model=2 the
    query heads split and the key/value heads and cache stay whole."""
    config = CONFIGS["llama-6-heads"]
    params = random_model(config).params
    for model_axis, wq, wk in ((4, (6, 8, 32), (3, 8, 32)), (2, (3, 8, 32), (3, 8, 32))):
        mesh = make_mesh(2, model_axis)
        layer = meshes.shard_params(params, config, mesh)["layers"]     # [L, ...], L = 2
        assert meshes.shard_shape(layer["wq"]) == (2, *wq)
        assert meshes.shard_shape(layer["wk"]) == (2, *wk)
        assert meshes.shard_shape(layer["w_gate"]) == (2, 64 // model_axis, 32)
        assert meshes.cache_sharding(config, mesh).spec == jax.sharding.PartitionSpec(
            None, "data", None)
        assert "is not a multiple of" in meshes.plan(config, mesh)


# -- Decoding -----------------------------------------------------------------------------------

PROMPTS = [[1, 2, 3, 1, 2], [4, 5], [6, 7, 1, 6, 7, 1, 6], [2], [3, 3, 3]]  # 5 rows: padded to 6


@pytest.fixture(scope="module")
def models():
    """A target whose heads (8 query, 4 key/value), MLP and vocabulary all split 4 ways, a
    draft, Medusa heads."""
    # One layer each: these checks compile 20 decoding programs, and compile time grows with
    # depth; the forward tests above cover two layers.
    target = random_model(llama_config(8, 4, head_dim=4, vocab=16, d_ff=64, layers=1),
                                  seed=1, std=1.0)
    draft = random_model(llama_config(2, 1, vocab=16, d_ff=32, layers=1), seed=2,
                                 std=1.0)
    heads = init_heads(HeadsConfig(num_heads=2, num_blocks=1, hidden_size=32,
                                                   vocab_size=16, subset_size=16),
                               target, seed=0, std=0.3)
    return target, draft, heads


CASES = {           # each case's method, given the draft and the heads
    "autoregressive": lambda draft, heads: specjax.Autoregressive(),
    "speculative": lambda draft, heads: specjax.Speculative(draft, k=3),
    "speculative-tree": lambda draft, heads: specjax.Speculative(
        draft, tree=((0,), (1,), (0, 0), (0, 1))),
    "speculative-heuristic": lambda draft, heads: specjax.Speculative(draft, k=4,
                                                                      k_schedule="heuristic"),
    "speculative-confidence": lambda draft, heads: specjax.Speculative(draft, k=4,
                                                                       k_schedule="confidence"),
    "ngram": lambda draft, heads: specjax.NGram(k=3),
    "ngram-tree": lambda draft, heads: specjax.NGram(tree=((0,), (0, 0), (1,))),
    "medusa": lambda draft, heads: specjax.Medusa(heads, tree=((0,), (1,), (0, 0))),
}


def decode(models, case, mesh=None, temperature=0.0, **options):
    """A case decoded on one device or a mesh; `options` replace the method's."""
    target, draft, heads = models
    method = dataclasses.replace(CASES[case](draft, heads), **options)
    return specjax.generate(target, PROMPTS, method,
                            specjax.SamplingParams(temperature=temperature),
                            max_new_tokens=12, seed=7, mesh=mesh)


def assert_same_tokens(expected, got, label):
    assert len(expected.tokens) == len(got.tokens), label
    for row, (a, b) in enumerate(zip(expected.tokens, got.tokens)):
        assert a == b, f"{label}: row {row}: {a} on one device, {b} on the mesh"


@pytest.mark.parametrize("case", CASES)
def test_greedy_tokens_equal_one_device(models, case):
    expected = decode(models, case)
    got = decode(models, case, make_mesh(2, 4))
    assert_same_tokens(expected, got, case)
    # The padded row is not counted: the same calls as on one device.
    assert got.stats.rows == len(PROMPTS)
    assert got.stats.target_calls == expected.stats.target_calls
    assert got.stats.accepted == expected.stats.accepted


def test_sampled_tokens_equal_one_device(models):
    expected = decode(models, "autoregressive", temperature=1.0)
    got = decode(models, "autoregressive", make_mesh(2, 4), temperature=1.0)
    assert_same_tokens(expected, got, "autoregressive sampled")
    # Speculative sampling on the other shape of mesh, with the draft split on request too.
    expected = decode(models, "speculative", temperature=1.0)
    got = decode(models, "speculative", make_mesh(4, 2), temperature=1.0,
                 shard_draft=True)
    assert_same_tokens(expected, got, "speculative sampled, draft split")


def test_state_is_laid_out_on_the_mesh(models):
    """Rows over "data", the target's cache also over "model" by key/value head, the
    replicated draft's cache whole over "model"; stream gives generate's tokens."""
    target, draft, _ = models
    mesh = make_mesh(2, 4)
    request = prepare(target, PROMPTS, method=specjax.Speculative(draft=draft, k=3),
                      sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=12,
                      mesh=mesh)
    init = loop.programs(request.spec).init
    state = init(request.weights, *request.inputs)
    b, slots = 6, request.spec.buffer_length                         # 5 rows padded to 6
    assert meshes.shard_shape(state.tokens) == (b // 2, slots)
    layers, draft_layers = target.config.n_layers, draft.config.n_layers
    assert meshes.shard_shape(state.target_cache.k) == (layers, b // 2, 1, 4, slots)  # K=4 over 4
    assert meshes.shard_shape(state.target_cache.v) == (layers, b // 2, 1, slots, 4)
    assert meshes.shard_shape(state.carry.draft_cache.k) == (draft_layers, b // 2, 1, 8, slots)
    assert meshes.shard_shape(state.length) == (b // 2,)
    assert meshes.shard_shape(request.weights.draft["layers"]["wq"]) == (draft_layers, 2, 8, 32)
    streamed = [[] for _ in PROMPTS]
    for new, result in specjax.stream(target, PROMPTS, method=specjax.Speculative(draft=draft, k=3),
                                      sampling=specjax.SamplingParams(temperature=0.0),
                                      max_new_tokens=12, mesh=mesh):
        for row, tokens in zip(streamed, new):
            row.extend(tokens)
    assert streamed == result.tokens == decode(models, "speculative", mesh).tokens


def test_mesh_errors(models):
    target = models[0]
    with pytest.raises(GenerationError, match="mesh must be a jax.sharding.Mesh"):
        specjax.generate(target, PROMPTS, max_new_tokens=4, mesh="data=2,model=4")
    wrong = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 4), ("batch", "model"))
    with pytest.raises(GenerationError, match=r"axes \('data', 'model'\)"):
        specjax.generate(target, PROMPTS, max_new_tokens=4, mesh=wrong)
    explicit = jax.make_mesh((2, 4), ("data", "model"),
                             axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    with pytest.raises(GenerationError, match="must be of type AxisType.Auto"):
        specjax.generate(target, PROMPTS, max_new_tokens=4, mesh=explicit)
    draft = models[1]
    with pytest.raises(GenerationError, match="shard_draft must be True or False, got 1"):
        specjax.generate(target, PROMPTS, specjax.Speculative(draft, shard_draft=1),
                         max_new_tokens=4)
    with pytest.raises(GenerationError, match="shard_draft applies"):
        specjax.generate(target, PROMPTS, specjax.Speculative(draft, shard_draft=True),
                         max_new_tokens=4)
    with pytest.raises(MeshError, match="needs 16 devices; 8 available"):
        make_mesh(4, 4)
    with pytest.raises(MeshError, match="model must be an integer >= 1"):
        make_mesh(2, 0)


def test_cli_mesh_gives_the_same_tokens(capsys):
    argv = ["generate", "--preset", "tiny-llama", "--prompt", "def add(a, b):", "-n", "8",
            "--method", "speculative", "--json"]
    assert main(argv) == 0
    single = json.loads(capsys.readouterr().out)
    assert main(argv + ["--mesh", "data=2,model=4"]) == 0
    captured = capsys.readouterr()
    sharded = json.loads(captured.out)
    assert "mesh data=2 x model=4" in captured.err
    tokens = lambda report: [r["tokens"] for r in report["results"]]  # noqa: E731
    assert tokens(sharded) == tokens(single)


def test_prefill_groups_rows_within_each_data_shard(models):
    """16 ragged rows on data=2: each shard's 8 rows are sorted and read in 2 groups on their
    own devices (no gather of prompts or caches across "data"), with one device's tokens."""
    target = models[0]
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 16, int(n)).tolist() for n in rng.integers(1, 24, 16)]
    mesh = make_mesh(2, 4)
    kwargs = dict(sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=6)
    expected = specjax.generate(target, prompts, **kwargs)
    assert_same_tokens(expected, specjax.generate(target, prompts, mesh=mesh, **kwargs),
                       "16 rows on 2x4")
    request = prepare(target, prompts, mesh=mesh, **kwargs)
    init = loop.programs(request.spec).init
    hlo = init.lower(request.weights, *request.inputs).compile().as_text()
    moved = [line for line in hlo.splitlines() if "all-gather(" in line or "all-to-all(" in line]
    assert not moved, moved[:3]


def test_training_splits_each_batch_over_data(tmp_path):
    """A drafter trained data-parallel (`train(..., mesh=)`, `--mesh data=N`): each batch split
    by row over "data", the gradients summed across devices, so the weights are one device's
    to float rounding (measured: 6e-7 after 4 steps that moved them by 4e-3), and the drafter
    decodes exactly. The batch must split; a model axis is refused."""
    from specjax.presets import WEIGHTS
    from specjax.train import eagle3
    from specjax.train.state import TrainError

    target = specjax.load(WEIGHTS / "llama-target")
    prompts = ["def add(a, b):", "class Stack:", "import os", "for i in range(", "while True:",
               "x = [", "def main():", "return"]
    data = eagle3.features(target, eagle3.continuations(target, prompts, max_new_tokens=8),
                           (1, 2, 3))
    config = eagle3.TrainConfig(steps=4, batch=4, draft_vocab=256, learning_rate=2e-3,
                                warmup=1)
    leaves = lambda drafter: [np.asarray(a) for a in jax.tree.leaves(drafter.params)]  # noqa
    start, one = (eagle3.train(target, data, config, stop_after=s) for s in (0, None))
    moved = max(np.max(np.abs(a - b)) for a, b in zip(leaves(one), leaves(start)))
    ar = specjax.generate(target, prompts, sampling=specjax.SamplingParams(temperature=0.0),
                          max_new_tokens=8)
    for size in (2,):
        split = eagle3.train(target, data, config, mesh=make_mesh(data=size, model=1))
        apart = max(np.max(np.abs(a - b)) for a, b in zip(leaves(one), leaves(split)))
        assert apart < 1e-5 < 1e-3 < moved, (apart, moved)
        got = specjax.generate(target, prompts, method=specjax.Eagle(drafter=split),
                               sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=8)
        assert got.tokens == ar.tokens
    with pytest.raises(TrainError, match="data-parallel: a mesh of data=N"):
        eagle3.train(target, data, config, mesh=make_mesh(data=2, model=2))
    with pytest.raises(TrainError, match="batch 3 does not split over the mesh's data=2"):
        eagle3.train(target, data, eagle3.TrainConfig(steps=4, batch=3, draft_vocab=256),
                     mesh=make_mesh(data=2, model=1))
    out, lines = tmp_path / "heads", tmp_path / "prompts.txt"
    lines.write_text("\n".join(prompts) + "\n")
    assert main(["train", "medusa", "--preset", "tiny-llama", "--prompts", str(lines),
                 "--out", str(out), "--held-out", "2", "--max-new-tokens", "8", "--steps", "2",
                 "--batch", "4", "--heads", "2", "--mesh", "data=4",
                 # Timing 16 trees' steps on 8 host devices took 3 minutes of this check; what
                 # it checks is the split, and test_train times them on one device.
                 "--verify-cost", "flat"]) == 0
    assert json.loads((out / "train_log.json").read_text())["tokens_per_target_call_t0"] >= 1
