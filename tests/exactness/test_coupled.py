"""The coupled rule (`specjax.sampling.coupled`): with `coupled=True` every method returns
autoregressive sampling's tokens under the same seed, at every temperature and control, batched
and alone; its law is the target's (the kit's check), and a rule that shares one noise between
positions is caught; the engine's rule makes the reference's decisions on the same noise.

The identity tests are exact (token for token), so they need no level; the law tests state theirs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax import reference, testing
from specjax.api import generate as api
from specjax.api.generate import GenerationError, generate
from specjax.heads import dflash, eagle
from specjax.heads.medusa import HeadsConfig, init_heads
from specjax.sampling import coupled
from specjax.sampling.logits import SamplingParams, probs_from_logits
from specjax.sampling.rules import COUPLED, Rules
from specjax.sampling.tree import Tree
from tests.support.tiny import pair

V, NEW = 16, 12
PROMPTS = [[1, 4, 2, 1, 4], [3, 3, 7], [5, 1, 9, 2, 6, 8, 1], [2]]
# One row per setting the issue names (T = 0.7 with top-p 0.9, T = 1, top-k with min-p), and a
# greedy row beside them, each with its own seed: per-row settings and seeds in one batch.
ROWS = SamplingParams(temperature=[0.7, 1.0, 0.8, 0.0], top_p=[0.9, 1.0, 1.0, 1.0],
                      top_k=[0, 0, 5, 0], min_p=[0.0, 0.0, 0.1, 0.0])
SEEDS = [11, 12, 13, 14]


@pytest.fixture(scope="module")
def models():
    target, draft = pair(vocab=V, std=1.0)
    ids = np.random.default_rng(0).permutation(V)[:12]
    drafter = eagle.init_drafter(target, token_ids=ids, seed=0, std=0.3, style="specjax",
                                 tree=Tree.full((2, 2)))
    heads = init_heads(HeadsConfig(num_heads=2, num_blocks=1, hidden_size=target.config.d_model,
                                   vocab_size=V, subset_size=8),
                       target, token_ids=np.arange(0, V, 2), seed=4, std=0.5,
                       tree=Tree.full((2, 2)))
    block = dflash.init_block_drafter(target, layers=1, block_size=4, taps=(1, 2), std=0.6,
                                      mask_token_id=V - 1, seed=3)
    return target, draft, drafter, heads, block


def methods(models):
    """Every method and drafting shape the rule serves: chains, trees of each candidate scheme,
    the ragged lookahead schedules, EAGLE's static, dynamic and chain trees, Medusa and DFlash."""
    target, draft, drafter, heads, block = models
    return {
        "speculative k=3": specjax.Speculative(draft, k=3),
        "speculative heuristic": specjax.Speculative(draft, k=4, k_schedule="heuristic"),
        "speculative confidence": specjax.Speculative(draft, k=4, k_schedule="confidence"),
        "speculative tree distinct": specjax.Speculative(draft, tree=Tree.full((2, 2)),
                                                         candidates="distinct"),
        "speculative tree iid": specjax.Speculative(draft, tree=Tree.full((2, 1)),
                                                    candidates="iid"),
        "speculative tree top": specjax.Speculative(draft, tree=Tree.full((2, 2)),
                                                    candidates="top"),
        "ngram k=3": specjax.NGram(k=3),
        "ngram tree": specjax.NGram(tree=Tree.full((2, 2))),
        "medusa": specjax.Medusa(heads),
        "eagle tree": specjax.Eagle(drafter, candidates="distinct"),
        "eagle chain": specjax.Eagle(drafter, k=3),
        "eagle dynamic": specjax.Eagle(drafter, tree=specjax.DynamicTree(3, 2, 5)),
        "dflash": specjax.DFlash(block),
    }


NAMES = [
    "speculative k=3", "speculative heuristic", "speculative confidence",
    "speculative tree distinct", "speculative tree iid", "speculative tree top", "ngram k=3",
    "ngram tree", "medusa", "eagle tree", "eagle chain", "eagle dynamic", "dflash"]


@pytest.fixture(scope="module")
def plain(models):
    return generate(models[0], PROMPTS, "autoregressive", ROWS, max_new_tokens=NEW,
                    seed=SEEDS).tokens


@pytest.mark.fast(cases=["speculative k=3", "eagle tree"])
@pytest.mark.parametrize("name", NAMES)
def test_every_method_returns_autoregressive_samples_under_the_same_seeds(models, plain, name):
    method = methods(models)[name]
    result = generate(models[0], PROMPTS, method, ROWS, max_new_tokens=NEW, seed=SEEDS,
                      coupled=True)
    assert result.tokens == plain
    if name not in ("dflash",):       # a random block drafter's drafts may all be rejected
        assert result.stats.accepted > 0


def test_a_row_is_the_same_alone_and_the_default_rule_is_not_coupled(models, plain):
    target, draft = models[:2]
    for i in (0, 2):
        row = SamplingParams(temperature=ROWS.temperature[i], top_p=ROWS.top_p[i],
                             top_k=ROWS.top_k[i], min_p=ROWS.min_p[i])
        alone = generate(target, [PROMPTS[i]], specjax.Speculative(draft, k=3), row,
                         max_new_tokens=NEW, seed=[SEEDS[i]], coupled=True)
        assert alone.tokens[0] == plain[i]
    # Algorithm 2 samples the same law with other draws: its sampled rows part from these.
    default = generate(target, PROMPTS, specjax.Speculative(draft, k=3), ROWS,
                       max_new_tokens=NEW, seed=SEEDS)
    assert default.tokens[3] == plain[3]                                   # the greedy row
    assert any(default.tokens[i] != plain[i] for i in range(3))


def test_controls_apply_before_the_draw(models):
    target, draft = models[:2]
    sampling = SamplingParams(temperature=0.9, repetition_penalty=1.3, presence_penalty=0.5,
                              logit_bias={3: 2.0}, min_tokens=4)
    kwargs = dict(max_new_tokens=NEW, seed=[5, 6], eos_ids=(7,))
    plain = generate(target, PROMPTS[:2], "autoregressive", sampling, **kwargs).tokens
    fast = generate(target, PROMPTS[:2], specjax.Speculative(draft, k=3), sampling,
                    coupled=True, **kwargs).tokens
    assert fast == plain


def test_settings_stay_data_under_the_rule(models):
    target, draft = models[:2]
    method = specjax.Speculative(draft, k=3)
    generate(target, PROMPTS, method, ROWS, max_new_tokens=NEW, seed=SEEDS, coupled=True)
    cached = len(api._COMPILED)
    other = SamplingParams(temperature=[0.3, 1.2, 0.5, 0.9], top_p=0.8)
    generate(target, PROMPTS, method, other, max_new_tokens=NEW, seed=[1, 2, 3, 4], coupled=True)
    assert len(api._COMPILED) == cached


@pytest.mark.fast
def test_bad_coupled_values_are_errors(models):
    target = models[0]
    with pytest.raises(GenerationError, match="coupled must be True or False"):
        generate(target, [[1]], "ngram", coupled="yes")
    with pytest.raises(GenerationError, match="coupled or rules, not both"):
        generate(target, [[1]], "ngram", coupled=True, rules=Rules())
    # A draft padded past the target's vocabulary (same tokenizer) would widen the noise.
    import dataclasses
    from pathlib import Path
    weights = Path(__file__).resolve().parents[2] / "weights"
    shipped, draft = specjax.load(weights / "llama-target"), specjax.load(weights / "llama-draft")
    wider = dataclasses.replace(draft, config=dataclasses.replace(
        draft.config, vocab_size=draft.config.vocab_size + 8))
    with pytest.raises(GenerationError, match="larger than the target's"):
        generate(shipped, [[1, 2]], specjax.Speculative(wider, k=2), coupled=True)


# -- The engine's rule against the reference's, on the same noise --------------------------------

def _probs(seed: int, shape, temperature=1.0):
    logits = jax.random.normal(jax.random.key(seed), shape) * 2.0
    return probs_from_logits(logits, SamplingParams(temperature=temperature))


@pytest.mark.fast
def test_chain_rule_makes_the_references_decisions_on_the_same_noise():
    b, k = 64, 3
    q = _probs(1, (b, k + 1, V))
    keys = jax.vmap(lambda r: jax.vmap(lambda t: jax.random.fold_in(jax.random.key(r), t))(
        jnp.arange(k + 1)))(jnp.arange(b))                                   # [B, K + 1]
    # Drafts that are the target's draw half the time, so every length of kept prefix occurs.
    y = np.asarray(coupled.draws(keys, q))
    other = np.random.default_rng(0).integers(0, V, (b, k))
    drafts = np.where(np.random.default_rng(1).random((b, k)) < 0.6, y[:, :k], other)
    verdict = coupled.verify(jnp.asarray(drafts), None, q, keys, with_details=True)
    noise = np.asarray(jax.vmap(jax.vmap(lambda key: coupled.gumbel(key, V)))(keys))
    seen = set()
    for row in range(b):
        n, token = reference.coupled_verify_row(np.asarray(q[row], np.float64),
                                                drafts[row].tolist(), noise[row])
        assert (n, token) == (int(verdict.n_accepted[row]), int(verdict.next_token[row])), row
        seen.add(n)
    assert seen == {0, 1, 2, 3}


@pytest.mark.fast
def test_tree_rule_makes_the_references_decisions_on_the_same_noise():
    tree, b = Tree.full((2, 2)), 64
    n = tree.size + 1
    q = _probs(2, (b, n, V))
    keys = jax.vmap(lambda r: jax.vmap(lambda t: jax.random.fold_in(jax.random.key(r), t))(
        jnp.arange(tree.max_depth + 1)))(jnp.arange(b) + 100)               # [B, D + 1]
    noise = np.asarray(jax.vmap(jax.vmap(lambda key: coupled.gumbel(key, V)))(keys))
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, V, (b, n))
    # Put the target's draw among a node's children often, so walks go deep.
    for row in range(b):
        for node in range(n):
            kids = [c for c in tree.children[node] if c >= 0]
            if kids and rng.random() < 0.7:
                tokens[row, kids[rng.integers(len(kids))]] = reference.gumbel_draw(
                    np.asarray(q[row, node]), noise[row, tree.depth[node]])
    verdict = coupled.verify_tree(tree, "iid", jnp.asarray(tokens), jnp.ones((b, n), bool), None,
                                  q, keys)
    depths = set()
    for row in range(b):
        path, token = reference.coupled_verify_tree(tree.children, tokens[row],
                                                    np.asarray(q[row]), noise[row])
        assert len(path) == int(verdict.n_accepted[row]), row
        assert path == np.asarray(verdict.path[row])[:len(path)].tolist(), row
        assert token == int(verdict.next_token[row]), row
        depths.add(len(path))
    assert depths == {0, 1, 2}


@pytest.mark.fast
def test_the_references_coupled_speculative_sampling_is_its_autoregressive_sampling(models):
    target, draft = models[:2]
    sampling = SamplingParams(temperature=0.8, top_p=0.95)
    for seed in range(3):
        assert (reference.coupled_speculative(target, draft, PROMPTS[0], 10, seed, sampling, k=3)
                == reference.coupled_autoregressive(target, PROMPTS[0], 10, seed, sampling))


# -- The law: the kit's lossless check, and a shared noise it must reject ------------------------

def _shared_noise_verify(draft_tokens, draft_probs, target_probs, keys, num_drafted=None,
                         with_details=False):
    """The coupled rule drawing every position of a step with the noise of its first: the
    draws of one step share g, so consecutive tokens are dependent beyond q's conditioning."""
    shared = jnp.broadcast_to(keys[:, :1], keys.shape)
    return coupled.verify(draft_tokens, draft_probs, target_probs, shared, num_drafted,
                          with_details)


T07_TOP_P = SamplingParams(temperature=0.7, top_p=0.9)


@pytest.mark.parametrize("method, options", [("speculative", {}),
                                             ("speculative", {"tree": Tree.full((2, 2)),
                                                              "candidates": "distinct"}),
                                             ("ngram", {})])
def test_the_coupled_rule_is_lossless(method, options):
    # 30,000 samples of 3 tokens from the kit's close pair; the kit's four G-tests at 0.005.
    # (Medusa, EAGLE and DFlash under the rule return autoregressive sampling's tokens token
    # for token above, which is stronger than a law.)
    report = testing.check(testing.specjax_rules(COUPLED, method=method, k=2, **options),
                           samples=30_000, sampling=T07_TOP_P, level=0.005)
    assert report.lossless, str(report)


def test_one_noise_for_every_position_of_a_row_is_caught(monkeypatch):
    # The control: g(seed) instead of g(seed, t), every draw of a row (autoregressive
    # sampling's included) with one noise. The programs are compiled anew with it, and again
    # after it.
    from specjax.decoding import autoregressive, state

    def one_noise(decode_state, count):
        keys = decode_state.row_keys
        return jnp.broadcast_to(keys[:, None], (keys.shape[0], count))

    monkeypatch.setattr(state, "position_keys", one_noise)
    monkeypatch.setattr(autoregressive, "position_keys", one_noise)
    api.release_programs()
    try:
        report = testing.check(testing.specjax_rules(COUPLED, method="speculative", k=2),
                               samples=30_000, sampling=T07_TOP_P, level=0.005)
    finally:
        monkeypatch.undo()
        api.release_programs()
    assert not report.lossless, str(report)


def test_one_noise_for_every_position_of_a_step_is_caught():
    bad = Rules(candidates=coupled.candidates, verify=_shared_noise_verify,
                verify_tree=coupled.verify_tree, by_position=True)
    report = testing.check(testing.specjax_rules(bad, method="speculative", k=2),
                           samples=30_000, sampling=T07_TOP_P, level=0.005)
    assert not report.lossless, str(report)


@pytest.mark.parametrize("name", ["speculative k=3", "eagle tree"])
def test_explain_shows_each_positions_draw_and_the_drafts_kept(models, name):
    target = models[0]
    method = methods(models)[name]
    sampling = SamplingParams(temperature=0.9)
    steps = specjax.explain(target, PROMPTS[0], method, sampling, steps=3, seed=5, coupled=True,
                            max_new_tokens=NEW)
    want = generate(target, [PROMPTS[0]], method, sampling, seed=5, coupled=True,
                    max_new_tokens=NEW).tokens[0]
    assert [t for s in steps for t in s.new_tokens] == want[:sum(len(s.new_tokens) for s in steps)]
    for step in steps:
        *kept, last = step.positions
        assert all(p.kept and p.draw in p.drafts for p in kept)
        assert not last.kept and last.draw not in last.drafts and last.draw == step.emitted
        assert step.new_tokens == [p.draw for p in step.positions][:len(step.new_tokens)]
    assert "target draws" in specjax.format_steps(steps)


@pytest.mark.parametrize("name", ["speculative k=3", "eagle tree"])
def test_the_identity_holds_on_xlas_path(models, name):
    # The kernels off (what a GPU or TPU runs): verify calls equal one-token steps there too.
    kwargs = dict(max_new_tokens=NEW, seed=SEEDS, kernels=False)
    plain = generate(models[0], PROMPTS, "autoregressive", ROWS, **kwargs).tokens
    fast = generate(models[0], PROMPTS, methods(models)[name], ROWS, coupled=True, **kwargs)
    assert fast.tokens == plain
