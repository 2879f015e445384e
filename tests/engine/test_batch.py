"""A batch of 32 ragged prompts: every row gives exactly its single-row output.

Batching changes how the work is laid out (a prefill that sorts the 32 rows by length and reads
them in groups, rows that finish early idling in the loop
while others go on, verify calls padded to the longest row's draft, Medusa's hidden states
gathered per group) but must never change a row's tokens: greedy, and with
seeded sampling (seed=[...]: row b uses key(seed[b]) wherever it sits).
"""

from __future__ import annotations

import numpy as np
import pytest

import specjax
from specjax.api.generate import generate
from specjax.decoding.prefill import prefill_groups
from specjax.heads.medusa import HeadsConfig, init_heads
from tests.support.tiny import pair

BATCH, NEW, EOS = 32, 12, 5


@pytest.fixture(scope="module")
def models():
    return pair(vocab=8, std=0.5)


@pytest.fixture(scope="module")
def prompts():
    # 2 to 16 tokens (two prompt buckets), with repeats for the n-gram lookup to find.
    rng = np.random.default_rng(5)
    rows = []
    for i in range(BATCH):
        motif = rng.integers(0, 7, 3).tolist()
        rows.append((motif * 6)[:2 + i % 15])
    return rows


def medusa_heads(target):
    config = HeadsConfig(num_heads=2, num_blocks=1, hidden_size=target.config.d_model,
                                 vocab_size=8, subset_size=4)
    return init_heads(config, target, token_ids=[0, 2, 5, 6], seed=4, std=0.5,
                              tree=specjax.Tree.full((2, 2)))


# Medusa greedy only: its grouped prefill (the hidden states it gathers) is the same code at
# any temperature, and a sampled Medusa case would cost 17 s of the suite.
@pytest.mark.parametrize("method, temperature", [
    (method, t) for method in ("autoregressive", "speculative", "ngram") for t in (0.0, 1.0)]
    + [("medusa", 0.0)])
def test_each_row_of_a_ragged_batch_of_32_is_its_single_row_output(models, prompts, method,
                                                                    temperature):
    target, draft = models
    seeds = list(range(100, 100 + BATCH))
    heads = medusa_heads(target) if method == "medusa" else None
    method = specjax.api.methods.build_shared(method, k=3, draft=draft, heads=heads)
    kwargs = dict(method=method, sampling=specjax.SamplingParams(temperature=temperature),
                  max_new_tokens=NEW, eos_ids=(EOS,))
    batched = generate(target, prompts, seed=seeds, **kwargs)
    # The batch is really ragged at both ends: rows stop at EOS at different steps and idle.
    assert len({len(t) for t in batched.tokens}) > 1
    assert batched.stats.idle_fraction > 0
    # Its prefill reads the rows sorted by length, in groups.
    assert prefill_groups(BATCH) > 1 and prefill_groups(1) == 1
    for i, prompt in enumerate(prompts):
        alone = generate(target, [prompt], seed=[seeds[i]], **kwargs).tokens[0]
        assert batched.tokens[i] == alone, f"row {i} ({len(prompt)} prompt tokens)"
