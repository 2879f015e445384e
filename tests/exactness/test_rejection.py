"""Tests for specjax.sampling.rejection: Theorem 1 of Chen et al. 2023, exactly and statistically.

p = draft, q = target (Chen et al.'s letters). Exact tests compute laws in float64 (under
jax.enable_x64) from the same helpers `verify` is built from; statistical tests run `verify`
itself on many rows in one batched call and apply G-tests with a stated significance level, and
negative controls show that the same test, with the same seed, catches broken samplers.
"""

import itertools

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from specjax.sampling import rejection
from specjax.sampling.rejection import (
    acceptance_probability,
    accepts,
    emitted_token_law,
    num_leading_accepted,
    residual_distribution,
    verify,
)

# In the fast tier, every test of this module (tests/conftest.py, docs/tests.md).
pytestmark = pytest.mark.fast

SETTINGS = settings(max_examples=150, deadline=None)
verify_jit = jax.jit(verify)  # one compile per shape instead of op-by-op dispatch under vmap


# --- strategies -------------------------------------------------------------------------------


@st.composite
def distributions(draw, vocab):
    """A float64 distribution over `vocab` tokens: Dirichlet-like, with zeros, peaked or one-hot."""
    kind = draw(st.sampled_from(["dirichlet", "zeros", "peaked", "one_hot"]))
    if kind == "one_hot":
        return np.eye(vocab)[draw(st.integers(0, vocab - 1))]
    if kind == "peaked":
        weights = np.full(vocab, draw(st.floats(1e-12, 1e-2)))
        weights[draw(st.integers(0, vocab - 1))] = 1.0
    else:
        weights = draw(hnp.arrays(np.float64, vocab, elements=st.floats(1e-3, 1.0)))
        if kind == "zeros":
            zeros = draw(hnp.arrays(bool, vocab))
            zeros[draw(st.integers(0, vocab - 1))] = False  # keep some mass
            weights[zeros] = 0.0
    return weights / weights.sum()


@st.composite
def draft_target_pairs(draw):
    """(p, q) over vocab 2..8: independent, equal, or with disjoint supports."""
    vocab = draw(st.integers(2, 8))
    relation = draw(st.sampled_from(["independent", "equal", "disjoint"]))
    p = draw(distributions(vocab))
    if relation == "independent":
        return p, draw(distributions(vocab))
    if relation == "equal":
        return p, p.copy()
    split = draw(st.integers(1, vocab - 1))
    ids = np.asarray(draw(st.permutations(range(vocab))))
    p, q = np.zeros(vocab), np.zeros(vocab)
    p[ids[:split]] = draw(distributions(split))
    q[ids[split:]] = draw(distributions(vocab - split))
    return p, q


# --- helpers: hand-checked cases --------------------------------------------------------------


def test_acceptance_probability_cases():
    p_x = jnp.array([0.5, 0.2, 0.0, 0.0, 0.3])
    q_x = jnp.array([0.25, 0.4, 0.1, 0.0, 0.0])
    np.testing.assert_allclose(acceptance_probability(p_x, q_x), [0.5, 1.0, 1.0, 0.0, 0.0])


@SETTINGS
@given(
    p_x=st.one_of(st.just(0.0), st.floats(0.0, 1.0)),
    q_x=st.one_of(st.just(0.0), st.floats(0.0, 1.0)),
)
def test_accept_rule_has_the_acceptance_probability(p_x, q_x):
    # `accepts` is what verify uses; `acceptance_probability` is what the exact laws use. Over a
    # midpoint grid of M values of u the fraction accepted is within 1/M of the probability.
    grid = 4096
    with jax.enable_x64(True):
        u = (jnp.arange(grid) + 0.5) / grid
        p_x, q_x = jnp.float64(p_x), jnp.float64(q_x)
        fraction = float(jnp.mean(accepts(u, p_x, q_x)))
        assert abs(fraction - float(acceptance_probability(p_x, q_x))) <= 1.0 / grid + 1e-12


@pytest.mark.parametrize(
    "accepted, expected",
    [([1, 1, 1], 3), ([1, 0, 1], 1), ([0, 1, 1], 0), ([1, 1, 0], 2), ([0, 0, 0], 0)],
)
def test_num_leading_accepted_stops_at_first_rejection(accepted, expected):
    result = num_leading_accepted(jnp.array(accepted, bool))
    assert result.dtype == jnp.int32 and int(result) == expected


def test_residual_distribution_cases():
    p = jnp.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [0.0, 1.0, 0.0]])
    q = jnp.array([[0.25, 0.25, 0.5], [0.2, 0.3, 0.5], [0.5, 0.0, 0.5]])
    # Row 0: max(q - p, 0) = [0, 0, 0.5] -> [0, 0, 1]. Row 1: p == q, no mass -> q.
    # Row 2: q - p = [0.5, -1, 0.5] -> [0.5, 0, 0.5].
    out = residual_distribution(p, q)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, [[0, 0, 1], [0.2, 0.3, 0.5], [0.5, 0, 0.5]])


# --- Theorem 1, exactly -----------------------------------------------------------------------


@SETTINGS
@given(pair=draft_target_pairs())
def test_theorem_1_emitted_token_law_is_target_exactly(pair):
    p, q = pair
    with jax.enable_x64(True):
        law = np.asarray(emitted_token_law(jnp.asarray(p), jnp.asarray(q)))
        residual = np.asarray(residual_distribution(jnp.asarray(p), jnp.asarray(q)))
    assert law.dtype == np.float64
    np.testing.assert_allclose(law, q, rtol=0, atol=1e-12)
    assert np.all(np.isfinite(residual)) and abs(residual.sum() - 1) < 1e-12


def _conditional_tables(data, vocab, num_draft):
    """Draft p(.|prefix) for prefixes of length < K and target q(.|prefix) for length <= K."""
    p, q = {}, {}
    for length in range(num_draft + 1):
        for prefix in itertools.product(range(vocab), repeat=length):
            if length < num_draft:
                p[prefix] = data.draw(distributions(vocab))
            q[prefix] = data.draw(distributions(vocab))
    return p, q


@settings(max_examples=30, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(3, 2), (2, 3)]))
def test_theorem_1_multi_position_stream_law_is_target_product_exactly(data, shape):
    """The tokens of one verify block, continued by exact target sampling, follow the target.

    The distributions depend on the prefix, as they do for real models. Enumerating verify's
    branches (accept x_1..x_n, then reject x_{n+1} and draw y from the residual, or accept all K
    and draw the bonus), the block (x_1..x_n, y) is followed by exact target sampling up to K + 1
    tokens, which is what the next decoding iteration provides by induction. The law of those
    K + 1 tokens must be the target's autoregressive law prod_j q(s_j | s_<j), exactly.
    """
    vocab, num_draft = shape
    p, q = _conditional_tables(data, vocab, num_draft)
    draft_prefixes = list(p)
    with jax.enable_x64(True):
        p_all = jnp.asarray(np.stack([p[c] for c in draft_prefixes]))  # [prefixes, V]
        q_all = jnp.asarray(np.stack([q[c] for c in draft_prefixes]))
        accept = np.asarray(acceptance_probability(p_all, q_all))  # [prefixes, V]
        residual = np.asarray(residual_distribution(p_all, q_all))  # [prefixes, V]
    row = {c: i for i, c in enumerate(draft_prefixes)}

    def target_law(s, start):  # prod_{j >= start} q(s_j | s_<j)
        return np.prod([q[s[:j]][s[j]] for j in range(start, len(s))])

    total = 0.0
    for s in itertools.product(range(vocab), repeat=num_draft + 1):
        law, reach = 0.0, 1.0  # reach: P(x_1..x_n drafted as s_1..s_n and all accepted)
        for n in range(num_draft):
            ctx = s[:n]
            reject_mass = np.sum(p[ctx] * (1.0 - accept[row[ctx]]))
            law += reach * reject_mass * residual[row[ctx]][s[n]] * target_law(s, n + 1)
            reach *= p[ctx][s[n]] * accept[row[ctx]][s[n]]
        law += reach * q[s[:num_draft]][s[num_draft]]  # all K accepted, bonus token
        total += law
        assert abs(law - target_law(s, 0)) <= 1e-12, s
    assert abs(total - 1.0) <= 1e-12


# --- Theorem 1, statistically, on verify itself -----------------------------------------------

# K = 3 drafted tokens, V = 5. Acceptance rates sum_x min(p_i, q_i) = 0.6, 0.65, 0.7; q_1(0) = 0
# while p_1(0) = 0.4, q_3(3) = 0 while p_3(3) = 0.15 (such drafts must always be rejected).
DRAFT = np.array(
    [
        [0.40, 0.30, 0.15, 0.10, 0.05],
        [0.10, 0.20, 0.40, 0.20, 0.10],
        [0.25, 0.25, 0.20, 0.15, 0.15],
    ]
)
TARGET = np.array(
    [
        [0.00, 0.35, 0.25, 0.20, 0.20],
        [0.30, 0.25, 0.15, 0.10, 0.20],
        [0.10, 0.40, 0.20, 0.00, 0.30],
        [0.05, 0.10, 0.50, 0.15, 0.20],  # q_{K+1}, the bonus distribution
    ]
)
K, V = DRAFT.shape
N_ROWS = 200_000  # rows in one batched verify call
ALPHA = 1e-3  # family-wise significance level; Bonferroni-split over the G-tests of one run


def test_hand_derived_residuals_and_acceptance_rates_of_the_fixture():
    # max(q_i - p_i, 0) / mass: [0, .05, .1, .1, .15] / .4, [.2, .05, 0, 0, .1] / .35,
    # [0, .15, 0, 0, .15] / .3.
    expected = [[0, 1 / 8, 1 / 4, 1 / 4, 3 / 8], [4 / 7, 1 / 7, 0, 0, 2 / 7], [0, 0.5, 0, 0, 0.5]]
    np.testing.assert_allclose(residual_distribution(DRAFT, TARGET[:K]), expected, rtol=1e-6)
    rates = jnp.sum(DRAFT * acceptance_probability(DRAFT, TARGET[:K]), axis=-1)
    np.testing.assert_allclose(rates, [0.6, 0.65, 0.7], rtol=1e-6)


def exact_n_next_law(p, q):
    """[K + 1, V] float64 law of (n_accepted, next_token) for fixed p [K, V] and q [K + 1, V]."""
    num_draft = p.shape[0]
    with jax.enable_x64(True):
        accept = np.asarray(acceptance_probability(jnp.asarray(p), jnp.asarray(q[:num_draft])))
        residual = np.asarray(residual_distribution(jnp.asarray(p), jnp.asarray(q[:num_draft])))
    rates = np.sum(p * accept, axis=-1)  # [K]
    law, reach = np.zeros((num_draft + 1, p.shape[1])), 1.0
    for i in range(num_draft):
        law[i] = reach * (1.0 - rates[i]) * residual[i]
        reach *= rates[i]
    law[num_draft] = reach * q[num_draft]
    return law


EXACT_N_NEXT = exact_n_next_law(DRAFT, TARGET)  # computed at import, before any monkeypatching


def g_test_pvalue(counts, probs):
    """G-test p-value of counts against probs; observations in a zero-probability cell give 0."""
    counts, probs = np.asarray(counts, np.float64).ravel(), np.asarray(probs, np.float64).ravel()
    if np.any(counts[probs == 0] > 0):
        return 0.0
    support = probs > 0
    if support.sum() < 2:
        return 1.0
    expected = counts.sum() * probs[support] / probs[support].sum()
    return scipy.stats.power_divergence(counts[support], expected, lambda_="log-likelihood").pvalue


def run_verify(draft_tokens, draft_probs, target_probs, keys):
    # A fresh function object per call, so that jit traces again and sees monkeypatched helpers.
    verdict = jax.jit(lambda *args: rejection.verify(*args))(
        draft_tokens, draft_probs, target_probs, keys
    )
    return verdict.n_accepted, verdict.next_token


def sampled_pvalues():
    """Run verify on N_ROWS rows with a fixed seed; return the G-test p-values.

    Tests: the joint law of (n_accepted, next_token) against EXACT_N_NEXT, and, for each
    position i = 1..K+1, the i-th emitted token of the rows whose block reaches it against q_i
    (Theorem 1 applied position by position; this one does not use the helpers at all).
    """
    k_draft, k_verify = jax.random.split(jax.random.key(20230202))
    draft_probs = jnp.broadcast_to(jnp.float32(DRAFT), (N_ROWS, K, V))
    target_probs = jnp.broadcast_to(jnp.float32(TARGET), (N_ROWS, K + 1, V))
    draft_tokens = jax.random.categorical(k_draft, jnp.log(draft_probs))  # [N, K], x_i ~ p_i
    n, nxt = run_verify(draft_tokens, draft_probs, target_probs, jax.random.split(k_verify, N_ROWS))
    n, nxt, draft_tokens = np.asarray(n), np.asarray(nxt), np.asarray(draft_tokens)

    assert n.dtype == np.int32 and nxt.dtype == np.int32
    assert n.min() >= 0 and n.max() <= K and nxt.min() >= 0 and nxt.max() < V

    pvalues = [g_test_pvalue(np.bincount(n * V + nxt, minlength=(K + 1) * V), EXACT_N_NEXT)]
    for i in range(K + 1):
        reaches = n >= i  # the block emits at least i + 1 tokens
        emitted = nxt if i == K else np.where(n > i, draft_tokens[:, i], nxt)
        pvalues.append(g_test_pvalue(np.bincount(emitted[reaches], minlength=V), TARGET[i]))
    return np.array(pvalues)


def test_expected_counts_are_large_enough_for_the_g_test():
    nonzero = EXACT_N_NEXT[EXACT_N_NEXT > 0]
    assert N_ROWS * nonzero.min() > 1000
    np.testing.assert_allclose(EXACT_N_NEXT.sum(), 1.0, rtol=1e-12)


def test_verify_samples_the_exact_law():
    # N = 200_000 rows, family-wise alpha = 1e-3 over the K + 2 G-tests (Bonferroni).
    pvalues = sampled_pvalues()
    assert pvalues.min() > ALPHA / len(pvalues), pvalues


BROKEN_HELPERS = {
    "always_accept": ("accepts", lambda u, p_x, q_x: jnp.ones(u.shape, bool)),
    "letters_swapped": ("accepts", lambda u, p_x, q_x: u * q_x < p_x),
    "residual_is_target": ("residual_distribution", lambda p, q: jnp.asarray(q)),
    "rejection_after_an_accept_ignored": (
        "num_leading_accepted",
        lambda accepted: jnp.sum(accepted, axis=-1).astype(jnp.int32),
    ),
}


@pytest.mark.parametrize("bug", sorted(BROKEN_HELPERS))
def test_negative_control_broken_verify_fails_the_same_test(bug, monkeypatch):
    name, broken = BROKEN_HELPERS[bug]
    monkeypatch.setattr(rejection, name, broken)
    pvalues = sampled_pvalues()
    assert pvalues.min() < ALPHA / len(pvalues), pvalues


# --- verify: deterministic properties ---------------------------------------------------------


ROWS = 4096  # one batch shape for the tests below, so verify_jit compiles once for all of them


def verified(*args):
    """`verify_jit`'s n_accepted and next_token."""
    verdict = verify_jit(*args)
    return verdict.n_accepted, verdict.next_token


def rows_of(x):
    """Broadcast one row's array to ROWS rows (float inputs become float32)."""
    x = jnp.asarray(x)
    x = x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.int32)
    return jnp.broadcast_to(x, (ROWS, *x.shape))


def row_keys(seed):
    return jax.random.split(jax.random.key(seed), ROWS)


def one_hot(ids):
    return jnp.eye(V)[jnp.asarray(ids)]


def test_zero_target_probability_is_always_rejected():
    # x_1 = 0 has q_1(0) = 0: nothing is accepted and the residual never emits 0 either.
    n, nxt = verified(rows_of([0, 1, 1]), rows_of(DRAFT), rows_of(TARGET), row_keys(1))
    assert np.all(np.asarray(n) == 0) and np.all(np.asarray(nxt) != 0)
    # x_3 = 3 has q_3(3) = 0: at most two are accepted.
    n = verify_jit(rows_of([1, 0, 3]), rows_of(DRAFT), rows_of(TARGET), row_keys(1)).n_accepted
    assert np.asarray(n).max() <= 2


def test_first_rejection_stops_everything():
    # Position 1 is a sure accept (q >= p), position 2 a sure reject (q = 0), position 3 a sure
    # accept: n must be exactly 1 (counting all accepts would give 2), next ~ residual at 2 = q_2.
    drafted = [1, 2, 3]
    target = one_hot([1, 4, 3, 0])
    n, nxt = verified(rows_of(drafted), rows_of(one_hot(drafted)), rows_of(target), row_keys(2))
    assert np.all(np.asarray(n) == 1) and np.all(np.asarray(nxt) == 4)


@pytest.mark.parametrize("mismatch", [0, 1, 2, None])
def test_greedy_verification_with_one_hot_draft_and_target(mismatch):
    # Temperature 0 on both sides: accept while the draft's argmax equals the target's argmax,
    # then emit the target's argmax; if all agree, the target's next argmax is the bonus.
    target_argmax = [2, 0, 4, 1]
    drafted = target_argmax[:K]
    if mismatch is not None:
        drafted[mismatch] = (drafted[mismatch] + 1) % V
    n, nxt = verified(
        rows_of(drafted), rows_of(one_hot(drafted)), rows_of(one_hot(target_argmax)), row_keys(3)
    )
    expected_n = K if mismatch is None else mismatch
    assert np.all(np.asarray(n) == expected_n)
    assert np.all(np.asarray(nxt) == target_argmax[expected_n])


def test_one_hot_draft_equal_to_one_hot_target_is_accepted_and_bonus_drawn_from_q_bonus():
    # N = 4096 rows; G-test of the bonus tokens against q_{K+1} at alpha = 1e-3.
    drafted = [3, 3, 0]
    target = jnp.concatenate([one_hot(drafted), jnp.asarray(TARGET[K:])])  # [K + 1, V]
    n, nxt = verified(rows_of(drafted), rows_of(one_hot(drafted)), rows_of(target), row_keys(4))
    assert np.all(np.asarray(n) == K)
    assert g_test_pvalue(np.bincount(np.asarray(nxt), minlength=V), TARGET[K]) > 1e-3


def test_rows_are_independent_and_key_formats_agree():
    k_draft, k_verify = jax.random.split(jax.random.key(5))
    draft_probs, target_probs = rows_of(DRAFT), rows_of(TARGET)
    tokens = jax.random.categorical(k_draft, jnp.log(draft_probs)).astype(jnp.int32)
    keys = jax.random.split(k_verify, ROWS)
    n, nxt = verified(tokens, draft_probs, target_probs, keys)
    n_raw, nxt_raw = verified(tokens, draft_probs, target_probs, jax.random.key_data(keys))
    np.testing.assert_array_equal(n, n_raw)
    np.testing.assert_array_equal(nxt, nxt_raw)
    for i in [0, 1, 2, ROWS - 1]:
        row = slice(i, i + 1)
        n_i, nxt_i = verified(tokens[row], draft_probs[row], target_probs[row], keys[row])
        assert (int(n_i[0]), int(nxt_i[0])) == (int(n[i]), int(nxt[i]))


@pytest.mark.parametrize(
    "shapes",
    [
        dict(tokens=(2, 0), draft=(2, 0, 5), target=(2, 1, 5), keys=2),  # K = 0
        dict(tokens=(2, 3), draft=(2, 2, 5), target=(2, 4, 5), keys=2),
        dict(tokens=(2, 3), draft=(2, 3, 5), target=(2, 3, 5), keys=2),
        dict(tokens=(2, 3), draft=(2, 3, 5), target=(2, 4, 6), keys=2),
        dict(tokens=(2, 3), draft=(2, 3, 5), target=(2, 4, 5), keys=3),
    ],
)
def test_bad_shapes_raise_value_error(shapes):
    with pytest.raises(ValueError, match="shape"):
        verify(
            jnp.zeros(shapes["tokens"], jnp.int32),
            jnp.zeros(shapes["draft"]),
            jnp.zeros(shapes["target"]),
            jax.random.split(jax.random.key(0), shapes["keys"]),
        )
