"""Theorem 1 end to end: every method samples exactly the target model's distribution.

Setup. A tiny random target (vocab V = 6) and a draft made from it with noisy weights
(they agree on roughly half the drafts, like a real pair). From a fixed prompt we
enumerate all V^L = 216 continuations of length L = 3 and compute their exact probability
under the target with the same `probs_from_logits` (temperature, top-k, top-p) the samplers
use. Each case then draws N = 100,000 continuations in ONE `generate` call (one row per
sample, each row its own random stream) and compares the counts with the exact law by a
G-test (cells with expected count < 5 pooled).

Level. The family of positive cases is tested at alpha = 0.01 in total, Bonferroni-corrected:
each case must have p > 0.01 / (number of positive cases). The seeds are fixed, so the outcome
is deterministic: the test cannot flake, and any change that moves the sampled law enough to be
seen at this sample size turns it red.

Negative controls. The same test, same seeds and sample size, must REJECT (p < the same
per-case level) each deliberately broken sampler below; this shows the test has the power to
see those bugs, which are the ones found in public speculative-sampling code.

Precisions. A chain, a static tree and EAGLE's dynamic tree run again with the pair in
bfloat16, in int8 (8-bit matrices) and in q8_0 (8-bit matrices and activations), each against
the exact law of the target in that precision, with a negative control of each family in each
precision: Theorem 1 is about the model that runs.

Token trees draw N = 30,000 samples per case: a tree call feeds several times the tokens of a
chain, and at 30,000 every tree negative control below is rejected with p < 1e-100 (measured;
the weakest, without-replacement draws verified as i.i.d., at p = 5e-134), so a larger sample
would buy no power on these bugs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax.api.generate import generate
from specjax.heads.eagle import init_drafter
from specjax.heads.medusa import HeadsConfig, init_heads
from specjax.model.transformer import Model, cast_params
from specjax.sampling import rejection, rules
from specjax.sampling.logits import SamplingParams, probs_from_logits, sample
from specjax.sampling.rules import Rules, propose
from specjax.sampling.tree import DynamicTree, Tree
from specjax.testing import gtest, law as laws
from tests.support.tiny import close_pair

V, L, N = 6, 3, 100_000
N_TREE = 30_000        # token-tree cases: see the module docstring
PROMPT = [1, 4, 2, 1, 4]          # repeats, so n-gram lookups hit
NGRAM_PROMPT = [2, 5, 3, 2, 5, 3, 2, 5]


NGRAM_TREE_PROMPT = [1, 4, 2, 3, 1, 4, 5, 4, 5, 4, 3, 3]   # "3" and "4" are followed by two
SPARSE_TREE = ((0,), (1,), (2,), (0, 0), (1, 0))           # different tokens earlier on


def case(method, k=2, temperature=1.0, top_k=0, top_p=1.0, draft="draft", prompt=PROMPT,
         tree=None, candidates=None, **schedule):
    return dict(method=method, k=k, temperature=temperature, top_k=top_k, top_p=top_p,
                draft=draft, prompt=tuple(prompt), tree=tree, candidates=candidates,
                schedule=schedule)


def tree_case(widths_or_paths, candidates="distinct", method="speculative", **kwargs):
    tree = (Tree.full(widths_or_paths) if isinstance(widths_or_paths[0], int)
            else Tree.from_paths(widths_or_paths))
    return case(method, tree=tree, candidates=None if method == "ngram" else candidates,
                **kwargs)


def eagle_drafter(target, kind="specjax"):
    """A random EAGLE drafter for the tiny target that can propose 5 of the V = 6 tokens
    (token 4 gets draft probability 0, so the residual alone must supply it): specjax's
    style, or ("eagle3") a published EAGLE-3 one whose draft vocabulary is those 5, reading the
    states after 0 and 1 layers; ("eagle1") a published EAGLE-1 one proposes all 6."""
    if kind == "eagle1":
        return init_drafter(target, seed=3, std=0.5)
    options = dict(kind="eagle3", taps=(0, 1)) if kind == "eagle3" else dict(style="specjax")
    return init_drafter(target, token_ids=[2, 0, 1, 3, 5], seed=3, std=0.5, **options)


def medusa_heads(target, kind="subset"):
    """Random Medusa heads for the tiny target: three heads, one residual block each, that can
    propose 5 of the V = 6 tokens (token 4 gets draft probability 0, so the residual alone
    must supply it); ("medusa1") published Medusa-1 heads, each with its own LM head over all
    6."""
    if kind == "medusa1":
        config = HeadsConfig(num_heads=3, num_blocks=1, hidden_size=target.config.d_model,
                                     vocab_size=V, subset_size=V, head="own")
        return init_heads(config, target, seed=3, std=0.5)
    config = HeadsConfig(num_heads=3, num_blocks=1, hidden_size=target.config.d_model,
                                 vocab_size=V, subset_size=5)
    return init_heads(config, target, token_ids=[2, 0, 1, 3, 5], seed=3, std=0.5)


# Thresholds near the middle of the draft's probabilities here, so that rows stop after
# 1, 2, .., K tokens (test_confidence_rows_stop_at_different_depths).
CONFIDENCE = {
    "speculative-confidence-t1": case("speculative", k=3, k_schedule="confidence",
                                      confidence_threshold=0.5),
    "speculative-confidence-t0.7-top-p": case("speculative", k=3, temperature=0.7, top_p=0.9,
                                              k_schedule="confidence", confidence_threshold=0.6),
}
POSITIVE = {
    "autoregressive": case("autoregressive"),
    "autoregressive-top-k-top-p": case("autoregressive", temperature=0.7, top_k=3, top_p=0.9),
    # (K = 4 at temperature 0.7 is "speculative-top-p", K = 3 the confidence cases.)
    **{f"speculative-k{k}-t{t}": case("speculative", k=k, temperature=t)
       for k in (1, 2, 4) for t in (1.0, 0.7) if (k, t) != (4, 0.7)},
    "speculative-top-k": case("speculative", k=2, top_k=3),
    "speculative-top-p": case("speculative", k=4, temperature=0.7, top_p=0.9),
    "speculative-draft-is-target": case("speculative", k=2, draft="target"),
    "ngram-k2": case("ngram", k=2, prompt=NGRAM_PROMPT),
    "ngram-k4-top-k": case("ngram", k=4, temperature=0.7, top_k=4, prompt=NGRAM_PROMPT),
    # Token trees (test_tree.py has the exact law): each candidate scheme, two shapes, the
    # sampling transforms, a third sibling that top-k leaves unfilled. (A chain as a tree is
    # the same sampler as the chain: test_tree.py, exactly and call for call.)
    "tree-2x2-distinct": tree_case((2, 2)),
    "tree-sparse-iid-t0.7-top-k": tree_case(SPARSE_TREE, "iid", temperature=0.7, top_k=3),
    "tree-2x2-top-t0.7-top-p": tree_case((2, 2), "top", temperature=0.7, top_p=0.9),
    "tree-3x1-distinct-top-k2": tree_case((3, 1), top_k=2),
    "ngram-tree-2x2": tree_case((2, 2), method="ngram", prompt=NGRAM_TREE_PROMPT),
    # Medusa: random heads on the target's hidden state fill the tree.
    "medusa-2x2-distinct": tree_case((2, 2), method="medusa"),
    "medusa-sparse-iid-t0.7-top-p": tree_case(SPARSE_TREE, "iid", method="medusa",
                                              temperature=0.7, top_p=0.9),
    # Published Medusa-1 heads on their default, a chain of one candidate per head.
    "medusa1-chain-3-iid-t0.7": dict(tree_case(Tree.chain(3).paths, "iid", method="medusa",
                                               temperature=0.7), heads="medusa1"),
    # EAGLE: a random drafter on the target's features fills the tree, sampled and top; one
    # is a published EAGLE-3 one, one a published EAGLE-1 one on a dynamic tree.
    "eagle-2x2-distinct": tree_case((2, 2), method="eagle"),
    "eagle3-sparse-iid-t0.7-top-p": dict(tree_case(SPARSE_TREE, "iid", method="eagle",
                                                   temperature=0.7, top_p=0.9),
                                         drafter="eagle3"),
    "eagle-chain-3-top": tree_case(Tree.chain(3).paths, "top", method="eagle"),
    # EAGLE-2's dynamic tree: each row's own tree, deterministic candidates.
    "eagle-dynamic-3-2-4": dict(case("eagle", candidates=None), tree=DynamicTree(3, 2, 4)),
    "eagle1-dynamic-3-2-4-t0.7": dict(case("eagle", candidates=None, temperature=0.7),
                                      tree=DynamicTree(3, 2, 4), drafter="eagle1"),
    "eagle-dynamic-2-3-5-t0.7-top-p": dict(case("eagle", temperature=0.7, top_p=0.9),
                                           tree=DynamicTree(2, 3, 5)),
    # Dynamic lookahead: rows stop drafting at different depths (checked below).
    **CONFIDENCE,
    "speculative-heuristic-top-p": case("speculative", k=3, top_p=0.9, k_schedule="heuristic",
                                        k_start=1),
}
# Every precision runs the same samplers on the model that runs (DESIGN.md, "Precision is a
# property of the loaded model"): the pair in bfloat16, int8 and q8_0, each sampled against the
# exact law of its own target (enumerated with that target), for a chain, a static tree and
# EAGLE's dynamic tree; the negative controls below include the same three families per
# precision.
PRECISIONS = ("bfloat16", "int8", "q8_0")
for _dtype in PRECISIONS:
    POSITIVE.update({
        f"speculative-k2-t1-{_dtype}": dict(case("speculative", k=2), dtype=_dtype),
        f"tree-2x2-distinct-{_dtype}": dict(tree_case((2, 2)), dtype=_dtype),
        f"eagle-dynamic-3-2-4-{_dtype}": dict(case("eagle", candidates=None),
                                             tree=DynamicTree(3, 2, 4), dtype=_dtype),
    })
FAMILY_ALPHA = 0.01
ALPHA = FAMILY_ALPHA / len(POSITIVE)


@pytest.fixture(scope="module")
def models():
    return close_pair(vocab=V, std=0.5, noise=0.15)


_LAWS: dict = {}
_CAST: dict = {}


def in_dtype(models, dtype):
    """The pair with its weights in `dtype` (None: as they are), made once per dtype."""
    if dtype is None:
        return models
    key = (id(models[0]), dtype)
    if key not in _CAST:
        _CAST[key] = tuple(Model(m.config.replace(dtype=dtype), cast_params(m.params, dtype))
                           for m in models)
    return _CAST[key]


def exact_law(target, prompt, sampling: SamplingParams) -> np.ndarray:
    """`specjax.testing.law.exact_law` of the L-token continuations, computed once per target, prompt
    and sampling."""
    key = (id(target.params), tuple(prompt), sampling)
    if key not in _LAWS:
        _LAWS[key] = laws.exact_law(target, prompt, sampling, L)
    return _LAWS[key]


def g_test(samples: np.ndarray, law: np.ndarray) -> float:
    return gtest.p_value(samples, law, V)


def run_case(models, c, seed=0, rows=None, max_new_tokens=L, **hooks):
    """One `generate` call of case `c`: one row per sample (N rows, N_TREE for a tree), each
    its own random stream. Returns the result, the target and the sampling."""
    target, draft = in_dtype(models, c.get("dtype"))
    draft = target if c["draft"] == "target" else draft
    sampling = SamplingParams(c["temperature"], c["top_k"], c["top_p"])
    rows = rows or (N if c["tree"] is None else N_TREE)
    weights = {"draft": draft}
    if c["method"] == "medusa":
        weights["heads"] = medusa_heads(target, c.get("heads", "subset"))
    if c["method"] == "eagle":
        weights["drafter"] = eagle_drafter(target, c.get("drafter", "specjax"))
    method = specjax.api.methods.build_shared(c["method"], k=c["k"], tree=c["tree"],
                                              candidates=c["candidates"], **weights,
                                              **c["schedule"])
    prompts = np.tile(np.asarray(c["prompt"], np.int32), (rows, 1))    # one row per sample
    result = generate(target, prompts, method, sampling, max_new_tokens=max_new_tokens, seed=seed,
                      eos_ids=(), **hooks)
    return result, target, sampling


def draw(models, c, seed=0, rows=None, **hooks) -> tuple[np.ndarray, float]:
    result, target, sampling = run_case(models, c, seed, rows, **hooks)
    samples = np.array(result.tokens, np.int32)
    assert samples.shape == (rows or (N if c["tree"] is None else N_TREE), L)
    return samples, g_test(samples, exact_law(target, c["prompt"], sampling)), result.stats


def program_group(c) -> str:
    """The test worker group of the compiled program case `c` runs (`same_program`)."""
    tree = getattr(c["tree"], "paths", c["tree"])
    key = (c["method"], c["k"], tree, c["candidates"], sorted(c["schedule"].items()),
           c.get("drafter"), c.get("heads"), c.get("dtype"))
    return "distribution-" + "".join(ch for ch in repr(key) if ch.isalnum() or ch in ",.-_")


@pytest.fixture(scope="module")
def case_draws() -> dict:
    """The draws of `POSITIVE`'s cases made so far in this worker (`case_draw`)."""
    return {}


def case_draw(models, draws: dict, name: str):
    """`draw` of the positive case `name`, made once a worker: the hooks check compares the real
    sampler's samples with the hooks' on a case's own draw (same program, rows and seed)."""
    if name not in draws:
        draws[name] = draw(models, POSITIVE[name])
    return draws[name]


def same_program(cases: dict) -> list:
    """The case names, each in the test worker group of the compiled program it runs: cases that
    differ only in sampling settings (data, not part of the program) or in the draft's weights
    run on one worker, which compiles their program once."""
    return [pytest.param(name, marks=pytest.mark.xdist_group(program_group(c)))
            for name, c in cases.items()]


@pytest.mark.fast(cases=[
    "autoregressive-top-k-top-p", "speculative-k2-t0.7", "ngram-k2", "tree-2x2-top-t0.7-top-p",
    "medusa-2x2-distinct", "eagle-dynamic-3-2-4"])
@pytest.mark.parametrize("name", same_program(POSITIVE))
def test_method_samples_the_target_distribution(models, case_draws, name):
    c = POSITIVE[name]
    _, p_value, stats = case_draw(models, case_draws, name)
    assert p_value > ALPHA, f"{name}: G-test p = {p_value:.3g} <= {ALPHA:.3g}"
    if c["draft"] == "target":
        assert stats.accepted == stats.drafted      # u * p(x) < q(x) always holds when p == q
    elif c["method"] != "autoregressive":
        # The case exercises both branches of verify: some drafts accepted, some rejected.
        assert 0 < stats.accepted < stats.drafted


# -- Negative controls: broken samplers the test must catch --------------------------------------

def _row_verify(broken_row):
    def verify_fn(draft_tokens, draft_probs, target_probs, keys, num_drafted=None):
        if num_drafted is None:
            num_drafted = jnp.full(draft_tokens.shape[:1], draft_tokens.shape[1])
        return rejection.Verdict(*jax.vmap(broken_row)(draft_tokens, draft_probs, target_probs,
                                                       keys, num_drafted))
    return verify_fn


def _broken_verify(accept_rule="leading", residual="residual", bonus_position=None):
    """verify with one step done wrong; the defaults reproduce the correct algorithm."""
    def row(tokens, p, q, key, num_drafted):
        k = tokens.shape[0]
        k_accept, k_residual, k_bonus = jax.random.split(key, 3)
        p_x = jnp.take_along_axis(p, tokens[:, None], axis=-1)[:, 0]
        q_x = jnp.take_along_axis(q[:k], tokens[:, None], axis=-1)[:, 0]
        ok = rejection.accepts(jax.random.uniform(k_accept, (k,)), p_x, q_x)
        ok = ok & (jnp.arange(k) < num_drafted)
        if accept_rule == "leading":
            n = rejection.num_leading_accepted(ok)
        elif accept_rule == "always":
            n = num_drafted.astype(jnp.int32)
        elif accept_rule == "first-only":   # the `.all()` bug: a rejection at i > 0 is ignored
            n = jnp.where(ok[0], num_drafted, 0).astype(jnp.int32)
        at = jnp.minimum(n, k - 1)
        if residual == "residual":
            r = rejection.residual_distribution(p[at], q[at])
        elif residual == "target":          # resample from q instead of max(q - p, 0)
            r = q[at]
        elif residual == "swapped":         # p and q letters crossed: max(p - q, 0)
            r = rejection.residual_distribution(q[at], p[at])
        bonus_q = q[n] if bonus_position is None else q[bonus_position]
        next_token = jnp.where(n < jnp.minimum(num_drafted, k), sample(k_residual, r),
                               sample(k_bonus, bonus_q))
        return n, next_token.astype(jnp.int32)
    return _row_verify(row)


def _argmax_propose(key, logits, sampling):
    """Drafts the argmax but reports the soft distribution as p."""
    p = probs_from_logits(logits, sampling)
    return jnp.argmax(p, axis=-1).astype(jnp.int32), p


def _top_k_on_draft_only_propose(key, logits, sampling):
    """Samples the draft with top-k = 2 but reports p without it (top-k on one model only)."""
    truncated = probs_from_logits(logits, sampling.replace(top_k=jnp.full_like(sampling.top_k, 2)))
    return jax.vmap(sample)(key, truncated), probs_from_logits(logits, sampling)


def _broken_tree_verify(update_residual=True, bonus_from_parent=False, rule=None):
    """`rejection.verify_tree`'s walk with one step done wrong (or verified with another rule);
    the defaults reproduce the correct walk (`test_correct_tree_walk_reproduces_verify_tree`)."""
    def verify_fn(tree, scheme_rule, tokens, valid, draft_probs, target_probs, keys):
        use = rule or scheme_rule
        if draft_probs is None:
            draft_probs = jnp.zeros_like(target_probs)
        children, parent = jnp.asarray(tree.children), jnp.asarray(tree.parent)

        def row(tokens, valid, p_all, q_all, key):
            k_accept, k_next = jax.random.split(key)
            u = jax.random.uniform(k_accept, (tree.max_depth, tree.max_width))
            p, q = p_all[0], q_all[0]
            node, walking, rejected, path = jnp.zeros((), jnp.int32), True, False, []
            for d in range(tree.max_depth):
                moved, rejected = False, False
                for r in range(tree.max_width):
                    child = children[node, r]
                    x = tokens[jnp.maximum(child, 0)]
                    p_r = rejection.candidate_distribution(use, p, x)
                    tried = (walking & ~moved & (child >= 0) & valid[jnp.maximum(child, 0)]
                             & (p_r[x] > 0))
                    accept = tried & rejection.accepts(u[d, r], p_r[x], q[x])
                    p_next, q_next = rejection.after_rejection(use, p, q, x)
                    if not update_residual:
                        q_next = q
                    p = jnp.where(tried & ~accept, p_next, p)
                    q = jnp.where(tried & ~accept, q_next, q)
                    node, moved = jnp.where(accept, child, node), moved | accept
                    rejected = rejected | (tried & ~accept)
                p = jnp.where(moved, p_all[node], p)
                q = jnp.where(moved, q_all[node], q)
                walking = walking & moved
                path.append(node)
            if bonus_from_parent:            # at a node where nothing was rejected: its parent's q
                q = jnp.where(rejected, q, q_all[parent[node]])
            n = jnp.sum(jnp.asarray(tree.depth)[jnp.stack(path)] == jnp.arange(1, len(path) + 1))
            return n.astype(jnp.int32), jnp.stack(path), sample(k_next, q)
        return rejection.TreeVerdict(*jax.vmap(row)(tokens, valid, draft_probs, target_probs,
                                                    keys))
    return verify_fn


def _top_tokens_as_if_sampled(scheme, key, logits, p, width):
    """A tree's candidates chosen deterministically (the drafter's top tokens) and handed to a
    verifier that believes they were drawn from p without replacement."""
    return rules.candidates("top", key, logits, None, width)


def _verified_with_sharpened_p(tree, rule, tokens, valid, draft_probs, target_probs, keys):
    """Candidates drawn from the heads' p, verified as if drawn from p^2 (renormalised)."""
    sharp = draft_probs ** 2
    sharp = sharp / jnp.maximum(sharp.sum(-1, keepdims=True), 1e-30)
    return rejection.verify_tree(tree, rule, tokens, valid, sharp, target_probs, keys)


class LeakyTree(Tree):
    """A tree whose attention mask is the causal one: later siblings see earlier branches."""

    @property
    def ancestors(self):
        return np.tril(np.ones((self.size + 1,) * 2, bool))


def _stop_before_a_likely_rejection(draft_tokens, draft_probs, target_probs, keys,
                                    num_drafted=None):
    """A lookahead schedule that peeks at the target: each row's draft stops before its first
    token with q(x) < p(x), one the target would likely reject. Drafting less is harmless
    only when the decision cannot see the target; this one can, and it skews the law."""
    k = draft_tokens.shape[1]
    p_x = jnp.take_along_axis(draft_probs, draft_tokens[..., None], axis=-1)[..., 0]
    q_x = jnp.take_along_axis(target_probs[:, :k], draft_tokens[..., None], axis=-1)[..., 0]
    stop = rejection.num_leading_accepted(q_x >= p_x)
    if num_drafted is not None:
        stop = jnp.minimum(stop, num_drafted)
    kept = (jnp.arange(k) < stop[:, None])[..., None]
    return rejection.verify(draft_tokens, draft_probs * kept, target_probs, keys,
                            num_drafted=stop)


NEGATIVE = {
    "always-accept": (case("speculative", k=2),
                      dict(rules=Rules(verify=_broken_verify(accept_rule="always")))),
    "residual-replaced-by-q": (case("speculative", k=2),
                               dict(rules=Rules(verify=_broken_verify(residual="target")))),
    "residual-p-q-swapped": (case("speculative", k=2),
                             dict(rules=Rules(verify=_broken_verify(residual="swapped")))),
    "rejection-after-first-ignored": (
        case("speculative", k=2), dict(rules=Rules(verify=_broken_verify(accept_rule="first-only")))),
    "bonus-from-wrong-position": (case("speculative", k=2),
                                  dict(rules=Rules(verify=_broken_verify(bonus_position=1)))),
    "argmax-draft-soft-probs": (case("speculative", k=2), dict(rules=Rules(propose=_argmax_propose))),
    "top-k-on-draft-only": (case("speculative", k=2),
                            dict(rules=Rules(propose=_top_k_on_draft_only_propose))),
    "ngram-always-accept": (case("ngram", k=2, prompt=NGRAM_PROMPT),
                            dict(rules=Rules(verify=_broken_verify(accept_rule="always")))),
    "tree-residual-not-updated": (
        tree_case((3, 1)), dict(rules=Rules(verify_tree=_broken_tree_verify(update_residual=False)))),
    "tree-without-replacement-verified-as-iid": (
        tree_case((3, 1)), dict(rules=Rules(verify_tree=_broken_tree_verify(rule="iid")))),
    "tree-sibling-sees-another-branch": (
        dict(tree_case((2, 2)), tree=LeakyTree.from_paths(Tree.full((2, 2)).paths)), {}),
    "tree-bonus-at-the-wrong-node": (
        tree_case((2, 2)),
        dict(rules=Rules(verify_tree=_broken_tree_verify(bonus_from_parent=True)))),
    "medusa-verified-with-another-p": (
        tree_case((2, 2), method="medusa"), dict(rules=Rules(verify_tree=_verified_with_sharpened_p))),
    "medusa1-verified-with-another-p": (
        dict(tree_case(Tree.chain(3).paths, "iid", method="medusa", temperature=0.7),
             heads="medusa1"), dict(rules=Rules(verify_tree=_verified_with_sharpened_p))),
    "eagle-top-tokens-verified-as-sampled": (
        tree_case((2, 2), method="eagle"), dict(rules=Rules(candidates=_top_tokens_as_if_sampled))),
    "eagle3-top-tokens-verified-as-sampled": (
        dict(tree_case((2, 2), method="eagle"), drafter="eagle3"),
        dict(rules=Rules(candidates=_top_tokens_as_if_sampled))),
    "lookahead-stop-peeks-at-the-target": (
        CONFIDENCE["speculative-confidence-t1"],
        dict(rules=Rules(verify=_stop_before_a_likely_rejection))),
}
for _dtype in PRECISIONS:
    NEGATIVE.update({
        f"always-accept-{_dtype}": (dict(case("speculative", k=2), dtype=_dtype),
                                    NEGATIVE["always-accept"][1]),
        f"tree-residual-not-updated-{_dtype}": (dict(tree_case((3, 1)), dtype=_dtype),
                                                NEGATIVE["tree-residual-not-updated"][1]),
        f"eagle-top-tokens-verified-as-sampled-{_dtype}": (
            dict(tree_case((2, 2), method="eagle"), dtype=_dtype),
            NEGATIVE["eagle-top-tokens-verified-as-sampled"][1]),
    })


@pytest.mark.fast(cases=[
    "always-accept", "ngram-always-accept", "tree-residual-not-updated",
    "medusa-verified-with-another-p", "eagle-top-tokens-verified-as-sampled"])
@pytest.mark.parametrize("name", NEGATIVE)
def test_broken_sampler_is_caught(models, name):
    c, hooks = NEGATIVE[name]
    _, p_value, _ = draw(models, c, **hooks)
    assert p_value < ALPHA, f"{name} was not caught: p = {p_value:.3g}"


# The three checks below run programs the distribution cases compile anyway: the confidence
# check and the real sampler of the hooks check are their case's draw (its rows, so its
# program; same worker group), and the tree walk is one jitted program.
@pytest.mark.parametrize("name", same_program(CONFIDENCE))
def test_confidence_rows_stop_at_different_depths(models, name):
    # The confidence cases are only a test of the schedule if their rows stop at every depth:
    # after the first step, each of 1..K drafted tokens is seen in at least 5% of the rows. The
    # case's own draw (its 100,000 rows and seed) with one new token a row: every row ends after
    # its first step, whose drafts do not depend on the number of new tokens, so each row's
    # drafted count is its first step's; a row's new tokens are data, not part of the program.
    c = CONFIDENCE[name]
    result, _, _ = run_case(models, c, max_new_tokens=1)
    assert {row.target_calls for row in result.row_stats} == {1}        # one step a row
    drafted = np.array([row.drafted for row in result.row_stats])
    assert len(drafted) >= 2000
    share = np.bincount(drafted, minlength=c["k"] + 1)[1:] / len(drafted)
    assert (share >= 0.05).all(), share


@pytest.mark.fast
@pytest.mark.xdist_group(program_group(POSITIVE["speculative-k2-t0.7"]))
def test_correct_hooks_reproduce_the_real_sampler(models, case_draws):
    # The negative controls differ from the real sampler only in the step they break. The real
    # sampler's samples are the distribution case speculative-k2-t0.7's own (its 100,000 rows,
    # drawn once a worker; the case is in the fast tier too), the hooks' are drawn alike.
    name = "speculative-k2-t0.7"
    real, _, _ = case_draw(models, case_draws, name)
    rebuilt, _, _ = draw(models, POSITIVE[name],
                         rules=Rules(verify=_broken_verify(), propose=propose))
    assert len(real) >= 20_000
    np.testing.assert_array_equal(real, rebuilt)


@pytest.mark.fast
def test_correct_tree_walk_reproduces_verify_tree():
    # The tree negative controls differ from the real walk only in the step they break: with
    # the defaults, the test's walk gives the library's results on random trees of candidates.
    # One jitted program (eagerly, each operation was a program of its own).
    tree, rows, vocab = Tree.from_paths(SPARSE_TREE + ((0, 1),)), 512, 5

    @jax.jit
    def both_walks():
        k_tokens, k_p, k_q, k_keys = jax.random.split(jax.random.key(0), 4)
        tokens = jax.random.randint(k_tokens, (rows, tree.size + 1), 0, vocab)
        p = jax.nn.softmax(2 * jax.random.normal(k_p, (rows, tree.size + 1, vocab)))
        q = jax.nn.softmax(2 * jax.random.normal(k_q, (rows, tree.size + 1, vocab)))
        valid = jnp.ones(tokens.shape, bool).at[::3, 2].set(False)
        keys = jax.random.split(k_keys, rows)
        return {rule: (rejection.verify_tree(tree, rule, tokens, valid, p, q, keys),
                       _broken_tree_verify()(tree, rule, tokens, valid, p, q, keys))
                for rule in rejection.RULES}

    for rule, (want, got) in jax.device_get(both_walks()).items():
        for name in ("n_accepted", "path", "next_token"):
            np.testing.assert_array_equal(getattr(want, name), getattr(got, name))
        assert 0 < int(np.sum(want.n_accepted)) < rows * tree.max_depth  # accepts and rejects
