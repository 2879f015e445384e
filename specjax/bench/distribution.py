"""The statistical check of Theorem 1, end to end: tiny random models whose exact law over short
continuations can be enumerated, and the G-test of samples against it.

tests/test_distribution.py runs every method through it (with negative controls that must
fail), and scripts/distribution_power.py measures its power against a subtle bug.
"""

from __future__ import annotations

import functools
import itertools

import jax
import numpy as np

from specjax.model.config import ModelConfig
from specjax.model.transformer import Model, draw_normal, forward, init_params
from specjax.sampling.logits import SamplingParams, probs_from_logits


def llama_config(vocab=8, d=16, layers=1, heads=2, kv_heads=1, positions=128) -> ModelConfig:
    """A tiny Llama: d model width, `layers` layers, MHA/GQA/MQA by `kv_heads`."""
    return ModelConfig(arch="llama", vocab_size=vocab, d_model=d, n_layers=layers,
                       n_heads=heads, n_kv_heads=kv_heads, head_dim=d // heads, d_ff=2 * d,
                       max_positions=positions, norm_eps=1e-6, activation="silu",
                       tie_embeddings=False)


@functools.lru_cache(maxsize=None)
def close_pair(vocab=6, std=1.0, noise=0.5, seed=1) -> tuple[Model, Model]:
    """A tiny target and a draft made from it by adding noise to every weight: they agree often
    but not always, like a real draft, so both branches of verification get exercised."""
    config = llama_config(vocab, layers=2)
    target = Model(config, init_params(config, jax.random.key(seed), std))
    leaves, treedef = jax.tree.flatten_with_path(target.params)
    keys = jax.random.split(jax.random.key(seed + 1000), len(leaves))
    noisy = [a + noise * std * draw_normal(path[-1].key, a.shape, k)
             for (path, a), k in zip(leaves, keys)]
    return target, Model(target.config, jax.tree.unflatten(treedef, noisy))


def exact_law(target: Model, prompt, sampling: SamplingParams, length: int) -> np.ndarray:
    """P(continuation) under the target for all V^length continuations of `prompt`, in
    lexicographic order, float64: each is the product of the target's next-token probabilities
    (`probs_from_logits`, the distribution every sampler is exact for) along it."""
    vocab = target.config.vocab_size
    continuations = np.array(list(itertools.product(range(vocab), repeat=length)), np.int32)
    seqs = np.concatenate([np.tile(np.array(prompt, np.int32), (len(continuations), 1)),
                           continuations], axis=1)                     # [V^length, P + length]
    positions = np.broadcast_to(np.arange(seqs.shape[1]), seqs.shape)
    logits, _ = forward(target.params, target.config, seqs, positions)
    probs = np.asarray(probs_from_logits(logits[:, len(prompt) - 1:-1], sampling), np.float64)
    picked = np.take_along_axis(probs, continuations[..., None], axis=-1)[..., 0]
    law = picked.prod(axis=1)
    assert abs(law.sum() - 1) < 1e-5
    return law


def g_test(samples: np.ndarray, law: np.ndarray, vocab: int) -> float:
    """p-value of a G-test of `samples` [N, L] (token ids < vocab) against `law` [vocab^L],
    cells with expected count < 5 pooled."""
    # scipy is in the test and bench extras, not a dependency of the library.
    from scipy import stats

    length = samples.shape[1]
    index = (samples * vocab ** np.arange(length - 1, -1, -1)).sum(axis=1)
    observed = np.bincount(index, minlength=vocab ** length).astype(np.float64)
    expected = law * len(samples)
    sparse = expected < 5
    if sparse.any():
        observed = np.append(observed[~sparse], observed[sparse].sum())
        expected = np.append(expected[~sparse], expected[sparse].sum())
    expected *= observed.sum() / expected.sum()     # the law sums to 1 within float32 rounding
    nonzero = observed > 0
    with np.errstate(divide="ignore"):          # a sample where the law has 0: g = inf, p = 0
        g = 2 * np.sum(observed[nonzero] * np.log(observed[nonzero] / expected[nonzero]))
    return float(stats.chi2.sf(g, df=len(observed) - 1))
