"""Tests for specjax.sampling.logits: the single source of the sampling distribution.

Expected values in the hand-computed examples are derived in comments from dyadic probabilities
(0.5, 0.25, 0.125, ...) so that they do not depend on the code under test.
"""

import math

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from specjax.sampling import logits as logits_module
from specjax.sampling.logits import (Sampling, SamplingParams, has_nan, probs_from_logits, sample,
                                   sample_rows)

F32_MAX = float(np.finfo(np.float32).max)
SETTINGS = settings(max_examples=100, deadline=None)

# Logit values that break naive implementations: -inf masks, signed zeros, values whose
# difference or quotient by a small temperature overflows float32.
SPECIAL = [-math.inf, 0.0, -0.0, 1.0, 1e30, -1e30, F32_MAX, -F32_MAX]
logit_values = st.one_of(st.floats(-1e4, 1e4, width=32), st.sampled_from(SPECIAL))


@st.composite
def logit_rows(draw):
    """[V] float32 logits, V in 1..8: arbitrary, or all -inf but one finite entry."""
    vocab = draw(st.integers(1, 8))
    if draw(st.booleans()):
        return draw(hnp.arrays(np.float32, vocab, elements=logit_values))
    logits = np.full(vocab, -np.inf, np.float32)
    logits[draw(st.integers(0, vocab - 1))] = draw(st.floats(-F32_MAX, F32_MAX, width=32))
    return logits


sampling_params = st.builds(
    SamplingParams,
    temperature=st.one_of(
        st.sampled_from([0.0, 1e-6, 0.5, 1.0, 2.0, 1e6]), st.floats(1e-3, 10.0)
    ),
    top_k=st.integers(0, 10),
    top_p=st.one_of(st.just(1.0), st.floats(0.0, 1.0, exclude_min=True)),
)


def probs(logits, **kwargs):
    return np.asarray(probs_from_logits(jnp.asarray(logits, jnp.float32), SamplingParams(**kwargs)))


def dyadic_logits():
    # softmax(log p) = p for p = [1/2, 1/4, 1/8, 1/8].
    return np.log(np.array([0.5, 0.25, 0.125, 0.125], np.float32))


# --- greedy -----------------------------------------------------------------------------------


def test_temperature_zero_is_one_hot_of_argmax_with_lowest_id_on_ties():
    logits = np.array([[1.0, 5.0, 5.0, 2.0], [-np.inf, -np.inf, 0.0, 0.0]], np.float32)
    np.testing.assert_array_equal(
        probs(logits, temperature=0.0), [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]]
    )


def test_greedy_ignores_top_k_and_top_p():
    logits = np.array([0.0, 2.0, 1.0], np.float32)
    np.testing.assert_array_equal(probs(logits, temperature=0.0, top_k=2, top_p=0.3), [0, 1, 0])


@SETTINGS
@given(logits=logit_rows(), temperature=st.sampled_from([1e-6, 0.5, 1.0, 7.0]))
def test_top_k_1_equals_greedy(logits, temperature):
    np.testing.assert_array_equal(
        probs(logits, temperature=temperature, top_k=1), probs(logits, temperature=0.0)
    )


# --- top-k ------------------------------------------------------------------------------------


@SETTINGS
@given(data=st.data())
def test_top_k_keeps_exactly_the_k_largest(data):
    vocab = data.draw(st.integers(1, 8))
    logits = data.draw(
        # Subnormals are excluded: XLA on CPU flushes them to zero, which creates ties.
        hnp.arrays(
            np.float32,
            vocab,
            elements=st.floats(-20, 20, width=32, allow_subnormal=False),
            unique=True,
        )
    )
    k = data.draw(st.integers(1, vocab))
    out = probs(logits, top_k=k)
    kept = np.flatnonzero(out > 0)
    np.testing.assert_array_equal(np.sort(kept), np.sort(np.argsort(-logits)[:k]))
    # The kept tokens keep their relative odds: softmax restricted to them.
    expected = np.exp(logits[kept] - logits[kept].max())
    np.testing.assert_allclose(out[kept], expected / expected.sum(), rtol=1e-5)


def test_top_k_ties_keep_lowest_ids():
    # Ids 1, 2, 3 tie at the 2nd-largest value; k = 2 keeps the two lowest of them, equally.
    np.testing.assert_array_equal(
        probs([1.0, 3.0, 3.0, 3.0, 0.0], top_k=2), [0.0, 0.5, 0.5, 0.0, 0.0]
    )


def test_top_k_at_least_vocab_is_off():
    np.testing.assert_allclose(probs(dyadic_logits(), top_k=4), [0.5, 0.25, 0.125, 0.125])
    np.testing.assert_allclose(probs(dyadic_logits(), top_k=99), [0.5, 0.25, 0.125, 0.125])


# --- top-p ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        # p = [1/2, 1/4, 1/8, 1/8]; mass of the top 1, 2, 3 tokens: 0.5, 0.75, 0.875.
        (dict(top_p=0.3), [1.0, 0.0, 0.0, 0.0]),  # 0.5 >= 0.3
        (dict(top_p=0.7), [2 / 3, 1 / 3, 0.0, 0.0]),  # 0.5 < 0.7 <= 0.75
        (dict(top_p=0.8), [4 / 7, 2 / 7, 1 / 7, 0.0]),  # 0.75 < 0.8 <= 0.875
        (dict(top_p=0.9), [0.5, 0.25, 0.125, 0.125]),  # 0.875 < 0.9: all four
        # Temperature first: T = 1/2 squares p -> [1/4, 1/16, 1/64, 1/64] / (22/64)
        # = [16, 4, 1, 1] / 22. Top-1 mass 16/22 = 0.727 < 0.8 <= top-2 mass 20/22:
        # keep two, renormalized [16, 4] / 20 = [0.8, 0.2]. (Without temperature first,
        # top_p = 0.8 would keep three tokens, see above.)
        (dict(temperature=0.5, top_p=0.8), [0.8, 0.2, 0.0, 0.0]),
        # Top-k before top-p: top_k = 2 leaves [2/3, 1/3]; 2/3 >= 0.6 keeps only the top token.
        # (Top-p first would keep two tokens, since 0.5 < 0.6.)
        (dict(top_k=2, top_p=0.6), [1.0, 0.0, 0.0, 0.0]),
    ],
)
def test_top_p_keeps_the_minimal_nucleus(kwargs, expected):
    np.testing.assert_allclose(probs(dyadic_logits(), **kwargs), expected, rtol=1e-5, atol=1e-7)


def test_top_p_ties_keep_lowest_ids():
    # Four equal tokens of 1/4: 1/4 < 0.4 <= 1/2, so two are kept: the two lowest ids.
    np.testing.assert_allclose(probs(np.zeros(4), top_p=0.4), [0.5, 0.5, 0.0, 0.0])


def test_tiny_top_p_keeps_the_top_token():
    np.testing.assert_array_equal(probs(dyadic_logits(), top_p=1e-9), [1.0, 0.0, 0.0, 0.0])


# --- the heads: top-k and top-p without sorting the vocabulary ---------------------------------


def kept_by_definition(x, temperature, top_k, top_p, min_p):
    """The tokens one row keeps, by the module docstring's definition, in float64 over a stable
    sort of (-logit, id); independent of the heads the library looks the ranks up in."""
    x = np.asarray(x, np.float64)
    order = np.argsort(-x, kind="stable")
    ranks = np.arange(len(x))
    weights = np.exp((x[order] - x[order][0]) / temperature)
    keep = ranks < (top_k if 0 < top_k < len(x) else len(x))
    p = np.where(keep, weights, 0.0) / np.where(keep, weights, 0.0).sum()
    before = np.cumsum(p) - p
    keep &= (top_p >= 1) | (before < top_p) | (ranks == 0)
    keep &= weights >= min_p
    out = np.zeros(len(x), bool)
    out[order] = keep
    return out, np.min(np.abs(before - top_p)), np.min(np.abs(weights - min_p) / max(min_p, 1e-30))


def rows_sampling(settings):
    return Sampling.of([SamplingParams(**s) for s in settings])


@settings(max_examples=120, deadline=None)
@given(data=st.data(), heads=st.sampled_from([(1,), (2, 5), (3, 8)]))
def test_heads_keep_what_the_definition_keeps_whatever_the_other_rows(data, heads):
    # Small heads, so that rows end in the first, a wider one or only the whole vocabulary;
    # logits on a grid of 1/4, so that ties (ranked by id) are common. Two vocabulary sizes
    # and three head lists: 12 compiled programs (batched and alone) for every example.
    vocab = data.draw(st.sampled_from([9, 33]))
    rows = 3
    x = np.asarray(data.draw(hnp.arrays(np.int32, (rows, vocab), elements=st.integers(-24, 24))),
                   np.float32) / 4
    settings_ = [dict(temperature=data.draw(st.sampled_from([0.3, 1.0, 2.5])),
                      top_k=data.draw(st.integers(0, vocab + 1)),
                      top_p=data.draw(st.sampled_from([1.0, 0.05, 0.5, 0.8137, 0.97, 0.999])),
                      min_p=data.draw(st.sampled_from([0.0, 0.0, 0.013, 0.31]))) for _ in range(rows)]
    batched = np.asarray(logits_module._probs(jnp.asarray(x), rows_sampling(settings_), heads))
    for row, s in enumerate(settings_):
        kept, margin_p, margin_min = kept_by_definition(x[row], **s)
        alone = np.asarray(logits_module._probs(jnp.asarray(x[row:row + 1]),
                                                rows_sampling([s]), heads))[0]
        # A row's distribution never depends on the rows beside it, bit for bit.
        np.testing.assert_array_equal(alone, batched[row])
        if margin_p > 1e-5 and margin_min > 1e-5:   # float32 cannot decide closer calls
            np.testing.assert_array_equal(batched[row] > 0, kept)


@pytest.fixture(scope="module")
def three_widths():
    """Rows of a 49,152-token vocabulary whose nucleus (T = 1, top_p = 0.9) ends within the best
    256 logits, within the best 4,096, and only past them."""
    rng = np.random.default_rng(0)
    noise = rng.standard_normal((3, 49_152))
    return np.stack([noise[0] * 4, noise[1] * 3, noise[2] * 0.01]).astype(np.float32)


def test_rows_ending_in_each_head_keep_the_nucleus(three_widths):
    sampling = rows_sampling([dict(top_p=0.9)] * 3)
    batched = np.asarray(probs_from_logits(jnp.asarray(three_widths), sampling))
    sizes = []
    for row in range(3):
        x = three_widths[row].astype(np.float64)
        p = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
        order = np.argsort(-x, kind="stable")
        before = np.empty_like(p)
        before[order] = np.cumsum(p[order]) - p[order]    # mass ranked strictly before each token
        kept = batched[row] > 0
        # Float32 sums over tens of thousands of terms decide only to about 1e-4 of mass.
        assert kept[before < 0.9 - 1e-4].all() and not kept[before > 0.9 + 1e-4].any()
        alone = probs_from_logits(jnp.asarray(three_widths[row:row + 1]),
                                  rows_sampling([dict(top_p=0.9)]))
        np.testing.assert_array_equal(np.asarray(alone)[0], batched[row])
        sizes.append(int(kept.sum()))
    heads = logits_module.HEADS
    assert sizes[0] <= heads[0] < sizes[1] <= heads[1] < sizes[2], sizes



@pytest.mark.parametrize("mix", [[0] * 14 + [1, 2], [0] * 13 + [1, 1, 2], [2] + [0] * 15])
def test_rows_looked_up_again_gathered_or_all_keep_their_own_nucleus(three_widths, mix):
    # 16 rows: up to two (an eighth) not sure in the best 256 are looked up again alone, then
    # put back; three are looked up with the whole batch. Each way, every row's distribution
    # is the one it has alone, bit for bit.
    sampling = rows_sampling([dict(top_p=0.9)] * len(mix))
    batched = np.asarray(probs_from_logits(jnp.asarray(three_widths[mix]), sampling))
    alone = np.asarray(probs_from_logits(jnp.asarray(three_widths), rows_sampling(
        [dict(top_p=0.9)] * 3)))
    np.testing.assert_array_equal(batched, alone[mix])


# --- robustness -------------------------------------------------------------------------------


@SETTINGS
@given(logits=logit_rows(), params=sampling_params)
def test_never_nan_and_sums_to_one(logits, params):
    out = np.asarray(probs_from_logits(jnp.asarray(logits), params))
    assert out.dtype == np.float32 and out.shape == logits.shape
    assert np.all(np.isfinite(out)) and np.all(out >= 0)
    assert abs(out.sum() - 1.0) < 1e-5
    # -inf logits are impossible tokens, unless every logit is -inf.
    if np.isfinite(logits).any():
        assert np.all(out[logits == -np.inf] == 0)


@SETTINGS
@given(data=st.data(), params=sampling_params)
def test_all_minus_inf_but_one_is_one_hot(data, params):
    vocab = data.draw(st.integers(1, 8))
    index = data.draw(st.integers(0, vocab - 1))
    logits = np.full(vocab, -np.inf, np.float32)
    logits[index] = data.draw(st.sampled_from([0.0, -1e30, F32_MAX, -F32_MAX, 3.5]))
    np.testing.assert_array_equal(probs(logits, **vars(params)), np.eye(vocab)[index])


def test_huge_logits_with_small_temperature():
    # (F32_MAX - (-F32_MAX)) / 0.01 overflows if computed naively; shifted first, it cannot.
    logits = [F32_MAX, -F32_MAX, F32_MAX, 1e30]
    np.testing.assert_array_equal(probs(logits, temperature=0.01), [0.5, 0.0, 0.5, 0.0])
    np.testing.assert_array_equal(probs(logits, temperature=0.01, top_p=0.5), [1.0, 0, 0, 0])


def test_all_minus_inf_is_treated_as_all_ties():
    logits = np.full(4, -np.inf, np.float32)
    np.testing.assert_array_equal(probs(logits), [0.25] * 4)
    np.testing.assert_array_equal(probs(logits, temperature=0.0), [1.0, 0.0, 0.0, 0.0])


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_any_float_dtype_gives_float32(dtype):
    logits = jnp.asarray(dyadic_logits(), dtype)
    out = probs_from_logits(logits, SamplingParams(temperature=0.7, top_k=3, top_p=0.95))
    assert out.dtype == jnp.float32
    expected = probs_from_logits(logits.astype(jnp.float32), SamplingParams(0.7, 3, 0.95))
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.8),
        SamplingParams(temperature=0.8, top_k=4),
        SamplingParams(temperature=0.8, top_p=0.9),
        SamplingParams(temperature=0.8, top_k=4, top_p=0.9),
    ],
)
def test_jit_and_vmap_with_leading_dims_match_eager(params):
    logits = jax.random.normal(jax.random.key(0), (2, 3, 7)) * 3
    logits = logits.at[0, 1, 2].set(-jnp.inf)
    eager = probs_from_logits(logits, params)
    jitted = jax.jit(probs_from_logits, static_argnums=1)(logits, params)
    vmapped = jax.vmap(jax.vmap(lambda x: probs_from_logits(x, params)))(logits)
    np.testing.assert_allclose(jitted, eager, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(vmapped, eager, rtol=1e-6, atol=1e-7)


# --- parameters -------------------------------------------------------------------------------


def test_params_are_hashable_and_greedy_property():
    assert hash(SamplingParams()) == hash(SamplingParams(1.0, 0, 1.0))
    assert SamplingParams(temperature=0.0).greedy and SamplingParams(temperature=0).greedy
    assert not SamplingParams(temperature=1e-9).greedy


@pytest.mark.parametrize(
    "kwargs, shown",
    [
        (dict(temperature=-0.5), "-0.5"),
        (dict(temperature=math.inf), "inf"),
        (dict(temperature=math.nan), "nan"),
        (dict(temperature="hot"), "hot"),
        (dict(top_k=-1), "-1"),
        (dict(top_k=2.5), "2.5"),
        (dict(top_k=True), "True"),
        (dict(top_p=0.0), "0.0"),
        (dict(top_p=1.5), "1.5"),
        (dict(top_p=-0.1), "-0.1"),
        (dict(top_p=math.nan), "nan"),
    ],
)
def test_invalid_params_raise_value_error_naming_the_value(kwargs, shown):
    with pytest.raises(ValueError, match=next(iter(kwargs))) as info:
        SamplingParams(**kwargs)
    assert shown in str(info.value)


def test_numpy_scalars_are_valid_params():
    SamplingParams(temperature=np.float32(0.5), top_k=np.int64(3), top_p=np.float64(0.9))


# --- sampling ---------------------------------------------------------------------------------


def test_sample_never_draws_zero_probability_ids_and_matches_probs():
    # N = 100_000 draws; chi-square goodness of fit at alpha = 1e-3 on the non-zero ids.
    n = 100_000
    p = np.array([0.0, 0.5, 0.0, 0.3, 0.2, 0.0])
    ids = np.asarray(sample(jax.random.key(0), jnp.broadcast_to(jnp.float32(p), (n, p.size))))
    assert ids.dtype == np.int32 and ids.shape == (n,)
    counts = np.bincount(ids, minlength=p.size)
    assert counts.size == p.size and np.all(counts[p == 0] == 0)
    support = p > 0
    assert scipy.stats.chisquare(counts[support], n * p[support]).pvalue > 1e-3


def test_sample_respects_top_k_mask():
    logits = jax.random.normal(jax.random.key(1), (5000, 9))
    p = probs_from_logits(logits, SamplingParams(top_k=2, top_p=0.9))
    ids = sample(jax.random.key(2), p)
    assert ids.shape == (5000,)
    assert bool(jnp.all(jnp.take_along_axis(p, ids[:, None], axis=-1) > 0))


def test_has_nan():
    logits = jnp.array([[0.0, -jnp.inf, 1e30], [0.0, jnp.nan, 1.0]])
    np.testing.assert_array_equal(has_nan(logits), [False, True])


def test_sample_rows_is_sample_draw_for_draw():
    # One-hot rows take the shortcut (no Gumbel noise); a batch with any other row must draw
    # every row with `sample`. Both give exactly vmap(sample)'s tokens.
    keys = jax.random.split(jax.random.key(3), 64)
    one_hot = jax.nn.one_hot(jnp.arange(64) % 7, 7)
    soft = jax.nn.softmax(jax.random.normal(jax.random.key(4), (64, 7)), axis=-1)
    mixed = one_hot.at[5].set(soft[5])
    # Jitted once each: called eagerly, the cond inside sample_rows was compiled on every call.
    rows, each = jax.jit(sample_rows), jax.jit(jax.vmap(sample))
    for probs in (one_hot, soft, mixed):
        assert (rows(keys, probs) == each(keys, probs)).all()
    # The mixed batch really is drawn: its soft row is not always its argmax.
    draws = [int(rows(jax.random.split(jax.random.key(s), 64), mixed)[5]) for s in range(40)]
    assert len(set(draws)) > 1
