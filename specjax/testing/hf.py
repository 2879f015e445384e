"""A real client: Hugging Face transformers' own assisted generation (a draft model) and prompt
lookup, run on a pair converted to torch, as samplers `check` can judge.

    report = testing.check(transformers_sampler("assisted"), samples=6_000)

The pair is written with `specjax.io.checkpoint.save` (a Hugging Face checkpoint directory)
and loaded with `AutoModelForCausalLM`, so transformers runs the same weights specjax's law is
computed from.
Its assisted generation takes one prompt per call, so samples are drawn one `generate` call at
a time from one seeded torch generator: slow (a few milliseconds a call), which is what limits
the sample size of this check. torch and transformers are the `test` and `bench` extras.
"""

from __future__ import annotations

import functools
import tempfile

import jax.numpy as jnp
import numpy as np
from tokenizers import Tokenizer, decoders, models

from specjax.io.checkpoint import save
from specjax.sampling.logits import SamplingParams
from specjax.testing.law import Pair

__all__ = ["DRAFT_TOKENS", "METHODS", "TARGET_TOKENS", "retokenized", "transformers_sampler"]

METHODS = ("assisted", "prompt-lookup", "assisted-tokenizers")

# The pair with two tokenizers (`retokenized`): the target's tokens are the letters a-f (ids
# 0-5); the draft's are the same letters in another order, the merge "ab" (a draft token the
# target spells as two) and "g" (a draft token with no target token at all).
TARGET_TOKENS = ("a", "b", "c", "d", "e", "f")
DRAFT_TOKENS = ("c", "a", "f", "b", "e", "d", "ab", "g")
# Its prompt holds "ab", so that the draft reads it as one token where the target reads two.
RETOKENIZED_PROMPT = (0, 1, 4, 2, 0, 1)


def _torch_model(model):
    """A specjax model as a transformers model (float32, eval mode)."""
    # Optional dependencies: only this client needs them.
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as directory:
        save(model, directory)
        return AutoModelForCausalLM.from_pretrained(directory).float().eval()


def _assistant(draft, k: int):
    """`draft` set to propose `k` tokens a call (a constant schedule)."""
    draft.generation_config.num_assistant_tokens = k
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    return draft


@functools.lru_cache(maxsize=4)
def _torch_pair(pair: Pair):
    """The pair's target and draft as transformers models."""
    return _torch_model(pair.target), _torch_model(pair.draft)


@functools.lru_cache(maxsize=2)
def retokenized(pair: Pair) -> Pair:
    """`pair` with a draft of its own tokenizer (`DRAFT_TOKENS`: the target's letters permuted,
    plus "ab" and "g"), for transformers' drafting across tokenizers: each letter's embedding
    and output rows are the pair's draft's for that letter; "ab" reads as "b" after "a" does
    (its embedding row is "b"'s) and scores as "a" (its output row is "a"'s); "g" has rows of
    its own. The target, and so the law, are the pair's; the prompt holds "ab"."""
    draft = pair.draft
    rows = [TARGET_TOKENS.index(t) for t in DRAFT_TOKENS[:6]]
    g = jnp.linspace(-0.5, 0.5, draft.config.d_model, dtype=jnp.float32)
    embed = jnp.concatenate([draft.params["embed"][jnp.array(rows + [1])], g[None]])
    head = jnp.concatenate([draft.params["lm_head"][jnp.array(rows + [0])], g[None]])
    params = dict(draft.params, embed=embed, lm_head=head)
    config = draft.config.replace(vocab_size=len(DRAFT_TOKENS))
    return Pair(f"{pair.name}-retokenized", pair.target, type(draft)(config, params),
                RETOKENIZED_PROMPT, f"{pair.about}; the draft with its own tokenizer")


def _tokenizer(tokens):
    """A transformers tokenizer over `tokens`: BPE with the merge "ab" where "ab" is a token,
    no pre-tokenizer, decoded by joining the tokens."""
    # Optional dependency: only this client needs it.
    from transformers import PreTrainedTokenizerFast

    merges = [("a", "b")] if "ab" in tokens else []
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def transformers_sampler(method: str = "assisted", k: int = 2, name: str | None = None):
    """A sampler running `model.generate(..., do_sample=True)` with `method`:
    "assisted" drafts `k` tokens a call with the pair's draft (`assistant_model`, a constant
    schedule); "prompt-lookup" drafts up to `k` tokens by matching the last 1-2 tokens in the
    context (`prompt_lookup_num_tokens`); "assisted-tokenizers" drafts `k` tokens a call with
    a draft of its own tokenizer (`tokenizer=` and `assistant_tokenizer=`: check it on
    `retokenized(pair)`), which transformers runs, when it samples, as TLI (token-level
    intersection, `UniversalSpeculativeDecodingGenerator`)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")

    def sampler(pair, prompt, seed, *, samples, length, sampling: SamplingParams):
        # Optional dependency: only this client needs it.
        import torch

        target, draft = _torch_pair(pair)
        options = dict(do_sample=True, temperature=sampling.temperature,
                       top_k=sampling.top_k, top_p=sampling.top_p,
                       min_p=sampling.min_p or None, max_new_tokens=length,
                       min_new_tokens=length, eos_token_id=None, pad_token_id=0)
        if method == "assisted":
            options["assistant_model"] = _assistant(draft, k)
        elif method == "assisted-tokenizers":
            # TLI prunes its draft's output rows in place, once per pair of tokenizer objects
            # (it caches the mapping by them): a new draft and new tokenizers every call.
            options.update(assistant_model=_assistant(_torch_model(pair.draft), k),
                           tokenizer=_tokenizer(TARGET_TOKENS),
                           assistant_tokenizer=_tokenizer(DRAFT_TOKENS))
        else:
            options.update(prompt_lookup_num_tokens=k, max_matching_ngram_size=2)
        ids = torch.tensor(np.asarray(prompt, np.int64)[None])
        out = np.empty((samples, length), np.int32)
        torch.manual_seed(seed)
        # One thread: the models are tiny, and a second thread only waits for the first (with
        # another process on the other core, 140 ms a call instead of 10).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.no_grad():
                for i in range(samples):
                    out[i] = target.generate(ids, attention_mask=torch.ones_like(ids),
                                             **options)[0, ids.shape[1]:].numpy()
        finally:
            torch.set_num_threads(threads)
        return out

    sampler.__name__ = name or f"transformers {method}"
    return sampler


def greedy(pair: Pair, prompts, tokens: int, method: str | None = None, k: int = 2):
    """transformers' greedy decoding (`do_sample=False`) of each prompt by the pair's target:
    plain (`method` None), with its draft ("assisted", `k` tokens a call), or with a draft of
    its own tokenizer ("assisted-tokenizers", `retokenized(pair)`'s: transformers runs UAD,
    `AssistedCandidateGeneratorDifferentTokenizers`, when it does not sample)."""
    # Optional dependency: only this client needs it.
    import torch

    target = _torch_pair(pair)[0]
    options = dict(do_sample=False, max_new_tokens=tokens, min_new_tokens=tokens,
                   eos_token_id=None, pad_token_id=0)
    if method is not None:
        # A new draft a call, as in `transformers_sampler`.
        options["assistant_model"] = _assistant(_torch_model(pair.draft), k)
    if method == "assisted-tokenizers":
        options.update(tokenizer=_tokenizer(TARGET_TOKENS),
                       assistant_tokenizer=_tokenizer(DRAFT_TOKENS))
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor(np.asarray(prompt, np.int64)[None])
            out.append(target.generate(ids, attention_mask=torch.ones_like(ids), **options)
                       [0, ids.shape[1]:].tolist())
    return out
