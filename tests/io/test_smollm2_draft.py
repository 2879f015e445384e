"""weights/smollm2-draft, the draft trained for SmolLM2-135M-Instruct: transformers reads it and
agrees with specjax, and it shares the target's tokenizer, special tokens and chat template.

The first tests need only the checkpoint; the comparison with the target itself needs the
fetched target (`python -m specjax fetch smollm2`, as tests/methods/test_smollm2.py).
"""

import json
from pathlib import Path

import numpy as np
import pytest

import specjax
from specjax.model.transformer import forward

# SmolLM2's own programs: compiled with XLA's default fusion emitters (tests/conftest.py).
pytestmark = pytest.mark.deep_model

DRAFT = Path(__file__).resolve().parents[2] / "weights" / "smollm2-draft"
TOL = 1e-4  # max |diff| relative to the logit scale, as in test_parity and test_weights
PROMPTS = [
    "def binary_search(items, target):\n    lo, hi = 0, len(items) - 1\n    while lo <= hi:\n",
    "<|im_start|>user\nHow do bees make honey?<|im_end|>\n<|im_start|>assistant\nBees make",
]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json")


@pytest.fixture(scope="module")
def draft():
    # The draft ships in weights/: a missing file is a failure, not a skip.
    return specjax.load(DRAFT)


def test_transformers_logits_match_specjax(draft):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    hf = transformers.AutoModelForCausalLM.from_pretrained(DRAFT, dtype=torch.float32).eval()
    for prompt in PROMPTS:
        tokens = np.asarray([draft.tokenizer.encode(prompt).ids])              # [1, T]
        ours, _ = forward(draft.params, draft.config, tokens, np.arange(tokens.shape[1])[None])
        with torch.no_grad():
            theirs = hf(torch.tensor(tokens)).logits.float().numpy()           # [1, T, V]
        scale = np.abs(theirs).max()
        diff = np.abs(np.asarray(ours) - theirs).max()
        assert diff <= TOL * scale, f"max |diff| {diff:.3g} > {TOL} x logit scale {scale:.3g}"


def test_config_and_special_tokens(draft):
    config = draft.config
    assert (config.arch, config.vocab_size, config.tie_embeddings) == ("llama", 49152, True)
    assert (config.bos_token_id, config.eos_token_ids) == (1, (2,))
    tokenizer = draft.tokenizer
    assert tokenizer.get_vocab_size(with_added_tokens=True) == 49152
    assert [tokenizer.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [0, 1, 2]
    assert "<|im_start|>" in draft.chat_template


def test_draft_costs_at_most_a_tenth_of_the_target():
    record = json.loads((DRAFT / "train_log.json").read_text())
    assert record["cost_ratio_flops"] <= 0.1
    assert record["parameters"] <= record["target_parameters"] / 10
    for row in record["evaluation"]["table"]:
        assert 0.0 < row["acceptance_rate"] <= 1.0
    assert all(record["evaluation"]["greedy_equals_autoregressive"].values())


def test_tokenizer_files_are_the_targets():
    from specjax.io.fetch import fetch

    target = fetch("smollm2")
    for name in TOKENIZER_FILES:
        assert (DRAFT / name).read_bytes() == (target / name).read_bytes(), name
    draft_config = json.loads((DRAFT / "config.json").read_text())
    target_config = json.loads((target / "config.json").read_text())
    for key in ("vocab_size", "bos_token_id", "eos_token_id", "tie_word_embeddings", "model_type"):
        assert draft_config[key] == target_config[key], key
    # What generate checks before speculative decoding: the same token ids.
    specjax.generate(specjax.load(target), [[1, 2, 3]],
                     method=specjax.Speculative(draft=specjax.load(DRAFT), k=2),
                     sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=3)
