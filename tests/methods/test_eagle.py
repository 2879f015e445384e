"""EAGLE drafters: the checkpoint directory, its errors, the drafter in the loop against its
training forward, and greedy equality; for specjax's style of EAGLE-1 (the shipped drafters)
and the published EAGLE-1 and EAGLE-3 (`test_published_drafters.py` has their layouts and the
parity with a PyTorch forward written from the published description).

The distribution tests (`test_distribution.py`, cases eagle-*) check Theorem 1 with random
drafters and a negative control; `test_smollm2.py` checks the shipped SmolLM2 drafter.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax.api.generate import GenerationError, generate, prepare
from specjax.decoding import eagle as eagle_decoding
from specjax.decoding import loop
from specjax.heads import eagle
from specjax.heads.eagle import Drafter
from specjax.io.checkpoint import random_model
from specjax.io.eagle import save_drafter
from specjax.model.transformer import hidden_states, in_dtype, tapped_states
from specjax.sampling.tree import Tree
from tests.support.tiny import llama_config, pair

WEIGHTS = Path(__file__).resolve().parents[2] / "weights"
V = 16
TREES = {"chain-4": Tree.chain(4),
         "sparse": Tree.from_paths(((0,), (1,), (2,), (0, 0), (1, 0), (0, 0, 0))),
         "dynamic-3-2-5": specjax.DynamicTree(3, 2, 5),
         "dynamic-4-3-9": specjax.DynamicTree(4, 3, 9)}


@pytest.fixture(scope="module")
def target():
    return pair(vocab=V, std=1.0)[0]


def random_drafter(target, seed=0, tree=None, subset=12, std=0.3, **options):
    """specjax's style with a subset head by default; `kind="eagle3"` (and `taps`) for a
    published EAGLE-3 drafter whose draft vocabulary is the subset."""
    ids = np.random.default_rng(seed).permutation(target.config.vocab_size)[:subset]
    if options.get("kind") != "eagle3":
        options.setdefault("style", "specjax")
    return eagle.init_drafter(target, token_ids=ids, seed=seed, std=std, tree=tree, **options)


@pytest.fixture(scope="module")
def drafter_dir(target, tmp_path_factory):
    directory = tmp_path_factory.mktemp("eagle") / "tiny-eagle"
    return save_drafter(random_drafter(target, tree=Tree.full((2, 2))), directory)


def test_drafter_round_trip(target, drafter_dir, tmp_path):
    drafter = random_drafter(target, tree=Tree.full((2, 2)))
    loaded = specjax.load(drafter_dir)
    assert isinstance(loaded, Drafter) and loaded.name == "tiny-eagle"
    assert loaded.config == drafter.config and loaded.tree == drafter.tree
    assert loaded.target == drafter.target
    np.testing.assert_array_equal(loaded.token_ids, drafter.token_ids)
    for a, b in zip(jax.tree.leaves(drafter.params), jax.tree.leaves(loaded.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))     # float32: exact
    dynamic = dataclasses.replace(drafter, tree=specjax.DynamicTree(4, 3, 9))
    half = specjax.load(save_drafter(dynamic, tmp_path / "half", storage="float16"))
    for a, b in zip(jax.tree.leaves(drafter.params), jax.tree.leaves(half.params)):
        np.testing.assert_array_equal(np.asarray(a, np.float16).astype(np.float32), b)
    assert half.tree == specjax.DynamicTree(4, 3, 9)


def test_a_sampled_default_tree_round_trips_and_serves_sampled_calls(target, tmp_path):
    """`Drafter.sampled_tree`: saved as config.json's "sampled_tree"; `generate` uses it when a
    row samples and no tree is given, the greedy default when every row is greedy."""
    drafter = dataclasses.replace(random_drafter(target, tree=specjax.DynamicTree(3, 2, 5)),
                                  sampled_tree=Tree.chain(2))
    loaded = specjax.load(save_drafter(drafter, tmp_path / "two-defaults"))
    assert loaded.tree == specjax.DynamicTree(3, 2, 5) and loaded.sampled_tree == Tree.chain(2)
    assert specjax.load(save_drafter(random_drafter(target), tmp_path / "one")).sampled_tree is None

    def spec_tree(temperature, tree=None):
        return prepare(target, [[1, 2, 3]], specjax.Eagle(loaded, tree=tree),
                       specjax.SamplingParams(temperature=temperature),
                       max_new_tokens=4).spec.method.tree
    assert spec_tree(0.0) == specjax.DynamicTree(3, 2, 5)
    assert spec_tree([0.7]) == Tree.chain(2)
    assert spec_tree(1.0, tree=Tree.chain(3)) == Tree.chain(3)   # the caller's wins
    result = generate(target, [[1, 2, 3], [4, 5]], method=specjax.Eagle(drafter=loaded),
                      sampling=specjax.SamplingParams(temperature=[0.0, 1.0]), max_new_tokens=6,
                      seed=2)
    assert result.stats.tree_size == 2


def test_without_a_tree_or_k_eagle_runs_its_dtypes_measured_tree_in_the_api_as_on_the_cli(target):
    """`api.methods.EAGLE_TREES` (issue 92): `Eagle(drafter)` on a target in a dtype with a
    measured tree runs it (a chain of 2 in bfloat16, int8 and q8_0), the drafter's own tree in
    float32; a tree or k given wins; the command line's measured default is the same table."""
    from specjax.api.methods import EAGLE_TREES
    from specjax.bench.methods import measured_default
    drafter = random_drafter(target, tree=Tree.full((2, 2)))

    def spec_tree(model, **given):
        return prepare(model, [[1, 2, 3]], specjax.Eagle(drafter, **given),
                       specjax.SamplingParams(temperature=0.0),
                       max_new_tokens=4).spec.method.tree
    assert spec_tree(target) == Tree.full((2, 2))
    for dtype in ("bfloat16", "int8", "q8_0"):
        model = in_dtype(target, dtype)
        assert spec_tree(model) == EAGLE_TREES[dtype] == Tree.chain(2), dtype
        assert spec_tree(model, k=3) == Tree.chain(3)
        assert spec_tree(model, tree=Tree.full((2, 2))) == Tree.full((2, 2))
        assert measured_default("eagle", dtype) == (("tree", EAGLE_TREES[dtype]),)


def test_eagle3_drafter_round_trip_and_its_errors(target, tmp_path):
    drafter = random_drafter(target, kind="eagle3", taps=(0, 1), tree=Tree.chain(2))
    directory = save_drafter(drafter, tmp_path / "eagle3")
    assert json.loads((directory / "config.json").read_text())["taps"] == [0, 1]
    loaded = specjax.load(directory)
    assert loaded.config == drafter.config and loaded.config.taps == (0, 1)
    for a, b in zip(jax.tree.leaves(drafter.params), jax.tree.leaves(loaded.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    d = target.config.d_model
    assert loaded.params["fc"]["w"].shape == (d, 2 * d)      # two tapped layers

    config = json.loads((directory / "config.json").read_text())
    for change, words in (({"taps": [1, 0]}, "increasing"), ({"taps": [-1, 0]}, "increasing"),
                          ({"taps": "0,1"}, "a list"), ({"taps": [1]}, "'fc.weight' has shape"),
                          ({"fused_layers": [1, 2]}, "no longer read")):
        broken = tmp_path / f"broken-{len(list(tmp_path.iterdir()))}"
        broken.mkdir()
        (broken / "model.safetensors").write_bytes((directory / "model.safetensors").read_bytes())
        (broken / "config.json").write_text(json.dumps(dict(config, **change)))
        with pytest.raises(specjax.CheckpointError, match=words):
            specjax.load(broken)
    deep = dataclasses.replace(drafter, config=dataclasses.replace(drafter.config, taps=(1, 2)))
    with pytest.raises(GenerationError, match=r"after \[1, 2\] layers.* has 2"):
        generate(target, [[1, 2]], method=specjax.Eagle(drafter=deep), max_new_tokens=2)
    with pytest.raises(ValueError, match="past the target's 2 layers"):
        eagle.init_drafter(target, kind="eagle3", taps=(1, 2))
    with pytest.raises(ValueError, match="no three distinct default"):
        eagle.init_drafter(target, kind="eagle3")


@pytest.mark.fast
def test_drafter_for_another_target_is_refused(target, drafter_dir):
    drafter = specjax.load(drafter_dir)
    other_shape = random_model(llama_config(V, layers=1), seed=1, std=1.0)
    other_weights = random_model(target.config, seed=7, std=1.0)
    for other, words in ((other_shape, "n_layers"), (other_weights, "LM-head weights")):
        with pytest.raises(GenerationError) as e:
            generate(other, [[1, 2]], method=specjax.Eagle(drafter=drafter), max_new_tokens=2)
        assert str(drafter_dir / "config.json") in str(e.value) and words in str(e.value)


@pytest.mark.fast
def test_corrupt_drafters_name_the_file(drafter_dir, tmp_path):
    from safetensors.numpy import load_file, save_file

    def copy(name):
        d = tmp_path / name
        d.mkdir()
        for f in drafter_dir.iterdir():
            (d / f.name).write_bytes(f.read_bytes())
        return d

    def rewrite(directory, change):
        tensors = load_file(directory / "model.safetensors")
        change(tensors)
        save_file(tensors, directory / "model.safetensors")
        return directory

    truncated = copy("truncated")
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[:len(data) // 2])
    bad_json = copy("bad-json")
    (bad_json / "config.json").write_text('{"model_type": "eagle", ')
    no_layer = copy("no-layer")
    config = json.loads((no_layer / "config.json").read_text())
    del config["layer"]
    (no_layer / "config.json").write_text(json.dumps(config))
    cases = {
        truncated: "model.safetensors", bad_json: "config.json", no_layer: "'layer'",
        rewrite(copy("missing"), lambda t: t.pop("layers.0.wq")): "missing tensor 'layers.0.wq'",
        rewrite(copy("shape"), lambda t: t.update({"fc.bias": np.zeros(3, np.float32)})):
            "'fc.bias' has shape (3,)",
        rewrite(copy("nan"), lambda t: t["norm.weight"].__setitem__(0, np.nan)): "non-finite",
        rewrite(copy("ids"), lambda t: t.update({"token_ids": np.full(12, 3, np.int32)})):
            "distinct ids",
        rewrite(copy("extra"), lambda t: t.update({"lm_head": np.zeros(2, np.float32)})):
            "unexpected tensor",
    }
    for directory, words in cases.items():
        with pytest.raises(specjax.CheckpointError) as e:
            specjax.load(directory)
        assert str(directory) in str(e.value) and words in str(e.value), str(e.value)


@pytest.mark.fast
def test_bad_eagle_requests_are_errors(target, drafter_dir):
    drafter = specjax.load(drafter_dir)
    build = specjax.api.methods.build
    cases = {       # each made inside the check: a method object checks itself when made
        "needs an EAGLE drafter": lambda: dict(method="eagle"),
        "drafter does not apply to method 'speculative'; it is an option of 'eagle' and "
        "'dflash'": lambda: dict(method=build("speculative", draft=target, drafter=drafter)),
        "candidates='iid'": lambda: dict(method=specjax.Eagle(drafter, candidates="iid"),
                                         sampling=specjax.SamplingParams(temperature=0.0)),
        "drafter must be an EAGLE drafter": lambda: dict(method=specjax.Eagle(target)),
        "13 children": lambda: dict(method=specjax.Eagle(drafter, tree=Tree.full((13,)))),
    }
    for words, kwargs in cases.items():
        with pytest.raises(GenerationError) as e:
            generate(target, [[1, 2, 3]], max_new_tokens=4, **kwargs())
        assert words in str(e.value), (words, str(e.value))
    gpt2 = random_model(specjax.ModelConfig(
        arch="gpt2", vocab_size=V, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, head_dim=16,
        d_ff=64, max_positions=64, norm_eps=1e-5, activation="gelu_tanh", tie_embeddings=True))
    with pytest.raises(ValueError, match="Llama-family"):
        eagle.init_drafter(gpt2)


@pytest.mark.slow
def test_greedy_eagle_equals_autoregressive(target):
    # Ragged rows (one of a single token, whose first pair has a zero feature), an EOS.
    drafter = random_drafter(target, seed=1)
    prompts = [[3, 1, 4, 1, 5], [9], [2, 7, 1, 8, 2, 8, 1, 8]]
    eos = (5,)
    ar = generate(target, prompts, sampling=specjax.SamplingParams(temperature=0.0),
                  max_new_tokens=24, eos_ids=eos)
    for name, tree in TREES.items():
        batch = generate(target, prompts, method=specjax.Eagle(drafter=drafter, tree=tree),
                         sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=24,
                         eos_ids=eos)
        assert batch.tokens == ar.tokens, name
        assert batch.stats.accepted > 0, name          # the equality is not AR in disguise
    for name in ("sparse", "dynamic-4-3-9"):
        alone = generate(target, prompts[1:2],
                         method=specjax.Eagle(drafter=drafter, tree=TREES[name]),
                         sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=24,
                         eos_ids=eos)
        assert alone.tokens == ar.tokens[1:2], name
    chain = generate(target, prompts, method=specjax.Eagle(drafter=drafter, k=3),
                     sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=24,
                     eos_ids=eos)   # no tree: a chain of k
    assert chain.tokens == ar.tokens and chain.stats.tree_size == 3


PUBLISHED = {"eagle1": dict(style="published", head="target", subset=V),
             "eagle3": dict(kind="eagle3", taps=(0, 1)),
             "eagle3-norm-before-residual": dict(kind="eagle3", taps=(0, 1),
                                                 norm_before_residual=True)}


@pytest.mark.fast(cases=["eagle3"])
@pytest.mark.parametrize("kind", PUBLISHED)
def test_greedy_published_eagle_equals_autoregressive(target, kind):
    drafter = random_drafter(target, seed=4, **PUBLISHED[kind])
    prompts = [[3, 1, 4, 1, 5], [9], [2, 7, 1, 8, 2, 8, 1, 8]]
    ar = generate(target, prompts, sampling=specjax.SamplingParams(temperature=0.0),
                  max_new_tokens=24, eos_ids=(5,))
    for name in ("sparse", "dynamic-4-3-9"):
        out = generate(target, prompts, method=specjax.Eagle(drafter=drafter, tree=TREES[name]),
                       sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=24,
                       eos_ids=(5,))
        assert out.tokens == ar.tokens, name
        assert out.stats.accepted > 0, name


def test_tapped_states_are_the_residual_stream_after_each_count_of_layers(target):
    from specjax.model.transformer import decoder_layers, final_norm

    tokens = jnp.asarray([[3, 1, 4, 1, 5, 9]])
    positions = jnp.arange(6)[None]
    final, tapped, _ = tapped_states(target.params, target.config, tokens, positions,
                                     taps=(1, 2))
    x = target.params["embed"][tokens]
    first = jax.tree.map(lambda a: a[:1], target.params["layers"])
    after_one, _ = decoder_layers(first, target.config, x, positions)
    after_two, _ = decoder_layers(target.params["layers"], target.config, x, positions)
    np.testing.assert_allclose(tapped, jnp.concatenate([after_one, after_two], -1), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_array_equal(final, hidden_states(target.params, target.config, tokens,
                                                       positions)[0])
    np.testing.assert_allclose(final, final_norm(target.params, target.config, after_two),
                               rtol=1e-5, atol=1e-6)


def _reference_chain(target, drafter, depth, width):
    """A function of the committed tokens (padded to `width`) and their count L: the chain of
    `depth` top drafts after them, computed from scratch the way training computes the drafter:
    the target's features of the whole sequence, the pairs (f_{s-1}, x_s), one causal call with
    no cache, then autoregressing by writing (own feature, own token) at slot L, L + 1, ...
    Padding past the pairs in use changes nothing: every call is causal."""
    weights = eagle.runtime_weights(drafter, target)

    @jax.jit
    def chain(tokens, length):                            # [width] int32, [] int32
        ids = jnp.pad(tokens, (0, depth))[None]           # room for the drafted tokens
        positions = jnp.arange(ids.shape[1])[None]
        if drafter.config.taps:
            _, f, _ = tapped_states(target.params, target.config, ids, positions,
                                    taps=drafter.config.taps)
            f = eagle.from_target(weights, drafter.config, f)
        else:
            f, _ = hidden_states(target.params, target.config, ids, positions)
        features = jnp.concatenate([jnp.zeros_like(f[:, :1]), f[:, :-1]], axis=1)
        drafted, first = [], drafter.config.first_slot     # published: no pair in slot 0
        for i in range(depth):
            out, _ = eagle.draft_features(weights, drafter.config, target.params["embed"],
                                          features[:, first:], ids[:, first:],
                                          positions[:, first:])
            last = out[0, length - 1 + i - first]         # the newest pair's output
            best = weights["ids"][jnp.argmax(eagle.draft_logits(weights, drafter.config, last))]
            drafted.append(best)
            features = features.at[0, length + i].set(last)
            ids = ids.at[0, length + i].set(best)
        return jnp.stack(drafted)

    return chain


@pytest.mark.parametrize("kind", ["shipped", "eagle3"])
def test_drafter_in_the_loop_matches_its_training_forward(kind, target):
    """Step by step, the chain the decoding loop drafts (catch-up over the pairs the last step
    committed, cached slots, tree attention) equals the from-scratch computation; steps that
    accept 0, 1 and 2 tokens all occur, so the catch-up reads windows of 1, 2 and 3 pairs.
    The shipped tiny drafter accepts often enough for that; a random EAGLE-3 drafter on the
    small target (reading the states after 0 and 1 layers) at least 0 and 1."""
    if kind == "shipped":
        target = specjax.load(WEIGHTS / "llama-target")
        drafter = specjax.load(WEIGHTS / "llama-eagle")
        prompts = [target.tokenizer.encode("def read_lines(path):\n").ids,
                   target.tokenizer.encode("import os\n").ids]
    else:
        drafter = random_drafter(target, seed=4, kind="eagle3", taps=(0, 1))
        prompts = [[3, 1, 4, 1, 5], [2, 7, 1, 8, 2, 8, 1, 8]]
    depth = 3
    request = prepare(target, prompts,
                      method=specjax.Eagle(drafter=drafter, tree=Tree.chain(depth)),
                      sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=40,
                      eos_ids=())
    programs = loop.programs(request.spec)
    state = programs.init(request.weights, *request.inputs)
    draft = jax.jit(lambda w, s: eagle_decoding.draft_tree(request.spec, w, s,
                                                           s.row_keys)[0].tokens)
    width = request.spec.buffer_length
    reference = _reference_chain(target, drafter, depth, width)
    seen = set()
    while not bool(np.all(np.asarray(state.done))):
        nodes = np.asarray(draft(request.weights, state))
        for b in range(2):
            if not bool(state.done[b]):
                want = reference(state.tokens[b], state.length[b])
                assert nodes[b, 1:].tolist() == np.asarray(want).tolist()
        before = np.asarray(state.accepted)
        state = programs.step(request.weights, state)
        seen |= set((np.asarray(state.accepted) - before).tolist())
    assert ({0, 1, 2} if kind == "shipped" else {0, 1}) <= seen, seen


def test_shipped_tiny_drafter_gives_the_greedy_output():
    target = specjax.load(WEIGHTS / "llama-target")
    drafter = specjax.load(WEIGHTS / "llama-eagle")
    prompts = ["def read_lines(path):\n", "class Config:\n    def __init__(self"]
    ar = generate(target, prompts, sampling=specjax.SamplingParams(temperature=0.0),
                  max_new_tokens=48)
    for tree in (None, Tree.chain(2), Tree.full((2, 2))):
        out = generate(target, prompts, method=specjax.Eagle(drafter=drafter, tree=tree),
                       sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=48)
        assert out.tokens == ar.tokens
        assert out.stats.tokens_per_target_call > 1.5, (tree, out.stats)


def _reference_dynamic_tree(target, drafter, tokens, shape):
    """EAGLE-2's selection (`sampling.tree.DynamicTree`) computed from scratch: every path's
    drafter outputs by causal calls with no cache over the whole sequence, the pool in the
    order made, the N best by score (the earlier of equal scores first). Returns the chosen
    nodes' (token, parent node) in pool order, node 0 being the root."""
    weights = eagle.runtime_weights(drafter, target)
    f, _ = hidden_states(target.params, target.config, jnp.asarray([tokens]),
                         jnp.arange(len(tokens))[None])
    base = jnp.concatenate([jnp.zeros_like(f[:, :1]), f[:, :-1]], axis=1)[0]

    def output(path, outputs):      # the drafter's output at the path's last node
        features = jnp.concatenate([base, jnp.stack(outputs)]) if outputs else base
        ids = jnp.asarray([tokens + path])
        out, _ = eagle.draft_features(weights, drafter.config, target.params["embed"],
                                      features[None], ids, jnp.arange(ids.shape[1])[None])
        return out[0, -1]

    pool = []                                   # (token, score, parent pool index or -1)
    frontier = [((), [], 0.0, -1)]              # (path, outputs along it, score, pool index)
    for d in range(shape.depth):
        made = []
        for path, outputs, score, index in frontier:
            out = output(list(path), outputs)
            logp = np.asarray(jax.nn.log_softmax(eagle.draft_logits(weights, drafter.config,
                                                                    out)))
            for j in np.argsort(-logp, kind="stable")[:shape.top_k]:
                made.append((path + (int(weights["ids"][j]),), outputs + [out],
                             score + float(logp[j]), index))
        start = len(pool)
        pool += [(p[-1], s, i) for p, _, s, i in made]
        order = sorted(range(len(made)), key=lambda j: (-made[j][2], j))[:shape.top_k]
        frontier = [(made[j][0], made[j][1], made[j][2], start + j) for j in order]
    chosen = sorted(sorted(range(len(pool)), key=lambda j: (-pool[j][1], j))[:shape.total_tokens])
    node_of = {j: i + 1 for i, j in enumerate(chosen)}
    return [(pool[j][0], node_of.get(pool[j][2], 0)) for j in chosen]


@pytest.mark.slow
@pytest.mark.parametrize("shape", [specjax.DynamicTree(3, 2, 5), specjax.DynamicTree(2, 3, 7)])
def test_dynamic_tree_matches_eagle2_selection_from_scratch(target, shape):
    """The loop's dynamic tree (frontiers read with tree attention among the drafter's own
    nodes, the pool, the top-N, the parents and sibling ranks) equals EAGLE-2's selection
    recomputed path by path, at the first step and after two more; and its trees are well
    formed."""
    drafter = random_drafter(target, seed=2, std=0.5)
    request = prepare(target, [[3, 1, 4, 1, 5], [9, 2]],
                      method=specjax.Eagle(drafter=drafter, tree=shape),
                      sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=12,
                      eos_ids=())
    programs = loop.programs(request.spec)
    state = programs.init(request.weights, *request.inputs)

    def candidates(w, s):
        drafted = eagle_decoding.draft_dynamic_tree(request.spec, w, s)[0]
        return drafted.tokens, drafted.valid, drafted.tree
    build = jax.jit(candidates)
    for _ in range(3):
        nodes, valid, trees_ = (np.asarray(a) if not hasattr(a, "children") else a
                                for a in build(request.weights, state))
        for b in range(2):
            committed = np.asarray(state.tokens[b, :int(state.length[b])]).tolist()
            want = _reference_dynamic_tree(target, drafter, committed, shape)
            got = [(int(nodes[b, i]), int(trees_.parent[b, i])) for i in range(1, len(want) + 1)]
            assert valid[b].all() and got == want
            children = np.asarray(trees_.children[b])
            for i in range(1, shape.total_tokens + 1):      # each node is its parent's child
                assert i in children[int(trees_.parent[b, i])]
            depth = np.asarray(trees_.depth[b])
            assert np.all(depth[1:] == depth[np.asarray(trees_.parent[b, 1:])] + 1)
        state = programs.step(request.weights, state)
