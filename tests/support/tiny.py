"""Tiny random models shared by the decoding and distribution tests."""

from __future__ import annotations

import functools

from specjax.io.checkpoint import random_model
from specjax.testing.law import close_pair, llama_config

__all__ = ["close_pair", "llama_config", "pair"]


@functools.lru_cache(maxsize=None)
def pair(vocab=8, std=1.0, target_seed=1, draft_seed=2):
    """A target and a different, smaller-headed draft over the same vocabulary.

    A large init std makes the next-token distributions peaked and the two models disagree,
    which is what the distribution tests need to see bugs.
    """
    target = random_model(llama_config(vocab, layers=2), seed=target_seed, std=std)
    draft = random_model(llama_config(vocab, layers=1), seed=draft_seed, std=std)
    return target, draft
