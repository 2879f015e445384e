"""Decoding loops: greedy equality across methods, batching, determinism, stopping, stats."""

import dataclasses

import jax
import numpy as np
import pytest

import specjax
from specjax.api.generate import GenerationError, generate, stream
from specjax.heads.eagle import init_drafter
from specjax.heads.medusa import HeadsConfig, init_heads
from specjax.io.checkpoint import random_model
from specjax.mesh import make_mesh
from tests.support.tiny import pair

PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3, 4], [7, 6], [5], [3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 2]]
N = 24


@pytest.fixture(scope="module")
def models():
    return pair(vocab=8, std=0.5)


@pytest.fixture(scope="module")
def greedy(models):
    target, _ = models
    return generate(target, PROMPTS, sampling=specjax.SamplingParams(temperature=0.0),
                    max_new_tokens=N, eos_ids=()).tokens


def reference_greedy(model, prompt, n):
    """Greedy decoding by full-sequence forward passes: no cache, no sampler code.

    The sequence is zero-padded to a fixed length (one compile); causal attention makes the
    logits at the last real position independent of the padding after it.
    """
    forward = jax.jit(specjax.forward, static_argnums=1)
    total = len(prompt) + n
    tokens = list(prompt)
    for _ in range(n):
        padded = np.array([tokens + [0] * (total - len(tokens))])
        logits, _ = forward(model.params, model.config, padded, np.arange(total)[None])
        tokens.append(int(np.argmax(logits[0, len(tokens) - 1])))
    return tokens[len(prompt):]


@pytest.mark.fast
def test_autoregressive_greedy_equals_full_sequence_argmax(models, greedy):
    target, _ = models
    for prompt, got in zip(PROMPTS[:2], greedy[:2]):
        assert got == reference_greedy(target, prompt, N)


@pytest.mark.fast(cases=["2", "5"])
@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_speculative_greedy_equals_autoregressive(models, greedy, k):
    target, draft = models
    result = generate(target, PROMPTS, method=specjax.Speculative(draft=draft, k=k),
                      sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=N,
                      eos_ids=())
    assert result.tokens == greedy
    assert result.stats.draft_calls == k * result.stats.target_calls


@pytest.mark.fast(cases=["3"])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_ngram_greedy_equals_autoregressive(models, greedy, k):
    target, _ = models
    result = generate(target, PROMPTS, method=specjax.NGram(k=k),
                      sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=N,
                      eos_ids=())
    assert result.tokens == greedy
    assert result.stats.accepted > 0  # the repetitive prompts make lookups hit


@pytest.mark.fast
def test_unbatched_equals_batched_greedy(models, greedy):
    target, draft = models
    for i in (0, 2):
        alone = generate(target, [PROMPTS[i]], method=specjax.Speculative(draft=draft, k=3),
                         sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=N,
                         eos_ids=())
        assert alone.tokens[0] == greedy[i]


def test_draft_equal_to_target_accepts_everything(models):
    target, _ = models
    k, rounds = 3, 6
    result = generate(target, PROMPTS, method=specjax.Speculative(draft=target, k=k),
                      sampling=specjax.SamplingParams(temperature=0.0),
                      max_new_tokens=rounds * (k + 1), eos_ids=())
    stats = result.stats
    assert stats.accepted == stats.drafted
    assert stats.target_calls == rounds * len(PROMPTS)
    assert stats.tokens_per_target_call == k + 1


@pytest.mark.fast
@pytest.mark.parametrize("method", ["autoregressive", "speculative", "ngram"])
def test_same_seed_same_output_and_row_alone_equals_row_in_batch(models, method):
    target, draft = models
    kwargs = dict(method=specjax.api.methods.build_shared(method, draft=draft, k=3),
                  sampling=specjax.SamplingParams(temperature=1.0), max_new_tokens=N, eos_ids=())
    seeds = [11, 12, 13, 14]
    first = generate(target, PROMPTS, seed=seeds, **kwargs).tokens
    assert generate(target, PROMPTS, seed=seeds, **kwargs).tokens == first
    alone = generate(target, [PROMPTS[1]], seed=[12], **kwargs).tokens
    assert alone[0] == first[1]
    other = generate(target, PROMPTS, seed=[21, 22, 23, 24], **kwargs).tokens
    assert other != first


@pytest.mark.parametrize("method", ["autoregressive", "speculative", "ngram"])
def test_eos_and_max_new_tokens_are_exact(models, greedy, method):
    target, draft = models
    # Stop at a token the greedy continuation of row 0 produces at index j: output ends there.
    j = 5
    eos = greedy[0][j]
    first = greedy[0].index(eos)
    result = generate(target, PROMPTS,
                      method=specjax.api.methods.build_shared(method, draft=draft, k=4),
                      sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=N,
                      eos_ids=(eos,))
    assert result.tokens[0] == greedy[0][:first + 1]
    for got, want in zip(result.tokens, greedy):
        cut = want.index(eos) + 1 if eos in want else N
        assert got == want[:cut]
    for n in (1, 2, 7):  # never overshoots by up to K tokens
        short = generate(target, PROMPTS,
                         method=specjax.api.methods.build_shared(method, draft=draft, k=4),
                         sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=n,
                         eos_ids=())
        assert short.tokens == [g[:n] for g in greedy]


@pytest.mark.parametrize("method", ["speculative", "ngram"])
def test_stream_equals_jitted_loop(models, method):
    target, draft = models
    kwargs = dict(method=specjax.api.methods.build_shared(method, draft=draft, k=3),
                  sampling=specjax.SamplingParams(temperature=1.0), max_new_tokens=N, seed=3,
                  eos_ids=())
    chunks = [[] for _ in PROMPTS]
    result = None
    for new, result in stream(target, PROMPTS, **kwargs):
        for row, tokens in zip(chunks, new):
            row.extend(tokens)
    assert chunks == result.tokens == generate(target, PROMPTS, **kwargs).tokens


def test_vocab_padding_draft_is_handled(models, greedy):
    # A draft whose vocabulary is larger (padding rows) than the target's: same token ids.
    from tokenizers import Tokenizer
    from tokenizers import models as tokenizer_models

    tokenizer = Tokenizer(tokenizer_models.WordLevel({c: i for i, c in enumerate("abcdefgh")},
                                                      unk_token="a"))
    target = specjax.Model(models[0].config, models[0].params, tokenizer)
    big = random_model(target.config.replace(vocab_size=12, n_layers=1), seed=5, std=0.5,
                               tokenizer=tokenizer)
    result = generate(target, PROMPTS, method=specjax.Speculative(draft=big, k=2),
                      sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=N,
                      eos_ids=())
    assert result.tokens == greedy


@pytest.mark.fast
@pytest.mark.parametrize("call, needle", [
    (lambda t, d: generate(t, PROMPTS, specjax.Speculative(d, k=0)),
     "k must be an integer >= 1, got 0"),
    (lambda t, d: generate(t, PROMPTS, specjax.NGram(k=-2)), "got -2"),
    (lambda t, d: generate(t, PROMPTS, sampling=specjax.SamplingParams(temperature=-0.5)),
     "-0.5"),
    (lambda t, d: generate(t, PROMPTS, sampling=specjax.SamplingParams(top_p=0.0)), "top_p"),
    (lambda t, d: generate(t, PROMPTS, sampling=specjax.SamplingParams(top_p=1.5)), "1.5"),
    (lambda t, d: generate(t, PROMPTS, sampling=specjax.SamplingParams(top_k=-1)), "top_k"),
    (lambda t, d: generate(t, PROMPTS, max_new_tokens=0), "max_new_tokens"),
    (lambda t, d: generate(t, PROMPTS, "beam"), "'beam'"),
    (lambda t, d: generate(t, PROMPTS, max_new_tokens=1000), "context window"),
    (lambda t, d: generate(t, PROMPTS, specjax.Speculative(None)), "draft"),
    (lambda t, d: generate(t, PROMPTS, "speculative"), "needs a draft model"),
    (lambda t, d: generate(t, PROMPTS, temperature=0.0), "a field of SamplingParams"),
    (lambda t, d: generate(t, PROMPTS, draft=d), "belongs to the method object"),
])
def test_invalid_parameters_raise_with_the_value(models, call, needle):
    # Each option is checked where it enters: the object when made, the request in generate.
    target, draft = models
    with pytest.raises(GenerationError, match=None) as info:
        call(target, draft)
    assert needle in str(info.value)


def test_each_method_object_checks_its_options_when_made(models):
    # Made, not bound: no target, sampling or generate call is in reach of these checks, and
    # each message names the field. What needs the target waits for `bind` (the negative
    # control: a tree too big for the context window makes, and fails in generate).
    from specjax.heads.dflash import init_block_drafter

    target, draft = models
    heads = init_heads(HeadsConfig(num_heads=2, num_blocks=1,
                                                   hidden_size=target.config.d_model,
                                                   vocab_size=8, subset_size=4), target, seed=3)
    drafter = init_drafter(target, subset_size=4, token_ids=np.arange(4), seed=3)
    block = init_block_drafter(target, block_size=3, seed=3)
    dynamic = specjax.DynamicTree(depth=2, top_k=2, total_tokens=3)
    cases = [
        (lambda: specjax.Speculative(target.params), "draft must be a draft model"),
        (lambda: specjax.Speculative(draft, tree=((0,), (0, 0, 0))), "has no parent"),
        (lambda: specjax.Speculative(draft, candidates="iid"), "pass tree=... too"),
        (lambda: specjax.Speculative(draft, tree=((0,),), candidates="beam"), "'beam'"),
        (lambda: specjax.Speculative(draft, tree=dynamic), "it needs method 'eagle'"),
        (lambda: specjax.Speculative(draft, k=2, k_schedule="heuristic", k_start=3),
         "k_start=3 is more than k=2"),
        (lambda: specjax.Speculative(draft, drafter_dtype="float16"), "drafter_dtype must be"),
        (lambda: specjax.NGram(k_schedule="confidence"), "n-gram lookup has none"),
        (lambda: specjax.NGram(tree=((0,),), k_schedule="heuristic"), "shape is fixed"),
        (lambda: specjax.Medusa(None), "method 'medusa' needs Medusa heads"),
        (lambda: specjax.Medusa(heads, tree=specjax.Tree.chain(3)), "3 deep but"),
        (lambda: specjax.Medusa(heads, tree=specjax.Tree.full((5,))), "5 children"),
        (lambda: specjax.Medusa(heads, drafter_dtype=32), "drafter_dtype must be"),
        (lambda: specjax.Eagle(heads), "drafter must be an EAGLE drafter"),
        (lambda: specjax.Eagle(drafter, tree=specjax.Tree.full((5,))), "5 children"),
        (lambda: specjax.Eagle(drafter, tree=dynamic, candidates="iid"), "does not apply"),
        (lambda: specjax.DFlash(block, k=3), "k=3 is more than the 2 tokens"),
        (lambda: specjax.DFlash(block, candidates="distinct"), "'top' or 'iid'"),
    ]
    for make, needle in cases:
        with pytest.raises(GenerationError) as info:
            make()
        assert needle in str(info.value), (needle, str(info.value))
    too_big = specjax.Speculative(draft, tree=specjax.Tree.chain(200))
    with pytest.raises(GenerationError, match="the tree has 200 nodes"):
        generate(target, PROMPTS, too_big)


def test_mismatched_draft_vocab_is_rejected(models):
    target, _ = models
    small = random_model(target.config.replace(vocab_size=5), seed=3)
    with pytest.raises(GenerationError, match="vocab_size 5 != target vocab_size 8"):
        generate(target, PROMPTS, method=specjax.Speculative(draft=small))


@pytest.mark.fast
def test_nan_logits_are_an_error(models):
    target, _ = models
    broken = specjax.Model(target.config, {**target.params,
                                           "embed": target.params["embed"] * np.nan})
    with pytest.raises(GenerationError, match="NaN"):
        generate(broken, PROMPTS, max_new_tokens=2)


@pytest.fixture(scope="module")
def long_model():
    from tests.support.tiny import llama_config

    return random_model(llama_config(vocab=8, layers=2, positions=2048), seed=3, std=0.5)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_long_and_short_rows_in_one_batch_decode_as_alone(long_model, temperature):
    # Rows of 1,000 and 10 tokens: the short row's steps read the window the long row needs,
    # and its prompt is mostly padding in the chunked prefill. Neither may change its tokens.
    model = long_model
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, 8, 1000).tolist(), rng.integers(0, 8, 10).tolist()]
    kwargs = dict(sampling=specjax.SamplingParams(temperature=temperature), max_new_tokens=12,
                  eos_ids=(), seed=[11, 12])
    batched = generate(model, prompts, **kwargs).tokens
    for i, prompt in enumerate(prompts):
        alone = generate(model, [prompt], **dict(kwargs, seed=[kwargs["seed"][i]])).tokens[0]
        assert batched[i] == alone, i
    if temperature == 0:
        assert batched[1] == reference_greedy(model, prompts[1], 12)


def test_greedy_tokens_do_not_depend_on_the_buffer_size(long_model):
    # max_new_tokens sets the buffer (40 vs 1,200 new tokens: 64 vs 1,280 slots, the latter read
    # through windows); the first 40 tokens must not change.
    short = generate(long_model, [PROMPTS[0]], sampling=specjax.SamplingParams(temperature=0.0),
                     max_new_tokens=40, eos_ids=()).tokens
    long = generate(long_model, [PROMPTS[0]], sampling=specjax.SamplingParams(temperature=0.0),
                    max_new_tokens=1200, eos_ids=()).tokens
    assert long[0][:40] == short[0]


def test_each_method_owns_its_state(models):
    # `DecodeState.carry` is the method's own pytree (its module's `init` makes it, its `step`
    # keeps it); every other field has the same structure and shapes whatever the method.
    from specjax.api.generate import prepare
    from specjax.api.methods import CLASSES
    from specjax.decoding import config, loop
    from specjax.heads.dflash import init_block_drafter

    target, draft = models
    heads = init_heads(HeadsConfig(num_heads=2, num_blocks=1,
                                                   hidden_size=target.config.d_model,
                                                   vocab_size=8, subset_size=8), target, seed=3)
    drafter = init_drafter(target, seed=3)
    methods = {"autoregressive": specjax.Autoregressive(),
               "speculative": specjax.Speculative(draft, k=2), "ngram": specjax.NGram(k=2),
               "medusa": specjax.Medusa(heads, tree=specjax.Tree.full((2, 1))),
               "eagle": specjax.Eagle(drafter, tree=specjax.Tree.full((2, 1))),
               "dflash": specjax.DFlash(init_block_drafter(target, block_size=3, seed=3))}
    modules = {cls.name: cls.spec.module for cls in CLASSES}
    assert list(modules) == list(methods)                     # `CLASSES`' order
    shared = {}
    for method, module in modules.items():
        assert all(callable(getattr(module, f)) for f in ("init", "step", "layout"))
        request = prepare(target, PROMPTS, methods[method],
                          specjax.SamplingParams(temperature=1.0), max_new_tokens=4, eos_ids=())
        assert type(request.spec.method).name == method       # the method's own static spec
        state = loop.init(request.spec, request.weights, *request.inputs)
        after = loop.step(request.spec, request.weights, state)
        if method == "autoregressive":
            assert state.carry is None and after.carry is None
        else:
            assert type(state.carry) is module.Carry and type(after.carry) is module.Carry
            assert (jax.tree.map(np.shape, state.carry) == jax.tree.map(np.shape, after.carry))
        rest = state.replace(carry=None, accepted_histogram=None)
        shared[method] = (jax.tree.structure(rest), jax.tree.map(np.shape, jax.tree.leaves(rest)))
    assert len(set(map(str, shared.values()))) == 1, shared
    # What is static about one method is its own spec's (a `config.MethodSpec`, one class a
    # method, declared in its module), not a field of `DecodeSpec` beside what every generation
    # has.
    assert all(issubclass(c.spec, config.MethodSpec) and c.spec.module.__dict__[c.spec.__name__]
               is c.spec for c in CLASSES)
    assert {f.name for f in dataclasses.fields(loop.DecodeSpec)} == {
        "method", "target_config", "buffer_length", "trace", "mesh", "rules", "logprobs",
        "kernels"}


@pytest.mark.parametrize("dtype", ["bfloat16", "int8", "q8_0"])
def test_low_precision_greedy_equality_for_every_method_batched_and_alone(dtype):
    # In bfloat16, int8 and q8_0 every call of up to 32 tokens, the one-token step included, runs on
    # the kernels, whose rows get the same bits at every width: so a verify call scores each
    # token exactly as the autoregressive step does, and greedy speculation must reproduce
    # autoregressive greedy decoding token for token, as in float32.
    import dataclasses

    from specjax.testing.law import llama_config

    def model(layers, seed):
        config = dataclasses.replace(llama_config(8, layers=layers), dtype=dtype)
        return random_model(config, seed=seed, std=0.5)

    target, draft = model(2, 1), model(1, 2)
    assert target.params["embed"].dtype == jax.numpy.dtype(dtype if dtype != "q8_0" else "int8")
    kwargs = dict(sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=16,
                  eos_ids=())
    want = generate(target, PROMPTS, **kwargs).tokens
    for method in (specjax.Speculative(draft, k=3),
                   specjax.Speculative(draft, tree=specjax.Tree.full((2, 2))),
                   specjax.NGram(k=3)):
        assert generate(target, PROMPTS, method, **kwargs).tokens == want, method
    alone = generate(target, PROMPTS[:1], specjax.Speculative(draft, k=3), **kwargs)
    assert alone.tokens == want[:1]


@pytest.mark.parametrize("dtype", ["bfloat16", "int8", "q8_0"])
def test_low_precision_greedy_equality_for_medusa_and_eagle_batched_and_alone(dtype):
    # The embedded target in bfloat16, int8 or q8_0 with its shipped Medusa heads and EAGLE
    # drafter (in the target's dtype): their verify calls score every token as the autoregressive step does.
    from pathlib import Path

    weights = Path(specjax.__file__).resolve().parent.parent / "weights"
    target = specjax.load(weights / "llama-target", dtype=dtype)
    heads, drafter = specjax.load(weights / "llama-medusa"), specjax.load(weights / "llama-eagle")
    prompts = ["def add(a, b):", "class Stack:\n    def"]
    kwargs = dict(sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=16)
    want = generate(target, prompts, **kwargs).tokens
    for method in (specjax.Medusa(heads),
                   specjax.Eagle(drafter, tree=specjax.DynamicTree(3, 2, 4))):
        result = generate(target, prompts, method, **kwargs)
        assert result.tokens == want and result.stats.tokens_per_target_call > 1.5, method.name
        assert generate(target, prompts[1:], method, **kwargs).tokens == want[1:]


def test_int8_weights_on_a_device_mesh_are_a_named_error():
    # 8-bit matrices have no sharding table: generate refuses them on a mesh, naming the
    # model, rather than failing inside the placement.
    import dataclasses

    from specjax.testing.law import llama_config

    config = dataclasses.replace(llama_config(8, layers=1), dtype="int8")
    target = random_model(config, seed=1, std=0.5)
    with pytest.raises(GenerationError, match="the target has int8 weights"):
        generate(target, PROMPTS, max_new_tokens=2, mesh=make_mesh(data=1, model=1))
