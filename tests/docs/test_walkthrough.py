"""docs/walkthrough.md: its plain step is held equal to the production verify, its worked example
is recomputed here with the library's own functions, every function its tables name exists, its
path from `generate` to the accept test is the code's own calls, and every "Step" of the page and
of specjax's prose is one of its table of Algorithm 2's, so the page cannot drift from the code."""

import importlib
import inspect
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import reference
from specjax.heads.medusa import HeadsConfig, init_heads
from specjax.sampling import rejection
from specjax.sampling.rules import Rules

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "walkthrough.md"
P = np.array([0.1, 0.5, 0.3, 0.1])     # the example's draft distribution over A B C D
Q = np.array([0.2, 0.2, 0.4, 0.2])     # and the target's
B = 1


# -- The plain step ------------------------------------------------------------------------------

def _rows(rng, rows: int, k: int, vocab: int):
    """Random verify inputs in float64, with the cases the algorithm defines rather than leaves
    to chance: one-hot drafts (n-gram lookups), q = 0 at the drafted token, p = q (a residual
    with no mass), and zeros in both."""
    p = rng.dirichlet(np.full(vocab, 0.5), (rows, k))                     # [R, k, V]
    q = rng.dirichlet(np.full(vocab, 0.5), (rows, k + 1))                 # [R, k + 1, V]
    p[rng.random((rows, k, vocab)) < 0.2] = 0.0
    q[rng.random((rows, k + 1, vocab)) < 0.2] = 0.0
    p[:, :, 0], q[:, :, 0] = p[:, :, 0] + 1e-3, q[:, :, 0] + 1e-3        # no empty rows
    p, q = p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)
    drafted = np.array([[rng.choice(vocab, p=p_i) for p_i in row] for row in p])   # [R, k]
    one_hot = np.eye(vocab)[drafted]
    p[::5] = one_hot[::5]                                     # a deterministic draft
    q[1::5, :k] = p[1::5]                                     # the target agrees: p = q
    q[2::5, 0] = np.where(one_hot[2::5, 0] > 0, 0.0, q[2::5, 0])          # q(x_1) = 0
    q[2::5, 0] /= q[2::5, 0].sum(-1, keepdims=True)
    return p, q, drafted


@pytest.mark.fast
def test_the_plain_step_is_the_production_verify():
    # On the same uniform draws, `reference.verify_row` accepts exactly the drafts the production
    # row does (`rejection._verify_row`, which `verify` vmaps over the batch) and draws the next
    # token from the same distribution, in float64, on 3,000 rows that include every degenerate
    # case; `verify` itself draws a token that distribution can give.
    k, vocab, rows = 4, 6, 3000
    p, q, drafted = _rows(np.random.default_rng(0), rows, k, vocab)
    keys = jax.random.split(jax.random.key(0), rows)
    with jax.enable_x64(True):
        each = jax.vmap(rejection._verify_row)(
            jnp.asarray(drafted), jnp.asarray(p), jnp.asarray(q), keys, jnp.full(rows, k))
        verdict = rejection.verify(jnp.asarray(drafted), jnp.asarray(p), jnp.asarray(q), keys)
        n_verify, token = verdict.n_accepted, verdict.next_token
        assert each.next_dist.dtype == np.float64
    n, next_dist = np.asarray(each.n_accepted), np.asarray(each.next_dist)
    u = np.asarray(each.details["u"])
    np.testing.assert_array_equal(np.asarray(n_verify), n)
    for row in range(rows):
        n_ref, dist_ref = reference.verify_row(p[row], q[row], list(drafted[row]), u[row])
        assert n_ref == n[row], row
        np.testing.assert_allclose(dist_ref, next_dist[row], rtol=0, atol=1e-12)
        assert dist_ref[int(token[row])] > 0
    assert 0 < np.mean(n == k) < np.mean(n > 0) < 1          # every outcome occurs


@pytest.mark.fast
def test_the_plain_step_runs_the_algorithm():
    # The whole plain step on a toy pair whose distributions depend on the last token: a draft
    # equal to the target is always accepted (k + 1 tokens a step), and the first emitted
    # token follows q (Theorem 1) within 5 standard errors.
    vocab, k = 5, 3
    rng = np.random.default_rng(1)
    table_q = rng.dirichlet(np.ones(vocab), vocab)               # q(. | last token)
    table_p = rng.dirichlet(np.ones(vocab), vocab)

    def model(table):
        return lambda tokens: np.log(table[np.asarray(tokens)])     # logits [T, V]

    same = reference.speculative_step(model(table_q), model(table_q), [2], k, rng)
    assert len(same) == k + 1
    firsts = np.array([reference.speculative_step(model(table_p), model(table_q), [2], k,
                                                  rng)[0] for _ in range(20_000)])
    frequency = np.bincount(firsts, minlength=vocab) / len(firsts)
    error = np.sqrt(table_q[2] * (1 - table_q[2]) / len(firsts))
    assert np.all(np.abs(frequency - table_q[2]) < 5 * error + 1e-9), (frequency, table_q[2])


@pytest.mark.fast
def test_the_page_shows_the_plain_step_as_it_is():
    block = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    source = "\n\n".join(inspect.getsource(f) for f in (reference.speculative_step,
                                                         reference.verify_row))
    assert block.strip() == source.strip()


def _function(file: str, name: str):
    """The function `name` of `file`, a path under specjax/ as the page writes it."""
    return getattr(importlib.import_module("specjax." + file[:-3].replace("/", ".")), name)


def _calls(caller, callee) -> bool:
    """Whether `caller`'s code calls or passes on `callee`: by its name, through its module, or
    through the two things the path dispatches on (the method spec's module, `spec.method.module`,
    one of the listed methods' modules, and the spec's rules, whose default verify is
    rejection's)."""
    from specjax.api.methods import CLASSES

    code = inspect.unwrap(caller)
    source, names, name = inspect.getsource(code), code.__globals__, callee.__name__
    if names.get(name) is callee and re.search(rf"(?<![\w.]){name}\b", source):
        return True
    if any(inspect.ismodule(names.get(module)) and getattr(names[module], name, None) is callee
           for module in re.findall(rf"(\w+)\.{name}\(", source)):
        return True
    if re.search(rf"\bmethod\.module\.{name}\(", source) and any(
            vars(m.spec.module).get(name) is callee for m in CLASSES):
        return True
    return bool(re.search(rf"\brules\.{name}\(", source)) and getattr(Rules(), name) is callee


def _path() -> list[tuple[str, str, list[str], str, str]]:
    """The page's path table: (from file, from function, the functions of that file it goes
    through, into file, into function) for each hop."""
    table = DOC.read_text().split("## From `generate` to the accept test")[1].split("\n## ")[0]
    hops = []
    for row in table.splitlines():
        cells = row.split(" | ")
        if row.startswith("| ") and cells[0][2:].isdigit():
            (from_file, from_name), through, (into_file, into_name) = (
                re.findall(r"`([^`]+)`", cell) for cell in cells[1:4])
            hops.append((from_file, from_name, through, into_file, into_name))
    return hops


@pytest.mark.fast
def test_the_path_from_generate_reaches_the_accept_test_in_four_hops():
    # The page's path table: at most four named hops, from `generate` to the accept test, each
    # leaving from the function the one before went into. Within a hop the code is the path:
    # the function it leaves from calls the functions of its own file the row names, in turn,
    # and the last of them calls the function the hop goes into.
    hops = _path()
    assert 1 <= len(hops) <= 4, hops
    assert hops[0][:2] == ("api/generate.py", "generate")
    for (*_, into_file, into_name), (from_file, from_name, *_) in zip(hops, hops[1:]):
        assert (from_file, from_name) == (into_file, into_name), (into_name, from_name)
    for from_file, from_name, through, into_file, into_name in hops:
        chain = [_function(from_file, name) for name in (from_name, *through)]
        chain.append(_function(into_file, into_name))
        for caller, callee in zip(chain, chain[1:]):
            assert _calls(caller, callee), (caller.__name__, callee.__name__)
    *_, through, into_file, into_name = hops[-1]
    assert into_name == "accepts"
    assert "accepts(u, p_x, q_x)" in inspect.getsource(_function(into_file, through[-1]))
    assert "return u * p_x < q_x" in inspect.getsource(rejection.accepts)
    # The hop test sees a call that is not there.
    assert not _calls(reference.verify_row, rejection.accepts)
    assert not _calls(rejection.verify, rejection.verify_tree)



def _section(title: str) -> str:
    return DOC.read_text().split(f"## {title}")[1].split("\n## ")[0]


def _crossed() -> list[str]:
    """The files the page says the chain method's path crosses, in its order."""
    paragraph = _section("From `generate` to the accept test").split("Files crossed.")[1]
    return re.findall(r"`([\w/]+\.py)`", paragraph.split("`tests/")[0])


def _accept_test_stack() -> list[str]:
    """The specjax files on the Python stack when the tiny pair's chain program, traced from
    the loop's `_run` as `generate` compiles it, reaches the accept test."""
    import functools
    import os

    import specjax
    from specjax.api.generate import prepare
    from specjax.decoding import loop
    from tests.support.tiny import close_pair

    target, draft = close_pair(vocab=8, std=0.5, noise=0.3)
    request = prepare(target, [[1, 2, 3, 4]], specjax.Speculative(draft=draft, k=3),
                      specjax.SamplingParams(temperature=1.0), max_new_tokens=4, eos_ids=())
    root, seen = Path(specjax.__file__).parent, []

    def spy(*args):
        seen.extend(os.path.relpath(f.filename, root) for f in inspect.stack()
                    if Path(f.filename).is_relative_to(root))
        return real(*args)

    real, rejection.accepts = rejection.accepts, spy
    try:                                  # a fresh trace: jit's caches never see this function
        jax.make_jaxpr(functools.partial(loop._run, request.spec))(request.weights,
                                                                   *request.inputs)
    finally:
        rejection.accepts = real
    return list(dict.fromkeys(seen))


@pytest.mark.fast
def test_the_page_names_every_file_the_chain_path_crosses():
    # The page's list of files crossed is exactly the files its path table and its table of the
    # step's parts name, at most six; each part is a call the step (or its score_and_verify)
    # makes; and every specjax file on the stack when the accept test is traced is listed.
    from specjax.decoding import speculative

    crossed = _crossed()
    assert len(crossed) == len(set(crossed)) <= 6, crossed
    parts = _section("From `generate` to the accept test").split("| part |")[1].split("\n\n")[0]
    named = {f for hop in _path() for f in (hop[0], hop[3])}
    named |= set(re.findall(r"`([\w/]+\.py)`", parts))
    assert set(crossed) == named, set(crossed) ^ named
    rows = [re.findall(r"`([^`]+)`", row) for row in parts.splitlines()[2:]]
    assert [row[:2] for row in rows] == [["decoding/speculative.py", "draft"],
                                         ["decoding/speculative.py", "score_and_verify"],
                                         ["sampling/rejection.py", "verify"],
                                         ["decoding/state.py", "commit"]], rows
    for row in rows:
        for file, name in zip(row[::2], row[1::2]):
            callee = _function(file, name)
            assert any(_calls(caller, callee) for caller in (
                speculative.step, speculative.score_and_verify, _function(*row[:2]))), name
    stack = _accept_test_stack()
    assert {"decoding/loop.py", "decoding/speculative.py", "sampling/rejection.py"} <= set(stack)
    assert set(stack) <= set(crossed), set(stack) - set(crossed)
    # The checks see a missing file and a call that is not there.
    assert not set(stack) <= set(crossed) - {"decoding/speculative.py"}
    assert not _calls(speculative.step, rejection.accepts)


# -- One Step numbering: Algorithm 2's ---------------------------------------------------------

def algorithm_2_steps() -> dict[int, str]:
    """The page's table of Algorithm 2's Steps: number -> name."""
    table = DOC.read_text().split("## The Steps of Algorithm 2")[1].split("\n## ")[0]
    rows = [row.split(" | ") for row in table.splitlines() if row.startswith("| ")]
    return {int(cells[0][2:]): cells[1] for cells in rows if cells[0][2:].isdigit()}


def step_mistakes(text: str, steps: dict[int, str]) -> tuple[int, list[str]]:
    """How many Step mentions `text` makes, and those that are not one of `steps` with its name:
    "Step 3 (accept or resample)", "Steps 3 and 4 (accept or resample, bonus)", "Steps 2 to 4
    (score, accept or resample, bonus)". Comment lines are joined first, so a mention may wrap."""
    text = re.sub(r"\s*\n\s*(?:#\s*)?", " ", text)
    wrong = [m.group(0) for m in re.finditer(r"\b[Ss]teps? \d+ ?[-–] ?\d+", text)]
    mentions = list(re.finditer(r"\bSteps? \d+", text))
    for mention in mentions:
        rest = text[mention.start():]
        one = re.match(r"Step (\d+) \(([^()]*)\)", rest)
        many = re.match(r"Steps (\d+) (and|to) (\d+) \(([^()]*)\)", rest)
        if one:
            numbers, names = [int(one[1])], one[2]
        elif many and (many[2] == "and") == (int(many[3]) == int(many[1]) + 1):
            numbers, names = list(range(int(many[1]), int(many[3]) + 1)), many[4]
        else:
            wrong.append(rest[:40])
            continue
        if not set(numbers) <= set(steps) or names != ", ".join(steps[n] for n in numbers):
            wrong.append(rest[:60])
    return len(mentions), wrong


def test_every_step_is_algorithm_2s_with_its_name():
    # One numbering of the Steps, Chen et al.'s Algorithm 2, on this page and in every docstring
    # and comment of specjax (the plain step, the verify, the tree walk, the method modules),
    # each mention with the name the page's table gives its number.
    steps = algorithm_2_steps()
    assert sorted(steps) == [1, 2, 3, 4], steps
    assert steps[1] == "draft" and steps[4] == "bonus", steps
    total, wrong = 0, {}
    for path in [DOC, *sorted((ROOT / "specjax").rglob("*.py"))]:
        count, mistakes = step_mistakes(path.read_text(), steps)
        total += count
        if mistakes:
            wrong[str(path.relative_to(ROOT))] = mistakes
    assert wrong == {}
    assert total >= 30, total                    # the check reads the mentions there are
    for module in ("reference/decoding.py", "reference/sampling.py", "sampling/rejection.py",
                   "decoding/speculative.py", "decoding/trees.py"):
        assert step_mistakes((ROOT / "specjax" / module).read_text(), steps)[0] > 0, module
    # It sees a mention numbered another way, or without its name, or with another's.
    for text in ("# Step 2: accept", "# Steps 3-4: the residual", "Step 5 (commit)",
                 "Step 2 (accept or resample)", "Steps 2 and 4 (score, bonus)",
                 "# Steps 2 to 4 (score,\n    # bonus)"):
        assert step_mistakes(text, steps)[1], text
    wrapped = "# Steps 2 to 4 (score, accept or\n    # resample, bonus)"
    assert step_mistakes(wrapped, steps) == (1, [])


def example_block() -> dict[str, str]:
    text = DOC.read_text()
    block = re.search(r"```worked-example\n(.*?)```", text, re.S).group(1)
    return dict(line.split(": ", 1) for line in block.strip().splitlines())


def numbers(text: str) -> np.ndarray:
    return np.array([float(v) for v in text.split()])


@pytest.mark.fast
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


@pytest.mark.fast
def test_verify_itself_behaves_as_the_example_says():
    # The real verify on the example, 200,000 rows, B drafted in each: B is accepted with
    # probability 0.4, and a rejected row draws from the residual (B never comes out of it).
    rows = 200_000
    bonus = np.array([0.25, 0.25, 0.25, 0.25])
    verdict = jax.jit(rejection.verify)(
        jnp.full((rows, 1), B), jnp.broadcast_to(jnp.float32(P), (rows, 1, 4)),
        jnp.broadcast_to(jnp.float32(np.stack([Q, bonus])), (rows, 2, 4)),
        jax.random.split(jax.random.key(0), rows))
    n, token = np.asarray(verdict.n_accepted), np.asarray(verdict.next_token)
    assert abs(n.mean() - 0.4) < 0.005                    # 5 standard errors at 200,000 rows
    assert not (token[n == 0] == B).any()
    residual = np.bincount(token[n == 0], minlength=4) / (n == 0).sum()
    np.testing.assert_allclose(residual, numbers(example_block()["residual"]), atol=0.01)


@pytest.mark.fast
def test_every_function_the_tables_name_exists():
    # In a table row, `file.py` (a path under specjax/, with or without it) is followed by the names it defines
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
                path = token.removeprefix("specjax/")       # paths under specjax/, either way
                module = importlib.import_module("specjax." + path[:-3].replace("/", "."))
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
    from tests.support.tiny import close_pair

    target, draft = close_pair(vocab=8, std=0.5, noise=0.3)
    kwargs = dict(method=specjax.Speculative(draft=draft, k=3),
                  sampling=specjax.SamplingParams(temperature=1.0), max_new_tokens=12, seed=3,
                  eos_ids=())
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
    from tests.support.tiny import close_pair

    target, draft = close_pair(vocab=8, std=0.5, noise=0.3)
    ids = np.arange(6)
    heads = init_heads(
        HeadsConfig(num_heads=2, num_blocks=1, hidden_size=target.config.d_model,
                            vocab_size=8, subset_size=6), target, ids, seed=0, std=0.3)
    drafter = eagle.init_drafter(target, token_ids=ids, seed=0, std=0.3, kind="eagle3",
                                 taps=(0, 1))
    full = specjax.Tree.full((2, 2))
    return target, {
        # one case per verification rule: without replacement, i.i.d., deterministic (an
        # EAGLE-2 dynamic tree: one topology per row, as data)
        "speculative-distinct": dict(method=specjax.Speculative(draft=draft, tree=full, candidates="distinct")),
        "medusa-iid": dict(method=specjax.Medusa(heads=heads, tree=full, candidates="iid")),
        "eagle3-dynamic": dict(method=specjax.Eagle(drafter=drafter, tree=specjax.DynamicTree(3, 2, 5))),
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
    kwargs = dict(cases[case], sampling=specjax.SamplingParams(temperature=1.0),
                  max_new_tokens=16, seed=3, eos_ids=())
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


def _tripled_verify(draft_tokens, draft_probs, target_probs, keys, num_drafted=None,
                    with_details=False):
    """Not Theorem 1's rule: each draft is tested against 3 q_i(x_i) (the bonus row is left as
    it is), so it accepts more and its numbers differ from the default's."""
    return rejection.verify(draft_tokens, draft_probs, target_probs.at[:, :-1].multiply(3.0),
                            keys, num_drafted=num_drafted, with_details=with_details)


def _tripled_verify_tree(tree, rule, tokens, valid, draft_probs, target_probs, keys,
                         with_details=False):
    """The walk against 3 q at every node (a bonus drawn from 3 q is drawn from q)."""
    return rejection.verify_tree(tree, rule, tokens, valid, draft_probs, 3.0 * target_probs,
                                 keys, with_details=with_details)


@pytest.mark.fast(cases=["chain"])
@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_explain_shows_the_rules_generate_ran(shape):
    # With rules other than the default, explain's steps append exactly the tokens generate
    # returns with those rules, and the numbers shown are those rules' own: the first step
    # drafts the same tokens as under the default rules (drafting reads no verify coin), and
    # its first test reads q(x) tripled, with the same p and u.
    import specjax
    from specjax.api.generate import generate
    from tests.support.tiny import close_pair

    target, draft = close_pair(vocab=8, std=0.5, noise=0.3)
    kwargs = dict(method=specjax.Speculative(draft=draft, k=3),
                  sampling=specjax.SamplingParams(temperature=1.0), max_new_tokens=12, seed=3,
                  eos_ids=())
    if shape == "chain":
        rules = Rules(verify=_tripled_verify)
    else:
        kwargs.update(method=specjax.Speculative(draft, tree=specjax.Tree.full((2, 2)),
                                                 candidates="distinct"))
        rules = Rules(verify_tree=_tripled_verify_tree)
    prompt = [1, 2, 3, 4]
    steps = specjax.explain(target, prompt, steps=20, rules=rules, **kwargs)
    tokens = generate(target, [prompt], rules=rules, **kwargs).tokens[0]
    assert [t for s in steps for t in s.new_tokens] == tokens
    default = specjax.explain(target, prompt, steps=1, **kwargs)[0]
    tests = [(d.token, d.p, d.q, d.u, d.accepted) for s in steps for d in getattr(s, "drafts", [])]
    tests += [(t.token, t.p, t.q, t.u, t.accepted) for s in steps for t in getattr(s, "trials", [])]
    first = tests[0]
    shown = (default.drafts[0] if shape == "chain" else default.trials[0])
    assert (first[0], first[1], first[3]) == (shown.token, shown.p, shown.u)
    np.testing.assert_allclose(first[2], 3 * shown.q, rtol=1e-6)
    assert all(accepted == (u * p < q) for _, p, q, u, accepted in tests)


@pytest.mark.fast
def test_explain_refuses_a_rule_that_returns_no_numbers():
    import specjax
    from specjax.api.generate import GenerationError
    from tests.support.tiny import close_pair

    def two_values(draft_tokens, draft_probs, target_probs, keys, num_drafted=None):
        return rejection.verify(draft_tokens, draft_probs, target_probs, keys, num_drafted)

    target, draft = close_pair(vocab=8, std=0.5, noise=0.3)
    with pytest.raises(GenerationError, match="'two_values' does not return them"):
        specjax.explain(target, [1, 2], method=specjax.Speculative(draft=draft),
                        rules=Rules(verify=two_values))


@pytest.mark.fast
def test_generate_declares_every_option():
    # generate, stream and explain take the target, the prompts, the method, the sampling and
    # the run's options, each declared as a keyword-only parameter with the default of
    # `Run`, where they are declared once; generate's docstring says what each one means; an
    # option of the old flat API is an error that says where it went, and any other unknown
    # keyword is Python's TypeError naming it.
    import specjax
    from specjax.api import generate as api

    head = ["target", "prompts", "method", "sampling"]
    run = ["max_new_tokens", "seed", "eos_ids", "mesh", "kernels", "coupled", "rules"]
    assert api.RUN_OPTIONS == tuple(run)
    for function in (specjax.generate, specjax.stream, specjax.explain, api.prepare):
        parameters = inspect.signature(function).parameters
        first = ["target", "prompt", *head[2:]] if function is specjax.explain else head
        own = ["steps", "top"] if function is specjax.explain else []
        assert list(parameters) == [*first, *own, *run], function.__name__
        keywords = {name: p.default for name, p in parameters.items()
                    if p.kind is inspect.Parameter.KEYWORD_ONLY}
        assert list(keywords) == [*own, *run], function.__name__
        assert [keywords[name] for name in run] == list(api.Run()), function.__name__
    described = specjax.generate.__doc__.split("The run's options")[1]
    assert re.findall(r"^      (\w+):", described, re.M) == run
    args = specjax.generate.__doc__.split("Args:")[1].split("The run's options")[0]
    assert re.findall(r"^      (\w+):", args, re.M) == head
    from tests.support.tiny import close_pair

    target, _ = close_pair(vocab=8, std=0.5, noise=0.3)
    for name, where in (("temperature", "a field of SamplingParams"),
                        ("k", "Speculative, NGram, Eagle, DFlash"), ("draft", "(Speculative)")):
        for call in (specjax.generate, specjax.stream):
            with pytest.raises(specjax.GenerationError, match=re.escape(where)):
                call(target, [[1, 2]], **{name: 1})
        with pytest.raises(specjax.GenerationError, match=re.escape(where)):
            specjax.explain(target, [1, 2], "ngram", **{name: 1})
    with pytest.raises(TypeError, match="unexpected keyword argument 'steps'"):
        specjax.generate(target, [[1, 2]], steps=1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'beams'"):
        specjax.explain(target, [1, 2], "ngram", beams=1)

SNAPSHOT = """\
step 1: 3 draft token(s) examined
  x = 3              p = 0.1995  q = 0.0476  u = 0.0071  u*p = 0.0014 < q  -> accept
  x = 4              p = 0.9623  q = 0.5830  u = 0.4083  u*p = 0.3930 < q  -> accept
  x = 2              p = 0.5677  q = 0.0078  u = 0.3429  u*p = 0.1947 >= q  -> reject
  residual normalize(max(q - p, 0)), top: 4 0.5229, 3 0.4735, 5 0.0037
  emitted 4 from the residual
  new tokens: 3 4 4"""
