"""transformers' TLI (drafting across tokenizers while sampling) is not lossless: a minimal
reproduction, and the one-line cause (docs/conformance.md, "Drafting across tokenizers").

    python bench/conformance/tli_reproduction.py

Runs `transformers generate(do_sample=True, assistant_model=..., tokenizer=...,
assistant_tokenizer=...)` on the kit's pair with a draft of its own tokenizer
(`specjax.testing.hf.retokenized`), 2,000 samples of 3 tokens at T = 1, twice: as transformers
ships it, and with `AssistantToTargetTranslator.get_target_logits` filing each pruned score
under the target id that `get_target_ids` gives the same pruned index. It prints the two
verdicts and the orders the two methods use.

The cause. With the draft's head pruned to the shared tokens (`assistant_prune_lm_head=True`,
what `generate` passes), the pruned row j is assistant id `assistant_overlap_token_ids[j]`, in
the order of the assistant tokenizer's `get_vocab()` (a hash map's order for a fast tokenizer).
`get_target_ids` maps a drafted row j to the target through that order; `get_target_logits`
writes row j's score at the j-th supported target id in assistant-id order. Where the two
orders differ, the verifier reads each drafted token's probability from another token's score,
so its acceptance ratio and residual use a permuted draft distribution (the catalogue's
`permuted-draft-probabilities`).
"""

from __future__ import annotations

import torch
from transformers.generation import candidate_generator as cg

from specjax import testing
from specjax.sampling.params import SamplingParams
from specjax.testing import hf

SAMPLES = 2_000


def consistent_target_logits(self, assistant_logits):
    """`get_target_logits` with pruned row j filed under the target id of assistant id
    `assistant_overlap_token_ids[j]`, the map `get_target_ids` uses for the drafted tokens."""
    shape = (*assistant_logits.shape[:-1], self.target_vocab_size)
    out = torch.full(shape, self.FILTER_VALUE, device=assistant_logits.device)
    out[..., self._assistant_to_target_input_ids[self.assistant_overlap_token_ids]] = \
        assistant_logits
    return out


def main() -> None:
    pair = hf.retokenized(testing.pair("close"))
    translator = cg.AssistantToTargetTranslator(
        hf._tokenizer(hf.TARGET_TOKENS), hf._tokenizer(hf.DRAFT_TOKENS), 6,
        assistant_model=hf._torch_model(pair.draft), assistant_prune_lm_head=True)
    ids = translator._assistant_to_target_input_ids
    print("pruned row -> target id, as get_target_ids maps tokens:",
          ids[translator.assistant_overlap_token_ids].tolist())
    print("pruned row -> target id, as get_target_logits files scores:",
          ids[ids != translator.SUPPRESS_TOKEN_ID].tolist())
    for label in ("as shipped", "scores filed by the tokens' map"):
        if label != "as shipped":
            cg.AssistantToTargetTranslator.get_target_logits = consistent_target_logits
        report = testing.check(hf.transformers_sampler("assisted-tokenizers", k=2), pair=pair,
                               samples=SAMPLES, sampling=SamplingParams(1.0),
                               name=f"transformers TLI, {label}")
        print(report)


if __name__ == "__main__":
    main()
