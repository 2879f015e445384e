"""docs/walkthrough.md: its worked example is recomputed here with the library's own functions,
and every function its tables name exists, so the page cannot drift from the code."""

import importlib
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.sampling import rejection

DOC = Path(__file__).resolve().parent.parent / "docs" / "walkthrough.md"
P = np.array([0.1, 0.5, 0.3, 0.1])     # the example's draft distribution over A B C D
Q = np.array([0.2, 0.2, 0.4, 0.2])     # and the target's
B = 1


def example_block() -> dict[str, str]:
    text = DOC.read_text()
    block = re.search(r"```worked-example\n(.*?)```", text, re.S).group(1)
    return dict(line.split(": ", 1) for line in block.strip().splitlines())


def numbers(text: str) -> np.ndarray:
    return np.array([float(v) for v in text.split()])


def test_worked_example_numbers_come_from_the_code():
    doc = example_block()
    p_x, q_x = jnp.float32(P[B]), jnp.float32(Q[B])
    np.testing.assert_allclose(float(rejection.acceptance_probability(p_x, q_x)),
                               float(doc["acceptance probability of B"]), atol=1e-6)
    np.testing.assert_allclose(0.7 * P[B], float(doc["u * p(B) with u = 0.7"]), atol=1e-12)
    yes_no = {True: "yes", False: "no"}
    assert yes_no[bool(rejection.accepts(0.7, p_x, q_x))] == doc["accepted with u = 0.7"]
    assert yes_no[bool(rejection.accepts(0.3, p_x, q_x))] == doc["accepted with u = 0.3"]
    residual = np.asarray(rejection.residual_distribution(P, Q))
    np.testing.assert_allclose(residual, numbers(doc["residual"]), atol=5e-5)
    a = np.asarray(rejection.acceptance_probability(P, Q))
    np.testing.assert_allclose(float(np.sum(P * (1 - a))),
                               float(doc["probability of a rejection"]), atol=1e-6)
    law = np.asarray(rejection.emitted_token_law(P, Q))
    np.testing.assert_allclose(law, numbers(doc["law of the emitted token"]), atol=1e-6)
    np.testing.assert_allclose(law, Q, atol=1e-6)                       # Theorem 1


def test_verify_itself_behaves_as_the_example_says():
    # The real verify on the example, 200,000 rows, B drafted in each: B is accepted with
    # probability 0.4, and a rejected row draws from the residual (B never comes out of it).
    rows = 200_000
    bonus = np.array([0.25, 0.25, 0.25, 0.25])
    n, token = jax.jit(rejection.verify)(
        jnp.full((rows, 1), B), jnp.broadcast_to(jnp.float32(P), (rows, 1, 4)),
        jnp.broadcast_to(jnp.float32(np.stack([Q, bonus])), (rows, 2, 4)),
        jax.random.split(jax.random.key(0), rows))
    n, token = np.asarray(n), np.asarray(token)
    assert abs(n.mean() - 0.4) < 0.005                    # 5 standard errors at 200,000 rows
    assert not (token[n == 0] == B).any()
    residual = np.bincount(token[n == 0], minlength=4) / (n == 0).sum()
    np.testing.assert_allclose(residual, numbers(example_block()["residual"]), atol=0.01)


def test_every_function_the_tables_name_exists():
    # In a table row, `file.py` (a path under specjax/) is followed by the names it defines
    # (functions, constants, or methods of its classes).
    checked = 0
    for row in DOC.read_text().splitlines():
        if not row.startswith("| "):
            continue
        module = None
        for token in re.findall(r"`([^`]+)`", row):
            if token.startswith("tests/"):
                module = None
            elif token.endswith(".py"):
                module = importlib.import_module("specjax." + token[:-3].replace("/", "."))
            elif module is not None and re.fullmatch(r"\w+", token):
                classes = [v for v in vars(module).values() if isinstance(v, type)]
                assert hasattr(module, token) or any(hasattr(c, token) for c in classes), (
                    module.__name__, token)
                checked += 1
    assert checked >= 40, checked


# -- specjax.explain / generate --trace ---------------------------------------------------------

def test_explain_agrees_with_generate_and_is_stable():
    # The tiny pair at temperature 1.0, seed 3: explain's steps append exactly the tokens
    # generate returns, every verdict is the accept test on the printed numbers, and the
    # rendering of the first step is pinned (a snapshot: the numbers of seed 3 cannot move
    # without the sampler changing).
    import specjax
    from specjax.api.generate import generate
    from tests.tiny import close_pair

    target, draft = close_pair(vocab=8, std=0.5, noise=0.3)
    kwargs = dict(method="speculative", draft=draft, k=3, max_new_tokens=12, temperature=1.0,
                  seed=3, eos_ids=())
    steps = specjax.explain(target, [1, 2, 3, 4], steps=20, **kwargs)
    tokens = generate(target, [[1, 2, 3, 4]], **kwargs).tokens[0]
    assert [t for s in steps for t in s.new_tokens] == tokens
    for s in steps:
        accepted = [d.accepted for d in s.drafts]
        assert accepted == sorted(accepted, reverse=True)   # accepts, then one rejection
        for d in s.drafts:
            assert d.accepted == (d.u * d.p < d.q)
        assert s.new_tokens[:sum(accepted)] == [d.token for d in s.drafts if d.accepted]
        assert s.from_residual == (not all(accepted) if accepted else False)
        if s.from_residual:
            # A rejected x had q(x) < p(x) (else it is always accepted): the residual has no
            # mass on it, so the emitted token differs.
            assert s.emitted != s.drafts[-1].token
            assert 0 < sum(p for _, p in s.residual_top) <= 1 + 1e-6
    text = specjax.format_steps(steps[:1])
    assert text.splitlines()[0] == f"step 1: {len(steps[0].drafts)} draft token(s) examined"
    assert SNAPSHOT == text, text



def _tree_cases():
    import specjax
    from specjax.heads import eagle
    from tests.tiny import close_pair

    target, draft = close_pair(vocab=8, std=0.5, noise=0.3)
    ids = np.arange(6)
    heads = specjax.init_heads(
        specjax.HeadsConfig(num_heads=2, num_blocks=1, hidden_size=target.config.d_model,
                            vocab_size=8, subset_size=6), target, ids, seed=0, std=0.3)
    drafter = eagle.init_drafter(target, token_ids=ids, seed=0, std=0.3, kind="eagle3",
                                 taps=(0, 1))
    full = specjax.Tree.full((2, 2))
    return target, {
        # one case per verification rule: without replacement, i.i.d., deterministic (an
        # EAGLE-2 dynamic tree: one topology per row, as data)
        "speculative-distinct": dict(method="speculative", draft=draft, tree=full,
                                     candidates="distinct"),
        "medusa-iid": dict(method="medusa", heads=heads, tree=full, candidates="iid"),
        "eagle3-dynamic": dict(method="eagle", drafter=drafter,
                               tree=specjax.DynamicTree(3, 2, 5)),
    }


@pytest.mark.parametrize("case", ["speculative-distinct", "medusa-iid", "eagle3-dynamic"])
def test_explain_walks_trees_as_generate_does(case):
    # The tiny pair at temperature 1.0, seed 3: a tree step's sibling tests, read back, are the
    # walk of rejection.verify_tree: the accepted nodes make a path from the root whose tokens
    # the step appended, each verdict is the accept test on its numbers, at most one child of a
    # node is accepted and none is tested after it, a rejected token has no mass in the residual
    # that follows, and the steps append exactly the tokens generate returns.
    import specjax
    from specjax.api.explain import TreeStep
    from specjax.api.generate import generate

    target, cases = _tree_cases()
    kwargs = dict(cases[case], max_new_tokens=16, temperature=1.0, seed=3, eos_ids=())
    prompt = [1, 2, 3, 4, 1, 2]
    steps = specjax.explain(target, prompt, steps=40, **kwargs)
    assert [t for s in steps for t in s.new_tokens] == generate(target, [prompt],
                                                                **kwargs).tokens[0]
    assert all(isinstance(s, TreeStep) for s in steps)
    rejections = accepts = 0
    for s in steps:
        parent_of = {node: parent for node, parent, _ in s.nodes}
        token_of = {node: token for node, _, token in s.nodes}
        at, rejected_all = 0, False                 # the walk's node; how it ended
        for depth in range(1, 1 + max((t.depth for t in s.trials), default=0)):
            level = [t for t in s.trials if t.depth == depth]
            assert all(t.parent == at == parent_of[t.node] for t in level)
            assert [t.rank for t in level] == sorted(t.rank for t in level)
            verdicts = [t.accepted for t in level]
            assert verdicts.count(True) <= 1 and verdicts[:-1] == [False] * (len(level) - 1)
            for t in level:
                assert t.accepted == (t.u * t.p < t.q) and t.token == token_of[t.node]
                if not t.accepted:
                    rejections += 1
                    assert t.token not in [x for x, _ in t.residual_top]
                    assert 0 < sum(p for _, p in t.residual_top) <= 1 + 1e-6
            if not verdicts[-1]:                    # the walk ends here, from the residual
                assert s.emitted not in [t.token for t in level]
                rejected_all = True
                break
            accepts += 1
            at = level[-1].node
        assert s.from_residual == rejected_all      # else the bonus, q at the last node
        assert [t.node for t in s.trials if t.accepted] == s.path
        assert s.new_tokens[:len(s.path)] == [token_of[n] for n in s.path]
        if len(s.new_tokens) == len(s.path) + 1:
            assert s.new_tokens[-1] == s.emitted
        lines = specjax.format_steps([s]).splitlines()
        assert len([x for x in lines if "-> accept" in x or "-> reject" in x]) == len(s.trials)
    assert rejections > 0 and accepts > 0           # the seed exercises both verdicts


SNAPSHOT = """\
step 1: 3 draft token(s) examined
  x = 3              p = 0.1995  q = 0.0476  u = 0.0071  u*p = 0.0014 < q  -> accept
  x = 4              p = 0.9623  q = 0.5830  u = 0.4083  u*p = 0.3930 < q  -> accept
  x = 2              p = 0.5677  q = 0.0078  u = 0.3429  u*p = 0.1947 >= q  -> reject
  residual normalize(max(q - p, 0)), top: 4 0.5229, 3 0.4735, 5 0.0037
  emitted 4 from the residual
  new tokens: 3 4 4"""
