"""Tiny random models shared by the decoding and distribution tests."""

from __future__ import annotations

import functools

import specjax


def llama_config(vocab=8, d=16, layers=1, heads=2, kv_heads=1, positions=128) -> specjax.ModelConfig:
    return specjax.ModelConfig(arch="llama", vocab_size=vocab, d_model=d, n_layers=layers,
                               n_heads=heads, n_kv_heads=kv_heads, head_dim=d // heads,
                               d_ff=2 * d, max_positions=positions, norm_eps=1e-6,
                               activation="silu", tie_embeddings=False)


@functools.lru_cache(maxsize=None)
def pair(vocab=8, std=1.0, target_seed=1, draft_seed=2):
    """A target and a different, smaller-headed draft over the same vocabulary.

    A large init std makes the next-token distributions peaked and the two models disagree,
    which is what the distribution tests need to see bugs.
    """
    target = specjax.random_model(llama_config(vocab, layers=2), seed=target_seed, std=std)
    draft = specjax.random_model(llama_config(vocab, layers=1), seed=draft_seed, std=std)
    return target, draft


@functools.lru_cache(maxsize=None)
def close_pair(vocab=6, std=1.0, noise=0.5, seed=1):
    """A target and a draft made from it by adding noise to every weight: they agree often but
    not always, like a real draft, so both branches of verification get exercised."""
    import jax

    from specjax.model.transformer import draw_normal

    target = specjax.random_model(llama_config(vocab, layers=2), seed=seed, std=std)
    leaves, treedef = jax.tree.flatten_with_path(target.params)
    keys = jax.random.split(jax.random.key(seed + 1000), len(leaves))
    noisy = [a + noise * std * draw_normal(path[-1].key, a.shape, k)
             for (path, a), k in zip(leaves, keys)]
    return target, specjax.Model(target.config, jax.tree.unflatten(treedef, noisy))
