"""Medusa heads: the checkpoint directory, its errors, and greedy equality.

The distribution tests (`test_distribution.py`, cases medusa-*) check Theorem 1 with random
heads and a negative control; `test_smollm2.py` checks the shipped SmolLM2 heads.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest

import specjax
from specjax.api.generate import GenerationError, generate
from specjax.heads import medusa
from specjax.heads.medusa import Heads, HeadsConfig, init_heads
from specjax.io.checkpoint import random_model
from specjax.io.medusa import save_heads
from specjax.sampling.tree import Tree
from tests.support.tiny import llama_config, pair

WEIGHTS = Path(__file__).resolve().parents[2] / "weights"
V = 16
TREES = {"full-2-2": Tree.full((2, 2)), "sparse": Tree.from_paths(((0,), (1,), (0, 0), (0, 0, 0))),
         "chain-3": Tree.chain(3)}


@pytest.fixture(scope="module")
def target():
    return pair(vocab=V, std=1.0)[0]


def random_heads(target, seed=0, tree=None, subset=12):
    config = HeadsConfig(num_heads=3, num_blocks=2, hidden_size=target.config.d_model,
                                 vocab_size=target.config.vocab_size, subset_size=subset)
    ids = np.random.default_rng(seed).permutation(target.config.vocab_size)[:subset]
    return init_heads(config, target, ids, seed=seed, std=0.3, tree=tree)


@pytest.fixture(scope="module")
def heads_dir(target, tmp_path_factory):
    directory = tmp_path_factory.mktemp("heads") / "tiny-medusa"
    return save_heads(random_heads(target, tree=TREES["full-2-2"]), directory)


def test_heads_round_trip(target, heads_dir):
    heads = random_heads(target, tree=TREES["full-2-2"])
    loaded = specjax.load(heads_dir)
    assert isinstance(loaded, Heads) and loaded.name == "tiny-medusa"
    assert loaded.config == heads.config and loaded.tree == heads.tree
    np.testing.assert_array_equal(loaded.token_ids, heads.token_ids)
    assert loaded.target == heads.target
    hidden = jax.random.normal(jax.random.key(0), (5, target.config.d_model))
    want = medusa.subset_logits(medusa.runtime_weights(heads, target), hidden, kernels=None)
    got = medusa.subset_logits(medusa.runtime_weights(loaded, target), hidden, kernels=None)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert got.shape == (5, 3, 12)
    full = medusa.full_logits(medusa.runtime_weights(loaded, target), got, V)
    outside = np.setdiff1d(np.arange(V), loaded.token_ids)
    assert np.all(np.isneginf(np.asarray(full)[..., outside]))


def test_heads_for_another_target_are_refused(target, heads_dir):
    heads = specjax.load(heads_dir)
    other_shape = random_model(llama_config(V, layers=1), seed=1, std=1.0)
    other_weights = random_model(target.config, seed=7, std=1.0)
    for other, words in ((other_shape, "n_layers"), (other_weights, "LM-head weights")):
        with pytest.raises(GenerationError) as e:
            generate(other, [[1, 2]], method=specjax.Medusa(heads=heads), max_new_tokens=2)
        assert str(heads_dir / "config.json") in str(e.value) and words in str(e.value)


@pytest.mark.fast
def test_corrupt_heads_name_the_file(heads_dir, tmp_path):
    def copy(name):
        d = tmp_path / name
        d.mkdir()
        for f in heads_dir.iterdir():
            (d / f.name).write_bytes(f.read_bytes())
        return d

    truncated = copy("truncated")
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[:len(data) // 2])
    bad_json = copy("bad-json")
    (bad_json / "config.json").write_text('{"model_type": "medusa", ')
    deep = copy("deep-tree")
    config = json.loads((deep / "config.json").read_text())
    config["tree"] = [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]
    (deep / "config.json").write_text(json.dumps(config))
    missing = copy("missing-tensor")
    from safetensors.numpy import load_file, save_file
    tensors = load_file(missing / "model.safetensors")
    del tensors["medusa_head.2.1.linear.bias"]
    save_file(tensors, missing / "model.safetensors")
    cases = {truncated: "model.safetensors", bad_json: "config.json",
             deep: "config.json", missing: "medusa_head.2.1.linear.bias"}
    for directory, words in cases.items():
        with pytest.raises(specjax.CheckpointError) as e:
            specjax.load(directory)
        assert str(directory) in str(e.value) and words in str(e.value), str(e.value)


@pytest.mark.fast
def test_bad_medusa_requests_are_errors(target, heads_dir):
    heads = specjax.load(heads_dir)
    build = specjax.api.methods.build
    cases = {       # each made inside the check: a method object checks itself when made
        "needs Medusa heads": lambda: dict(method="medusa"),
        "heads does not apply to method 'speculative'; it is an option of 'medusa'":
            lambda: dict(method=build("speculative", draft=target, heads=heads)),
        "4 deep": lambda: dict(method=specjax.Medusa(heads, tree=Tree.chain(4))),
        "candidates='iid'": lambda: dict(method=specjax.Medusa(heads, candidates="iid"),
                                         sampling=specjax.SamplingParams(temperature=0.0)),
        "heads must be Medusa heads": lambda: dict(method=specjax.Medusa(target)),
        "13 children": lambda: dict(method=specjax.Medusa(heads, tree=Tree.full((13,)))),
    }
    for words, kwargs in cases.items():
        with pytest.raises(GenerationError) as e:
            generate(target, [[1, 2, 3]], max_new_tokens=4, **kwargs())
        assert words in str(e.value), (words, str(e.value))


@pytest.mark.fast
def test_greedy_medusa_equals_autoregressive(target):
    # Ragged rows (one of a single token: its heads read a zero hidden state at first), EOS.
    heads = random_heads(target, seed=1)
    prompts = [[3, 1, 4, 1, 5], [9], [2, 7, 1, 8, 2, 8, 1, 8]]
    eos = (5,)
    ar = generate(target, prompts, sampling=specjax.SamplingParams(temperature=0.0),
                  max_new_tokens=24, eos_ids=eos)
    for name, tree in {**TREES, "none: a chain of one candidate per head": None}.items():
        batch = generate(target, prompts, method=specjax.Medusa(heads=heads, tree=tree),
                         sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=24,
                         eos_ids=eos)
        assert batch.tokens == ar.tokens, name
        assert batch.stats.tree_size == (heads.config.num_heads if tree is None else tree.size)
        assert batch.stats.accepted > 0, name          # the equality is not AR in disguise
    # Alone (the one-token row, whose first step reads a zero hidden state), one shape suffices.
    alone = generate(target, prompts[1:2], method=specjax.Medusa(heads=heads, tree=TREES["sparse"]),
                     sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=24,
                     eos_ids=eos)
    assert alone.tokens == ar.tokens[1:2]


def test_heads_that_agree_with_the_target_accept_whole_paths():
    # A target whose final hidden state is 0 (final-norm scale 0) has all-zero logits, so its
    # greedy token is 0 (argmax takes the first of ties); heads with identity blocks on h = 0
    # also tie everywhere and propose their first token, 0. Every depth is then accepted: a
    # chain of 3 makes 4 tokens per call.
    target = pair(vocab=V, std=1.0)[0]
    params = dict(target.params, final_norm={"scale": np.zeros(target.config.d_model, np.float32)})
    constant = specjax.Model(target.config, params)
    heads = init_heads(HeadsConfig(3, 1, target.config.d_model, V, V), constant)
    out = generate(constant, [[1, 2, 3]], method=specjax.Medusa(heads=heads, tree=Tree.chain(3)),
                   sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=12, eos_ids=())
    assert out.tokens == [[0] * 12]
    assert out.stats.accepted == out.stats.drafted == 9
    assert out.stats.tokens_per_target_call == 4.0


SHIPPED = WEIGHTS / "llama-medusa"


def test_shipped_tiny_heads_give_the_greedy_output():
    target = specjax.load(WEIGHTS / "llama-target")
    heads = specjax.load(SHIPPED)
    ids = target.tokenizer.encode("import os\nimport sys\n\n\ndef read_lines(path):\n").ids
    prompts = [ids, ids[:7], target.tokenizer.encode("class Stack:\n    def push(self, x):").ids]
    ar = generate(target, prompts, sampling=specjax.SamplingParams(temperature=0.0),
                  max_new_tokens=48)
    shipped = generate(target, prompts, method=specjax.Medusa(heads=heads),
                       sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=48)
    assert shipped.tokens == ar.tokens
    # Its card expects 2.25 tokens per call on held-out generations; these prompts are new.
    assert shipped.stats.tokens_per_target_call >= 1.8, shipped.stats
    alone = generate(target, prompts[1:2], method=specjax.Medusa(heads=heads),
                     sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=48)
    assert alone.tokens == ar.tokens[1:2]
    wide = generate(target, prompts, method=specjax.Medusa(heads=heads, tree=Tree.full((3, 2, 1))),
                    sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=48)
    assert wide.tokens == ar.tokens
