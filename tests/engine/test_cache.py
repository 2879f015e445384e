"""The KV cache: cached decoding equals full-sequence logits, for ragged batches."""

import jax
import numpy as np
import pytest

import specjax
from specjax.io.checkpoint import random_model
from specjax.model.cache import KVCache
from specjax.model.transformer import forward as eager_forward

forward = jax.jit(eager_forward, static_argnums=1)

CONFIGS = {
    "llama-gqa": specjax.ModelConfig(arch="llama", vocab_size=50, d_model=32, n_layers=2, n_heads=4,
                                     n_kv_heads=2, head_dim=8, d_ff=48, max_positions=64,
                                     norm_eps=1e-6, activation="silu", tie_embeddings=False),
    "gpt2": specjax.ModelConfig(arch="gpt2", vocab_size=50, d_model=32, n_layers=2, n_heads=4,
                                n_kv_heads=4, head_dim=8, d_ff=64, max_positions=64, norm_eps=1e-5,
                                activation="gelu_tanh", tie_embeddings=True, qkv_bias=True,
                                out_bias=True, mlp_bias=True),
}
ATOL = 2e-5
SLOTS = 48


@pytest.fixture(params=CONFIGS)
def model(request):
    return random_model(CONFIGS[request.param], seed=1, std=0.3)


def full_logits(model, row):
    logits, _ = forward(model.params, model.config, np.array([row]), np.arange(len(row))[None])
    return np.asarray(logits[0])


def ragged_rows(vocab, lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [list(rng.integers(0, vocab, size=n)) for n in lengths]


def test_prefill_then_decode_equals_full_sequence(model):
    lengths, extra = [5, 12, 1], 9
    rows = ragged_rows(model.config.vocab_size, [n + extra for n in lengths])
    b, t = len(rows), max(lengths)
    # Right-padded prefill: pad tokens are 0 and their cache slots are overwritten later.
    prompt = np.zeros((b, t), np.int32)
    for i, n in enumerate(lengths):
        prompt[i, :n] = rows[i][:n]
    cache = KVCache.init(model.config, b, SLOTS)
    logits, cache = forward(model.params, model.config, prompt,
                            np.broadcast_to(np.arange(t), (b, t)), cache)
    cache = cache.with_length(np.array(lengths))
    got = [[np.asarray(logits[i, n - 1])] for i, n in enumerate(lengths)]
    for step in range(extra):
        pos = np.array(lengths) + step
        token = np.array([[rows[i][p]] for i, p in enumerate(pos)])
        logits, cache = forward(model.params, model.config, token, pos[:, None], cache)
        for i in range(b):
            got[i].append(np.asarray(logits[i, 0]))
    np.testing.assert_array_equal(np.asarray(cache.length), np.array(lengths) + extra)
    for i, n in enumerate(lengths):
        want = full_logits(model, rows[i])[n - 1:]
        np.testing.assert_allclose(np.stack(got[i]), want, atol=ATOL)


def test_chunked_prefill_equals_full_sequence(model):
    row = ragged_rows(model.config.vocab_size, [23])[0]
    cache = KVCache.init(model.config, 1, SLOTS)
    chunks, start = [], 0
    for size in (7, 1, 10, 5):
        tokens = np.array([row[start:start + size]])
        logits, cache = forward(model.params, model.config, tokens,
                                np.arange(start, start + size)[None], cache)
        chunks.append(np.asarray(logits[0]))
        start += size
    np.testing.assert_allclose(np.concatenate(chunks), full_logits(model, row), atol=ATOL)


def test_rollback_by_length_forgets_rejected_tokens(model):
    # Write 4 "draft" tokens, roll back 3 of them, continue with other tokens: the result must
    # equal a run that never saw the rejected ones.
    v = model.config.vocab_size
    prefix, rejected, kept = [3, 9, 4, 1], [7, 7, 7], [11, 2, 5]
    cache = KVCache.init(model.config, 1, SLOTS)
    _, cache = forward(model.params, model.config, np.array([prefix + [kept[0]] + rejected]),
                       np.arange(8)[None], cache)
    cache = cache.with_length(np.array([5]))
    logits, _ = forward(model.params, model.config, np.array([kept[1:]]), np.array([[5, 6]]), cache)
    want = full_logits(model, prefix + kept)[5:]
    np.testing.assert_allclose(np.asarray(logits[0]), want, atol=ATOL)
    assert v > max(prefix + kept + rejected)


def test_row_does_not_depend_on_other_rows(model):
    rows = ragged_rows(model.config.vocab_size, [6, 6, 6], seed=3)
    alone = full_logits(model, rows[0])
    other = np.array(rows)
    other[1:] = np.array(ragged_rows(model.config.vocab_size, [6, 6], seed=4))
    batched, _ = forward(model.params, model.config, other, np.broadcast_to(np.arange(6), (3, 6)))
    np.testing.assert_allclose(np.asarray(batched[0]), alone, atol=ATOL)


def test_forward_is_jittable_with_static_config(model):
    step = jax.jit(eager_forward, static_argnums=1)
    row = ragged_rows(model.config.vocab_size, [10])[0]
    logits, _ = step(model.params, model.config, np.array([row]), np.arange(10)[None],
                     KVCache.init(model.config, 1, SLOTS))
    np.testing.assert_allclose(np.asarray(logits[0]), full_logits(model, row), atol=ATOL)


# -- Long sequences: the windows over the cache and chunked prefill ------------------------------

LONG = specjax.ModelConfig(arch="llama", vocab_size=50, d_model=32, n_layers=2, n_heads=4,
                           n_kv_heads=2, head_dim=8, d_ff=48, max_positions=4096, norm_eps=1e-6,
                           activation="silu", tie_embeddings=False)


@pytest.fixture(scope="module")
def long_model():
    return random_model(LONG, seed=2, std=0.3)


@pytest.mark.parametrize("slots", [1280, 2048, 4096])
def test_logits_do_not_depend_on_the_buffer_size(long_model, slots):
    # 1,100 cached tokens: a step then reads a 1,536-slot window of a 2,048- or 4,096-slot
    # buffer, and the whole of a 1,280-slot one. Every way must give the full-sequence logits.
    row = ragged_rows(LONG.vocab_size, [1103], seed=5)[0]
    cache = KVCache.init(LONG, 1, slots)
    _, cache = forward(long_model.params, LONG, np.array([row[:1100]]), np.arange(1100)[None], cache)
    logits, _ = forward(long_model.params, LONG, np.array([row[1100:]]),
                        np.arange(1100, 1103)[None], cache)
    np.testing.assert_allclose(np.asarray(logits[0]), full_logits(long_model, row)[1100:],
                               atol=ATOL)


@pytest.mark.parametrize("chunk", [1000, 256, 7])
def test_prefill_does_not_depend_on_how_the_prompt_is_chunked(long_model, chunk):
    # Ragged rows of 1,000 and 10 tokens; chunks of 256 and 7 do not divide the prompt array's
    # 1,000 positions, so the last chunk is moved back over positions already written.
    from specjax.decoding.prefill import prefill

    rows = ragged_rows(LONG.vocab_size, [1000, 10], seed=6)
    prompts = np.zeros((2, 1000), np.int32)
    for i, row in enumerate(rows):
        prompts[i, :len(row)] = row
    lengths = np.array([len(r) for r in rows])
    cache = jax.jit(prefill, static_argnums=(1, 4, 5))(long_model.params, LONG, prompts, lengths,
                                                       1280, chunk).cache
    np.testing.assert_array_equal(np.asarray(cache.length), lengths - 1)
    last = np.array([[r[-1]] for r in rows])
    logits, _ = forward(long_model.params, LONG, last, (lengths - 1)[:, None], cache)
    for i, row in enumerate(rows):
        np.testing.assert_allclose(np.asarray(logits[i, 0]), full_logits(long_model, row)[-1],
                                   atol=ATOL)
