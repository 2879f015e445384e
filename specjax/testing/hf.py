"""A real client: Hugging Face transformers' own assisted generation (a draft model) and prompt
lookup, run on a pair converted to torch, as samplers `check` can judge.

    report = testing.check(transformers_sampler("assisted"), samples=6_000)

The pair is written with `specjax.save` (a Hugging Face checkpoint directory) and loaded with
`AutoModelForCausalLM`, so transformers runs the same weights specjax's law is computed from.
Its assisted generation takes one prompt per call, so samples are drawn one `generate` call at
a time from one seeded torch generator: slow (a few milliseconds a call), which is what limits
the sample size of this check. torch and transformers are the `test` and `bench` extras.
"""

from __future__ import annotations

import functools
import tempfile

import numpy as np

from specjax.io.checkpoint import save
from specjax.sampling.logits import SamplingParams
from specjax.testing.law import Pair

__all__ = ["METHODS", "transformers_sampler"]

METHODS = ("assisted", "prompt-lookup")


@functools.lru_cache(maxsize=4)
def _torch_pair(pair: Pair):
    """The pair's target and draft as transformers models (float32, eval mode)."""
    # Optional dependencies: only this client needs them.
    from transformers import AutoModelForCausalLM

    models = []
    for model in (pair.target, pair.draft):
        with tempfile.TemporaryDirectory() as directory:
            save(model, directory)
            models.append(AutoModelForCausalLM.from_pretrained(directory).float().eval())
    return tuple(models)


def transformers_sampler(method: str = "assisted", k: int = 2, name: str | None = None):
    """A sampler running `model.generate(..., do_sample=True)` with `method`:
    "assisted" drafts `k` tokens a call with the pair's draft (`assistant_model`, a constant
    schedule); "prompt-lookup" drafts up to `k` tokens by matching the last 1-2 tokens in the
    context (`prompt_lookup_num_tokens`)."""
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
            draft.generation_config.num_assistant_tokens = k
            draft.generation_config.num_assistant_tokens_schedule = "constant"
            options["assistant_model"] = draft
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
