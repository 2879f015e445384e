"""A batch of 32 ragged prompts: every row gives exactly its single-row output.

Batching changes how the work is laid out (prefill chunks of 8 positions for 32 rows against one
chunk for a row alone, rows that finish early idling in the loop while others go on, verify
calls padded to the longest row's draft) but must never change a row's tokens: greedy, and with
seeded sampling (seed=[...]: row b uses key(seed[b]) wherever it sits).
"""

from __future__ import annotations

import numpy as np
import pytest

from specjax.decoding.autoregressive import prefill_chunk
from specjax.generate import generate
from tests.tiny import pair

BATCH, NEW, EOS = 32, 12, 5


@pytest.fixture(scope="module")
def models():
    return pair(vocab=8, std=0.5)


@pytest.fixture(scope="module")
def prompts():
    # 2 to 16 tokens (two prompt buckets, so a lone row's prefill is one chunk of 8 or 16
    # positions where the batch's is two of 8), with repeats for the n-gram lookup to find.
    rng = np.random.default_rng(5)
    rows = []
    for i in range(BATCH):
        motif = rng.integers(0, 7, 3).tolist()
        rows.append((motif * 6)[:2 + i % 15])
    return rows


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("method", ["autoregressive", "speculative", "ngram"])
def test_each_row_of_a_ragged_batch_of_32_is_its_single_row_output(models, prompts, method,
                                                                    temperature):
    target, draft = models
    seeds = list(range(100, 100 + BATCH))
    kwargs = dict(method=method, draft=draft, k=3, max_new_tokens=NEW, temperature=temperature,
                  eos_ids=(EOS,))
    batched = generate(target, prompts, seed=seeds, **kwargs)
    # The batch is really ragged at both ends: rows stop at EOS at different steps and idle.
    assert len({len(t) for t in batched.tokens}) > 1
    assert batched.stats.idle_fraction > 0
    assert prefill_chunk(BATCH) < 16 <= max(map(len, prompts))
    for i, prompt in enumerate(prompts):
        alone = generate(target, [prompt], seed=[seeds[i]], **kwargs).tokens[0]
        assert batched.tokens[i] == alone, f"row {i} ({len(prompt)} prompt tokens)"
