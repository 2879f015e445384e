"""specjax.reference, the plain NumPy algorithm, held equal to the engine: its logits are
`specjax.forward`'s, its distribution is `probs_from_logits`'s, on the same uniform draws it
makes the decisions of `rejection.verify_tree` (the chain's `verify_row`: tests/
docs/test_walkthrough.py), its greedy tokens are `specjax.generate`'s, and `specjax.testing.check`
finds its samplers lossless while a broken one is rejected."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax import reference
from specjax.io.checkpoint import random_model
from specjax.model.transformer import in_dtype
from specjax.reference import decoding
from specjax.reference import sampling as reference_sampling
from specjax.sampling import rejection
from specjax.sampling.logits import probs_from_logits
from specjax.testing import verdict
from specjax.testing.reference_samplers import REFERENCE
from tests.support.tiny import close_pair, llama_config

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def _engine_logits(model, tokens) -> np.ndarray:
    tokens = np.asarray([tokens], np.int32)
    positions = np.arange(tokens.shape[1], dtype=np.int32)[None]
    return np.asarray(specjax.forward(model.params, model.config, tokens, positions)[0][0])


def _variants():
    """Tiny random models covering every branch of the forward pass."""
    gpt2 = specjax.ModelConfig(arch="gpt2", vocab_size=11, d_model=16, n_layers=2, n_heads=4,
                               n_kv_heads=4, head_dim=4, d_ff=24, max_positions=32,
                               norm_eps=1e-5, activation="gelu", tie_embeddings=False,
                               qkv_bias=True, out_bias=True, mlp_bias=True)
    llama3 = (("factor", 8.0), ("high_freq_factor", 4.0), ("low_freq_factor", 1.0),
              ("original_max_position_embeddings", 16.0), ("rope_type", "llama3"))
    qwen3 = llama_config(vocab=9, d=24, layers=2, heads=6, kv_heads=2).replace(
        qk_norm=True, qkv_bias=True, out_bias=True, mlp_bias=True, rope_theta=500.0,
        rope_scaling=llama3, tie_embeddings=True)
    linear = llama_config(vocab=7, d=16, heads=4, kv_heads=1).replace(
        rope_scaling=(("factor", 2.0), ("rope_type", "linear")))
    return {"gpt2-exact-gelu-untied": gpt2, "qwen3-gqa-biases-llama3-rope": qwen3,
            "llama-mqa-linear-rope": linear}


@pytest.mark.fast(cases=["weights/gpt2-target", "weights/llama-target"])
@pytest.mark.parametrize("name", ["weights/gpt2-target", "weights/llama-target", "close-pair",
                                  *_variants()])
def test_logits_equal_the_engine(name):
    # float32 logits [T, V] of 24 tokens equal specjax.forward's to 1e-5: the shipped tiny GPT-2
    # and Llama targets, the kit's pair, and random models for exact GELU with an untied head,
    # Qwen3's q/k norm with GQA, biases and llama3 RoPE scaling, and MQA with linear scaling.
    if name.startswith("weights/"):
        model = specjax.load(ROOT / name)
    elif name == "close-pair":
        model = close_pair(vocab=8, std=0.5, noise=0.3)[0]
    else:
        model = random_model(_variants()[name], seed=3, std=0.3)
    tokens = np.random.default_rng(0).integers(0, model.config.vocab_size, 24).tolist()
    ours = reference.forward(model, tokens)
    assert ours.shape == (24, model.config.vocab_size) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, _engine_logits(model, tokens), rtol=1e-5, atol=1e-5)


def test_int8_weights_are_dequantised_and_q8_0_is_refused():
    model = in_dtype(specjax.load(ROOT / "weights/llama-target"), "int8")
    tokens = list(range(5, 21))
    np.testing.assert_allclose(reference.forward(model, tokens), _engine_logits(model, tokens),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="q8_0"):
        reference.forward(in_dtype(model, "q8_0"), tokens)


@pytest.mark.deep_model
def test_logits_equal_the_engine_at_smollm2_shape():
    # SmolLM2-135M's shape (30 layers, 9 query heads over 3 key/value heads of 64, vocabulary
    # 49,152, tied), random weights: 8 tokens' logits equal to 1e-4.
    config = specjax.ModelConfig(arch="llama", vocab_size=49152, d_model=576, n_layers=30,
                                 n_heads=9, n_kv_heads=3, head_dim=64, d_ff=1536,
                                 max_positions=8192, norm_eps=1e-5, activation="silu",
                                 tie_embeddings=True, rope_theta=100000.0)
    model = random_model(config, seed=0, std=0.05)
    tokens = [1, 504, 3000, 77, 49151, 12, 9, 8000]
    np.testing.assert_allclose(reference.forward(model, tokens), _engine_logits(model, tokens),
                               rtol=1e-4, atol=1e-4)


SETTINGS = [reference.Sampling(1.0), reference.Sampling(0.0), reference.Sampling(0.7, top_k=3),
            reference.Sampling(1.3, top_p=0.8), reference.Sampling(1.0, min_p=0.2),
            reference.Sampling(0.9, top_k=5, top_p=0.7, min_p=0.1)]


@pytest.mark.fast
@pytest.mark.parametrize("sampling", SETTINGS, ids=str)
def test_probs_are_the_engines_distribution(sampling):
    # 300 rows of 9 logits, a third with integer logits (ties, which rank by id), one all -inf
    # and one with -inf entries: reference.probs equals probs_from_logits to 1e-6, zeros where
    # it has zeros (the same tokens kept).
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 2, (300, 9)).astype(np.float32)
    logits[::3] = rng.integers(-2, 3, (100, 9))
    logits[5], logits[7, :4] = -np.inf, -np.inf
    engine = np.asarray(probs_from_logits(jnp.asarray(logits), specjax.SamplingParams(
        *sampling)))
    ours = np.array([reference.probs(row, sampling) for row in logits])
    np.testing.assert_allclose(ours, engine, atol=1e-6)
    np.testing.assert_array_equal(ours > 0, engine > 0)


def _tree_rows(rng, rows, tree, rule, vocab=5):
    """Verify inputs for a tree per row, float64, with degenerate cases: a node left empty, a
    sibling repeating a token, q = 0 at a candidate, and p = q."""
    n = tree.size + 1
    p = rng.dirichlet(np.full(vocab, 0.5), (rows, n))
    q = rng.dirichlet(np.full(vocab, 0.5), (rows, n))
    q[rng.random((rows, n, vocab)) < 0.2] = 0.0
    q[..., 0] += 1e-3
    q /= q.sum(-1, keepdims=True)
    q[1::4] = p[1::4]
    tokens = rng.integers(0, vocab, (rows, n))
    # Each child drawn from its parent's p (without replacement when the rule says so).
    for row in range(rows):
        for node in range(n):
            drawn = []
            for child in tree.children[node]:
                if child < 0:
                    continue
                left = p[row, node].copy()
                if rule == "without_replacement":
                    left[drawn] = 0
                tokens[row, child] = rng.choice(vocab, p=left / left.sum())
                drawn.append(tokens[row, child])
    valid = rng.random((rows, n)) > 0.1
    return p, q, tokens, valid


@pytest.mark.parametrize("rule", reference.RULES)
def test_the_tree_walk_decides_as_verify_tree(rule):
    # On the same uniform draws, reference.verify_tree accepts the same path as the engine's
    # walk and draws the next token from the same distribution (1e-12, float64), on 400 rows of
    # a tree with widths (3, 2) under each candidate rule; every outcome occurs.
    tree = specjax.Tree.full((3, 2))
    rows = 400
    p, q, tokens, valid = _tree_rows(np.random.default_rng(2), rows, tree, rule)
    with jax.enable_x64(True):
        verdict_ = rejection.verify_tree(tree, rule, jnp.asarray(tokens), jnp.asarray(valid),
                                         jnp.asarray(p), jnp.asarray(q),
                                         jax.random.split(jax.random.key(0), rows),
                                         with_details=True)
    n, path = np.asarray(verdict_.n_accepted), np.asarray(verdict_.path)
    u, final = np.asarray(verdict_.details["u"], np.float64), np.asarray(verdict_.details["final"])
    children = tree.children.tolist()
    for row in range(rows):
        ours, dist = reference.verify_tree(children, tokens[row], p[row], q[row], u[row], rule,
                                           valid[row])
        assert ours == path[row, :n[row]].tolist(), row
        np.testing.assert_allclose(dist, final[row], rtol=0, atol=1e-12)
    assert set(n) == {0, 1, 2}


GREEDY = specjax.SamplingParams(temperature=0.0)


def test_greedy_tokens_equal_generate():
    # At temperature 0 the reference's autoregressive, speculative (k = 3), n-gram (k = 3) and
    # tree (widths 2, 2, each candidate rule) tokens are specjax.generate's, 12 of them.
    target, draft = close_pair(vocab=8, std=0.5, noise=0.3)
    prompt, n, rng = [0, 5, 2, 7, 1], 12, np.random.default_rng(0)
    run = dict(max_new_tokens=n, seed=3, eos_ids=())
    engine = {m: specjax.generate(target, [prompt], method, GREEDY, **run).tokens[0]
              for m, method in (("autoregressive", "autoregressive"),
                                ("speculative", specjax.Speculative(draft=draft, k=3)),
                                ("ngram", specjax.NGram(k=3)))}
    assert engine["autoregressive"] == engine["speculative"] == engine["ngram"]
    assert reference.autoregressive(target, prompt, n, rng, GREEDY) == engine["autoregressive"]
    assert reference.speculative(target, draft, prompt, n, rng, GREEDY, k=3) == engine["speculative"]
    assert reference.ngram(target, prompt, n, rng, GREEDY, k=3) == engine["ngram"]
    for rule in reference.RULES:
        assert reference.speculative_tree(target, draft, prompt, n, rng, GREEDY,
                                           rule=rule) == engine["autoregressive"]
    assert len(set(engine["autoregressive"])) > 1


@pytest.mark.fast
def test_the_ngram_lookup_is_the_engines():
    # The longest n-gram wins, then the most recent occurrence, starting before the suffix;
    # the engine's lookup on the same buffers drafts the same tokens.
    from specjax.decoding import ngram as engine_ngram

    rng = np.random.default_rng(4)
    lookup = jax.jit(engine_ngram.lookup, static_argnums=(2, 3, 4))     # one program
    for _ in range(200):
        tokens = rng.integers(0, 4, rng.integers(1, 14)).tolist()
        ours = reference.ngram_lookup(tokens, k=3, max_ngram=3, min_ngram=1)
        buffer = jnp.asarray(tokens + [0] * (24 - len(tokens)), jnp.int32)
        draft, count = lookup(buffer, len(tokens), 3, 3, 1)
        assert ours == np.asarray(draft)[:int(count)].tolist(), tokens
    assert reference.ngram_lookup([5, 6, 7, 5, 6], k=4) == [7, 5, 6]


def test_the_kit_finds_the_reference_lossless_and_a_broken_one_not(monkeypatch):
    # specjax.testing runs the kit's reference samplers (`REFERENCE`: autoregressive,
    # speculative, n-gram and a tree drawn without replacement, at T = 0.7, top-p 0.9) on the
    # kit's close pair, 6,000 samples of 3 tokens each, family-wise level 0.01: every one is
    # lossless. Negative controls at the same size and level: the speculative sampler with a
    # verify that accepts every draft, and the tree walk with a residual that a rejection does
    # not update (q stays q), are both rejected.
    verdicts = verdict.run(REFERENCE, samples=6_000, seed=0)
    assert all(v.report.lossless for v in verdicts), verdict.table(verdicts, 0.01)

    def accept_all(p, q, drafted, u):
        return len(drafted), q[len(drafted)]

    monkeypatch.setattr(decoding, "verify_row", accept_all)
    monkeypatch.setattr(reference_sampling, "residual", lambda p, q: q)
    broken = verdict.run([REFERENCE[1], REFERENCE[3]], samples=6_000, seed=0)
    assert not any(v.report.lossless for v in broken), verdict.table(broken, 0.01)


@pytest.mark.fast
def test_bad_arguments_are_named():
    target, draft = close_pair(vocab=8, std=0.5, noise=0.3)
    rng = np.random.default_rng(0)
    for call, match in (
            (lambda: reference.speculative(target, draft, [1], 4, rng, k=0), "k must be"),
            (lambda: reference.autoregressive(target, [], 4, rng), "prompt"),
            (lambda: reference.autoregressive(target, [1], 0, rng), "n must be"),
            (lambda: reference.autoregressive(target, [1], 2, 7), "rng must be"),
            (lambda: reference.ngram(target, [1], 2, rng, max_ngram=1, min_ngram=2), "max_ngram"),
            (lambda: reference.speculative_tree(target, draft, [1], 2, rng, rule="x"), "rule"),
            (lambda: reference.speculative_tree(target, draft, [1], 2, rng, widths=()), "widths"),
            (lambda: reference.autoregressive(target, [1], 2, rng, specjax.SamplingParams(
                repetition_penalty=1.2)), "repetition_penalty"),
            (lambda: reference.autoregressive(target, [1], 2, rng, reference.Sampling(-1.0)),
             "temperature"),
            (lambda: reference.autoregressive(target, [1], 2, rng, reference.Sampling(top_p=0)),
             "top_p"),
            (lambda: reference.forward(target, [1, 8]), "token ids"),
            (lambda: reference.forward(object(), [1]), "specjax.Model")):
        with pytest.raises((ValueError, TypeError), match=match):
            call()


@pytest.mark.fast
def test_the_layout_page_records_the_reference_as_it_is():
    # docs/layout.md's "The reference" states the package's lines, in all and module by module,
    # and names the tests that hold it to the engine: each number is the file's, each test
    # exists.
    import re

    import tests.docs.test_walkthrough as walkthrough

    section = (ROOT / "docs" / "layout.md").read_text().split("\n## The reference\n")[1]
    text = " ".join(section.split("\n## ")[0].split())
    counts = {p.name: len(p.read_text().splitlines())
              for p in sorted((ROOT / "specjax" / "reference").glob("*.py"))}
    assert f"{sum(counts.values())} lines in four modules" in text and len(counts) == 4
    for name, lines in counts.items():
        assert f"`{name}` {lines}" in text, name
    named = set(re.findall(r"`(test_\w+)`", text))
    assert named and all(name in globals() or hasattr(walkthrough, name) for name in named)


@pytest.mark.fast
def test_the_command_line_check_lists_the_reference_samplers(capsys):
    # `python -m specjax check --reference --list` lists the catalogue and, after it, the kit's
    # reference samplers, each as an exact scheme; without --reference they are not run.
    import argparse

    from specjax.cli import check

    parser = argparse.ArgumentParser()
    check.add_arguments(parser)
    assert check.run(parser.parse_args(["--reference", "--list"])) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[-len(REFERENCE):]] == [e.name for e in REFERENCE]
    assert all(" exact " in line for line in lines[-len(REFERENCE):])
    assert not {e.name for e in REFERENCE} & {e.name for e in check.entries(
        parser.parse_args([]))}
