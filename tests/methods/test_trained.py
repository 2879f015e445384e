"""The shipped trained pairs (weights/): every method gives the target's greedy output on real
code prompts, and the distilled drafts save target calls.

The thresholds on tokens per target call are about 10% below what the shipped pairs measure on
these prompts (llama 2.18 and 3.13, gpt2 2.48 and 3.51 at K = 2 and 5), so that a rounding
difference in another JAX version cannot flip them; the llama draft trained on the data alone,
before distillation, made 2.12 and 2.62."""

from pathlib import Path

import pytest

import specjax
from specjax.api.generate import generate

WEIGHTS = Path(__file__).resolve().parents[2] / "weights"
PROMPTS = [
    "import os\nimport sys\n\n\ndef main(argv=None):\n    ",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "    for key, value in sorted(mapping.items()):\n        if",
]


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def trained_pair(request):
    target_dir, draft_dir = WEIGHTS / f"{request.param}-target", WEIGHTS / f"{request.param}-draft"
    assert target_dir.exists() and draft_dir.exists(), "the trained checkpoints are missing"
    return specjax.load(target_dir), specjax.load(draft_dir)


@pytest.mark.slow
def test_all_methods_give_the_greedy_output_on_code(trained_pair):
    target, draft = trained_pair
    greedy = generate(target, PROMPTS, sampling=specjax.SamplingParams(temperature=0.0),
                      max_new_tokens=48, eos_ids=()).tokens
    for k, min_tokens_per_call in ((2, 2.0), (5, 2.8)):
        spec = generate(target, PROMPTS, method=specjax.Speculative(draft=draft, k=k),
                        sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=48,
                        eos_ids=())
        assert spec.tokens == greedy
        assert spec.stats.tokens_per_target_call >= min_tokens_per_call, spec.stats
        ngram = generate(target, PROMPTS, method=specjax.NGram(k=k),
                         sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=48,
                         eos_ids=())
        assert ngram.tokens == greedy
    tree = specjax.Tree.full((3, 2, 1))
    for method in ("speculative", "ngram"):
        result = generate(target, PROMPTS,
                          method=specjax.api.methods.build_shared(method, draft=draft, tree=tree),
                          sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=48,
                          eos_ids=())
        assert result.tokens == greedy, method
