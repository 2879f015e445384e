"""Token trees: the topology, tree attention, the exact law of tree verification, and decoding.

The statistical end-to-end tests of tree decoding (G-tests and their negative controls) live
with the other methods' in test_distribution.py.
"""

import itertools
import json

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

import specjax
from specjax.api.generate import GenerationError, generate
from specjax.decoding import trees
from specjax.decoding.prefill import prefill
from specjax.io.checkpoint import random_model
from specjax.model.cache import KVCache
from specjax.model.transformer import forward as eager_forward
from specjax.sampling import rejection
from specjax.sampling.tree import Tree, TreeError
from tests.support.tiny import pair

forward = jax.jit(eager_forward, static_argnums=1)

MEDUSA_LIKE = ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0))


# -- Topology -----------------------------------------------------------------------------------

@pytest.mark.fast
def test_full_tree_sizes_and_arrays():
    tree = Tree.full((3, 2, 1))
    assert tree.size == 3 + 6 + 6 and tree.max_depth == 3 and tree.max_width == 3
    assert list(tree.level(1)) == [1, 2, 3] and list(tree.level(3)) == list(range(10, 16))
    # Breadth-first: every parent comes before its children.
    assert all(tree.parent[i] < i for i in range(1, tree.size + 1))
    for i, path in enumerate(tree.paths, start=1):
        # ancestors[i] holds exactly the nodes whose paths are prefixes of i's path.
        expected = {0} | {j for j, other in enumerate(tree.paths, start=1)
                          if path[:len(other)] == other}
        assert set(np.flatnonzero(tree.ancestors[i])) == expected
        assert tree.children[tree.parent[i], path[-1]] == i
        assert tree.depth[i] == len(path)


@pytest.mark.fast
def test_a_chain_is_the_causal_mask():
    chain = Tree.chain(4)
    assert chain.paths == ((0,), (0, 0), (0, 0, 0), (0, 0, 0, 0))
    np.testing.assert_array_equal(chain.ancestors, np.tril(np.ones((5, 5), bool)))
    assert Tree.from_paths([[0, 0], [0]]) == Tree.from_paths(((0,), (0, 0)))    # order-free


@pytest.mark.fast
@pytest.mark.parametrize("paths, needle", [
    (((0,), (0, 1)), "[0, 1] skips a rank"),
    (((0,), (1, 0, 0)), "[1, 0, 0] has no parent"),
    (((0,), (-1,)), "rank -1"),
    (((0,), (0,)), "[0] appears twice"),
    (((0,), ()), "non-empty"),
    ((), "non-empty list of paths"),
    (((0,), (0.5,)), "rank 0.5"),
])
def test_malformed_trees_are_errors_naming_the_path(paths, needle):
    with pytest.raises(TreeError) as info:
        Tree.from_paths(paths)
    assert needle in str(info.value)


@pytest.mark.fast
def test_tree_file(tmp_path):
    path = tmp_path / "choices.json"
    path.write_text(json.dumps([list(p) for p in MEDUSA_LIKE]))
    assert Tree.from_json(str(path)) == Tree.from_paths(MEDUSA_LIKE)
    path.write_text("[[0], [2]]")
    with pytest.raises(TreeError, match=r"\[2\] skips a rank"):
        Tree.from_json(str(path))


# -- Tree attention -----------------------------------------------------------------------------

CONFIGS = {
    "llama-gqa": specjax.ModelConfig(arch="llama", vocab_size=50, d_model=32, n_layers=2,
                                     n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48,
                                     max_positions=64, norm_eps=1e-6, activation="silu",
                                     tie_embeddings=False),
    "gpt2": specjax.ModelConfig(arch="gpt2", vocab_size=50, d_model=32, n_layers=2, n_heads=4,
                                n_kv_heads=4, head_dim=8, d_ff=64, max_positions=64,
                                norm_eps=1e-5, activation="gelu_tanh", tie_embeddings=True,
                                qkv_bias=True, out_bias=True, mlp_bias=True),
}
SLOTS = 48
ATOL = 2e-5


@pytest.fixture(scope="module", params=CONFIGS)
def model(request):
    return random_model(CONFIGS[request.param], seed=1, std=0.3)


def prefilled(model, lengths, seed=0):
    """Ragged random prompts, prefilled up to (not including) each row's last token."""
    rng = np.random.default_rng(seed)
    prompts = np.zeros((len(lengths), max(lengths)), np.int32)
    for b, n in enumerate(lengths):
        prompts[b, :n] = rng.integers(0, model.config.vocab_size, n)
    length = np.array(lengths, np.int32)
    cache = prefill(model.params, model.config, prompts, length, SLOTS).cache
    return prompts, length, cache


def test_tree_logits_equal_chain_logits_and_the_kept_path_equals_the_chain(model):
    tree = Tree.from_paths(MEDUSA_LIKE)
    n = tree.size + 1
    prompts, length, cache = prefilled(model, [7, 12, 3])
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, model.config.vocab_size, (3, n)).astype(np.int32)
    root = length - 1
    tokens[:, 0] = prompts[np.arange(3), root]
    logits, tree_cache = forward(model.params, model.config, tokens,
                                 trees.node_positions(tree, jnp.asarray(root)), cache,
                                 trees.tree_attention(tree, jnp.asarray(root)))

    def chain_to(node):     # the node's ancestors, root first
        return [int(j) for j in np.flatnonzero(tree.ancestors[node])]

    for node in range(n):
        chain = chain_to(node)
        positions = root[:, None] + np.arange(len(chain))
        want, _ = forward(model.params, model.config, tokens[:, chain], positions, cache)
        np.testing.assert_allclose(logits[:, node], want[:, -1], atol=ATOL, err_msg=f"node {node}")

    # Each row accepts a different path; after keep_path its cache equals feeding that path.
    accepted = [chain_to(7)[1:], chain_to(5)[1:], chain_to(3)[1:]]     # depths 3, 2, 1
    path = np.array([p + [p[-1]] * (tree.max_depth - len(p)) for p in accepted], np.int32)
    kept = trees.keep_path(tree_cache, jnp.asarray(root), jnp.asarray(path), n)
    for b, p in enumerate(accepted):
        chain = [0] + p
        _, want = forward(model.params, model.config, tokens[b:b + 1, chain],
                          root[b] + np.arange(len(chain))[None], _row(cache, b))
        stop = root[b] + len(chain)
        for layer in range(model.config.n_layers):
            np.testing.assert_allclose(kept.k[layer][b, ..., :stop], want.k[layer][0, ..., :stop],
                                       atol=ATOL)
            np.testing.assert_allclose(kept.v[layer][b, :, :stop], want.v[layer][0, :, :stop],
                                       atol=ATOL)


def _row(cache, b):
    return KVCache(cache.k[:, b:b + 1], cache.v[:, b:b + 1], cache.length[b:b + 1], cache.first)


def test_a_sibling_branch_changes_nothing(model):
    # Replacing every token outside node 4's ancestry leaves node 4's logits unchanged.
    tree = Tree.full((2, 2))
    prompts, length, cache = prefilled(model, [9, 5])
    root = jnp.asarray(length - 1)
    tokens = np.tile(prompts[np.arange(2), length - 1][:, None], (1, tree.size + 1))
    tokens[:, 1:] = np.arange(1, tree.size + 1)
    other = tokens.copy()
    unrelated = ~tree.ancestors[4]
    other[:, unrelated] = (other[:, unrelated] + 7) % model.config.vocab_size
    args = (trees.node_positions(tree, root), cache, trees.tree_attention(tree, root))
    a, _ = forward(model.params, model.config, tokens, *args)
    b, _ = forward(model.params, model.config, other, *args)
    np.testing.assert_array_equal(a[:, 4], b[:, 4])
    assert not np.allclose(a[:, 2], b[:, 2])     # node 2 itself was changed


# -- Theorem 1, exactly --------------------------------------------------------------------------
#
# For a tree and the distributions p (draft) and q (target) at every path, the law of the tokens
# a tree step emits, continued with q where the step stops early, is computed exactly by
# enumerating every draw of the candidates with the verifier's own helpers
# (`acceptance_probability`, `candidate_distribution`, `after_rejection`). Theorem 1 says it is
# the target's law: the product of q along the sequence.

SCHEME_RULES = {"iid": "iid", "distinct": "without_replacement", "top": "deterministic"}


def candidate_draws(scheme, p, score, width):
    """[(probability, (x_1..x_w))] for one node; None marks a sibling left unfilled."""
    if scheme == "top":         # deterministic: the `width` best tokens by the draft's score
        return [(1.0, tuple(int(x) for x in np.argsort(-score, kind="stable")[:width]))]
    if scheme == "iid":
        return [(float(np.prod(p[list(xs)])), xs)
                for xs in itertools.product(range(len(p)), repeat=width)]

    def without_replacement(left, k):
        mass = left.sum()
        if k == 0 or mass <= 0:        # p ran out of tokens: the rest stay unfilled
            yield 1.0, (None,) * k
            return
        for x in np.flatnonzero(left):
            rest = left.copy()
            rest[x] = 0.0
            for prob, xs in without_replacement(rest, k - 1):
                yield left[x] / mass * prob, (int(x),) + xs

    return list(without_replacement(np.asarray(p, np.float64), width))


class Law:
    """Exact laws for one tree and one family of p, q (functions of the path so far)."""

    def __init__(self, tree, scheme, p_of, q_of, score_of, vocab):
        self.tree, self.scheme, self.rule = tree, scheme, SCHEME_RULES[scheme]
        self.p_of, self.q_of, self.score_of, self.vocab = p_of, q_of, score_of, vocab
        self.length = tree.max_depth + 1

    def target(self, prefix=()):
        """[V] * (length - len(prefix)): the law of q continued from prefix."""
        if len(prefix) == self.length:
            return np.ones(())
        q = self.q_of(prefix)
        return np.stack([q[y] * self.target(prefix + (y,)) for y in range(self.vocab)])

    def step(self, node=0, prefix=()):
        """The law of the step's output from `node` (reached via `prefix`), continued with q."""
        kids = [int(c) for c in self.tree.children[node] if c >= 0]
        q = self.q_of(prefix)
        if not kids:                                      # Step 4: the bonus token from q
            return self.target(prefix)
        law = np.zeros((self.vocab,) * (self.length - len(prefix)))
        p = self.p_of(prefix)
        for prob, xs in candidate_draws(self.scheme, p, self.score_of(prefix), len(kids)):
            reach, p_now, q_now = prob, jnp.asarray(p), jnp.asarray(q)
            for child, x in zip(kids, xs):
                if x is None:
                    continue
                p_r = rejection.candidate_distribution(self.rule, p_now, jnp.asarray(x))
                if float(p_r[x]) == 0:                    # cannot have been drawn: skipped
                    continue
                a = float(rejection.acceptance_probability(p_r[x], q_now[x]))     # Step 1
                law[x] += reach * a * self.step(child, prefix + (x,))              # Step 3
                reach *= 1 - a
                p_now, q_now = rejection.after_rejection(self.rule, p_now, q_now,
                                                         jnp.asarray(x))         # Step 2
            residual = np.asarray(q_now)
            for y in range(self.vocab):                   # Step 4: from the final residual
                law[y] += reach * residual[y] * self.target(prefix + (y,))
        return law


def random_tree(data, max_width=3, max_depth=3, max_nodes=9):
    """A random tree of width <= 3 and depth <= 3 (ranks contiguous), at most 9 nodes: the
    enumeration's cost grows as vocab^width at every node reached."""
    paths, frontier = [], [()]
    for _ in range(data.draw(st.integers(1, max_depth), label="depth")):
        nxt = []
        for parent in frontier:
            room = max_nodes - len(paths) - len(nxt)
            w = data.draw(st.integers(0 if parent else 1, max(0, min(max_width, room))),
                          label="width")
            nxt += [parent + (r,) for r in range(w)]
        if not nxt:
            break
        paths += nxt
        frontier = nxt
    return Tree.from_paths(paths)


def distributions(rng, vocab, kind):
    """A random distribution over `vocab` tokens, shaped by `kind`."""
    if kind == "one-hot":
        return np.eye(vocab)[rng.integers(vocab)]
    x = rng.dirichlet(np.ones(vocab) * 0.7)
    if kind == "sparse":
        x = x * (rng.random(vocab) < 0.6)
        x[rng.integers(vocab)] += 0.1
    return x / x.sum()


@pytest.mark.fast
@settings(max_examples=30, deadline=None)
@given(data=st.data(), vocab=st.integers(2, 3), scheme=st.sampled_from(list(SCHEME_RULES)),
       p_kind=st.sampled_from(["dense", "sparse", "one-hot", "equal"]),
       q_kind=st.sampled_from(["dense", "sparse", "one-hot"]), seed=st.integers(0, 2**31))
def test_tree_verification_emits_the_target_law_exactly(data, vocab, scheme, p_kind, q_kind,
                                                        seed):
    tree = random_tree(data)
    table = {}

    def of(kind, name):
        def at(prefix):
            key = (name, prefix)
            if key not in table:
                rng = np.random.default_rng([seed, len(name), *prefix, 99])
                table[key] = (at_q(prefix) if kind == "equal" else
                              distributions(rng, vocab, kind) if name != "score" else
                              rng.random(vocab))
            return table[key]
        return at

    at_q = of(q_kind, "q")
    law = Law(tree, scheme, of(p_kind, "p"), at_q, of("dense", "score"), vocab)
    with jax.enable_x64(True):
        np.testing.assert_allclose(law.step(), law.target(), rtol=0, atol=1e-12)


@pytest.mark.fast
def test_the_wrong_rule_for_the_scheme_is_not_exact():
    # Candidates drawn without replacement but verified as if i.i.d.: the later siblings are
    # over-accepted, so the law moves off q. (The same mistake fails a G-test end to end.)
    vocab, tree = 4, Tree.full((2,))
    p, q = np.array([0.4, 0.3, 0.2, 0.1]), np.array([0.1, 0.2, 0.3, 0.4])
    law = Law(tree, "distinct", lambda _: p, lambda _: q, lambda _: p, vocab)
    with jax.enable_x64(True):
        np.testing.assert_allclose(law.step(), law.target(), rtol=0, atol=1e-12)
        law.rule = "iid"
        assert np.abs(law.step() - law.target()).max() > 0.015     # measured: 0.0173


@pytest.mark.fast
def test_verify_tree_follows_the_walk():
    # One row, hand-checkable: q puts all its mass on the root's second child's token, and that
    # node's first child is q's choice after it; the walk accepts both and draws the bonus.
    tree, vocab = Tree.full((2, 2)), 5
    tokens = jnp.array([[4, 1, 2, 3, 0, 0, 3]])          # nodes 0..6: (0,)=1 (1,)=2 (1,0)=0
    q = np.full((1, 7, vocab), 0.0)
    q[0, 0, 2] = 1.0                                       # after the root: token 2
    q[0, 2, 0] = 1.0                                       # after node 2 (token 2): token 0
    q[0, 5, 4] = 1.0                                       # after node 5 (token 0): bonus 4
    verdict = rejection.verify_tree(tree, "deterministic", tokens, jnp.ones((1, 7), bool), None,
                                    jnp.asarray(q), jax.random.split(jax.random.key(0), 1))
    n, path, token = verdict.n_accepted, verdict.path, verdict.next_token
    assert int(n[0]) == 2 and path[0].tolist() == [2, 5] and int(token[0]) == 4


# -- Decoding -------------------------------------------------------------------------------------

PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3, 4], [7, 6], [5], [3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 2]]
N = 24
SHAPES = {"chain-3": Tree.chain(3), "full-2-2-1": Tree.full((2, 2, 1)),
          "full-3-2": Tree.full((3, 2)), "medusa-like": Tree.from_paths(MEDUSA_LIKE)}


@pytest.fixture(scope="module")
def models():
    return pair(vocab=8, std=0.5)


@pytest.fixture(scope="module")
def greedy(models):
    return generate(models[0], PROMPTS, sampling=specjax.SamplingParams(temperature=0.0),
                    max_new_tokens=N, eos_ids=()).tokens


# Full 2,2,1 trees are compared with the greedy output in the EOS test below.
GREEDY_CASES = [("speculative", "full-3-2"), ("speculative", "medusa-like"),
                ("ngram", "medusa-like")]


@pytest.mark.fast(cases=["speculative-full-3-2", "ngram-medusa-like"])
@pytest.mark.parametrize("method, shape", GREEDY_CASES)
def test_greedy_trees_equal_autoregressive(models, greedy, method, shape):
    target, draft = models
    tree = SHAPES[shape]
    result = generate(target, PROMPTS,
                      method=specjax.api.methods.build_shared(method, draft=draft, tree=tree),
                      sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=N,
                      eos_ids=())
    assert result.tokens == greedy
    stats = result.stats
    assert stats.tree_size == tree.size
    if method == "speculative":
        assert stats.draft_calls == tree.max_depth * stats.target_calls


@pytest.mark.slow
def test_greedy_trees_equal_autoregressive_on_xlas_path(models):
    # XLA's path (issue 85): each node's attention over its branch laid out as in steps
    # (`cache.branch_layout`), on ragged rows of a batch, each tree rooted in its own slot.
    target, draft = models
    sampling = specjax.SamplingParams(temperature=0.0)
    greedy = generate(target, PROMPTS, sampling=sampling, max_new_tokens=N, eos_ids=(),
                      kernels=False).tokens
    result = generate(target, PROMPTS, method=specjax.api.methods.build_shared(
        "speculative", draft=draft, tree=SHAPES["medusa-like"]), sampling=sampling,
        max_new_tokens=N, eos_ids=(), kernels=False)
    assert result.tokens == greedy
    assert result.stats.accepted > 0

def test_a_chain_tree_is_the_chain(models, greedy):
    # At temperature 0 the chain tree makes the same choices as the chain code, call for call.
    target, draft = models
    kwargs = dict(sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=N, eos_ids=())
    for method in ("speculative", "ngram"):
        chain = generate(target, PROMPTS,
                         method=specjax.api.methods.build_shared(method, draft=draft, k=3),
                         **kwargs)
        tree = generate(target, PROMPTS,
                        method=specjax.api.methods.build_shared(method, draft=draft, tree=SHAPES["chain-3"]),
                        **kwargs)
        assert tree.tokens == chain.tokens == greedy
        assert ((tree.stats.target_calls, tree.stats.accepted)
                == (chain.stats.target_calls, chain.stats.accepted))


def test_draft_equal_to_target_accepts_a_whole_path(models):
    target, _ = models
    tree, rounds = Tree.full((2, 2, 1)), 5
    result = generate(target, PROMPTS, method=specjax.Speculative(draft=target, tree=tree),
                      sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=rounds * 4,
                      eos_ids=())
    assert result.stats.target_calls == rounds * len(PROMPTS)
    assert result.stats.tokens_per_target_call == tree.max_depth + 1


@pytest.mark.parametrize("method", ["speculative", "ngram"])
def test_tree_stops_exactly_at_eos_and_max_new_tokens(models, greedy, method):
    target, draft = models
    tree = Tree.full((2, 2, 1))
    eos = greedy[0][5]
    result = generate(target, PROMPTS,
                      method=specjax.api.methods.build_shared(method, draft=draft, tree=tree),
                      sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=N,
                      eos_ids=(eos,))
    for got, want in zip(result.tokens, greedy):
        assert got == (want[:want.index(eos) + 1] if eos in want else want)
    short = generate(target, PROMPTS,
                     method=specjax.api.methods.build_shared(method, draft=draft, tree=tree),
                     sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=2, eos_ids=())      # a step could accept 4: never overshoots
    assert short.tokens == [g[:2] for g in greedy]


def test_a_tree_row_alone_equals_the_row_in_a_batch(models):
    target, draft = models
    kwargs = dict(method=specjax.Speculative(draft=draft, tree=Tree.full((2, 2, 1))),
                  sampling=specjax.SamplingParams(temperature=1.0), max_new_tokens=N, eos_ids=())
    batch = generate(target, PROMPTS, seed=[5, 6, 7, 8], **kwargs).tokens
    assert generate(target, [PROMPTS[2]], seed=[7], **kwargs).tokens[0] == batch[2]
    assert generate(target, PROMPTS, seed=[5, 6, 7, 8], **kwargs).tokens == batch


@pytest.mark.fast
@pytest.mark.parametrize("kwargs, needle", [
    (dict(method="autoregressive", tree=((0,),)),
     "tree does not apply to method 'autoregressive'"),
    (dict(method="ngram", tree=((0,), (0, 0, 0))), "[0, 0, 0] has no parent"),
    (dict(method="ngram", tree=((0,), (-1,))), "rank -1"),
    (dict(method="speculative", tree=Tree.chain(200)), "the tree has 200 nodes"),
    (dict(method="speculative", tree=((0,),), candidates="distinct", temperature=0.0),
     "candidates='distinct'"),
    (dict(method="speculative", tree=((0,),), candidates="beam"), "'beam'"),
    (dict(method="ngram", tree=((0,),), candidates="iid"),
     "candidates does not apply to method 'ngram'"),
    (dict(method="speculative", candidates="iid"), "pass tree=... too"),
    (dict(method="speculative", tree_size=3), "tree_size does not apply to method"),
])
def test_invalid_tree_arguments_raise(models, kwargs, needle):
    # Each case as the command line builds it (`methods.build`): a name and its options.
    target, draft = models
    name = kwargs.pop("method")
    sampling = specjax.SamplingParams(temperature=kwargs.pop("temperature", 1.0))
    with pytest.raises(GenerationError) as info:
        method = specjax.api.methods.build(name, draft=draft if name == "speculative" else None,
                                           **kwargs)
        generate(target, PROMPTS, method, sampling)
    assert needle in str(info.value)
