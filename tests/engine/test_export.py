"""Every method's compiled decoding loop lowers for GPU and TPU: `jax.export` serialises the
whole `run` program (prefill and the `lax.while_loop`) for ("cuda", "tpu") on this CPU-only
machine, and the exported module holds none of specjax's CPU kernels (`specjax_few_rows`,
`specjax_few_query_attention`): on those platforms `lax.platform_dependent` takes XLA's
formulation. (Exporting for "cpu" is refused by `jax.export` precisely because the CPU program
calls those kernels, whose targets carry no compatibility guarantee; that is checked too.)

docs/gpu.md says how to run on a GPU and what to expect."""

from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace

import jax
import pytest
from jax import export

from specjax.api.generate import prepare
from specjax.decoding import loop
from specjax.sampling.tree import DynamicTree, Tree
from specjax import testing
from tests.exactness.test_distribution import NGRAM_PROMPT, eagle_drafter, in_dtype, medusa_heads
import specjax

METHODS = {        # each case's method, given the tiny pair
    "autoregressive": lambda pair: specjax.Autoregressive(),
    "speculative-chain": lambda pair: specjax.Speculative(pair.draft, k=3),
    "speculative-tree": lambda pair: specjax.Speculative(pair.draft, tree=Tree.full((2, 2)),
                                                         candidates="distinct"),
    "ngram": lambda pair: specjax.NGram(k=3),
    "medusa": lambda pair: specjax.Medusa(medusa_heads(pair.target), tree=Tree.full((2, 2)),
                                          candidates="iid"),
    "eagle-dynamic-tree": lambda pair: specjax.Eagle(eagle_drafter(pair.target),
                                                     tree=DynamicTree(3, 2, 4)),
    "speculative-confidence-schedule": lambda pair: specjax.Speculative(
        pair.draft, k=3, k_schedule="confidence", confidence_threshold=0.5),
}


def request(method, dtype="float32"):
    pair = testing.pair()
    if dtype != "float32":
        pair = in_dtype((pair.target, pair.draft), dtype)
        pair = SimpleNamespace(target=pair[0], draft=pair[1])
    return prepare(pair.target, [list(NGRAM_PROMPT), list(NGRAM_PROMPT[:5])], method(pair),
                   specjax.SamplingParams(temperature=0.8, top_p=0.9), max_new_tokens=8,
                   eos_ids=())


def flat_program(req):
    """The `run` program as a function of the inputs' leaves returning the state's leaves: plain
    arrays in and out, as a serialised program for another host takes them (specjax's pytree
    types stay on the Python side)."""
    run = loop.programs(req.spec).run
    leaves, treedef = jax.tree.flatten((req.weights, *req.inputs))

    def flat_run(*leaves):
        return jax.tree.leaves(run(*jax.tree.unflatten(treedef, leaves)))
    return jax.jit(flat_run), leaves


def custom_calls(module_text: str) -> set[str]:
    return set(re.findall(r"custom_call @([A-Za-z0-9_.]+)", module_text))


@pytest.mark.parametrize("name", METHODS)
def test_decoding_loop_exports_for_gpu_and_tpu(name):
    program, leaves = flat_program(request(METHODS[name]))
    exported = export.export(program, platforms=("cuda", "tpu"))(*leaves)
    assert exported.platforms == ("cuda", "tpu")
    text = exported.mlir_module()
    assert "while" in text                       # the decoding loop itself, not a fragment
    assert not any(c.startswith("specjax_") for c in custom_calls(text)), custom_calls(text)
    # What a GPU or TPU host would load: the serialised program round-trips.
    assert export.deserialize(exported.serialize()).platforms == ("cuda", "tpu")


@pytest.mark.parametrize("dtype", ["bfloat16", "int8", "q8_0"])
def test_low_precision_programs_export_for_gpu_and_tpu(dtype):
    # bfloat16 and 8-bit weights: XLA's products there (int8: of the dequantised weights; q8_0:
    # its law, `linear.q8_0_law`), no CPU kernel in the exported module; the CPU program does
    # call the kernels.
    req = request(METHODS["speculative-chain"], dtype)
    program, leaves = flat_program(req)
    text = export.export(program, platforms=("cuda", "tpu"))(*leaves).mlir_module()
    assert "while" in text
    assert not any(c.startswith("specjax_") for c in custom_calls(text)), custom_calls(text)
    cpu = loop.programs(req.spec).run.lower(req.weights, *req.inputs).as_text()
    # bfloat16 activations times bfloat16 weights: the pair product; q8_0: on packed weights
    # where the matrix has whole tiles of 16 outputs, else from its values and scales.
    kernels = {"int8": {"specjax_few_rows_q8"},
               "q8_0": {"specjax_few_rows_q8_0", "specjax_few_rows_q8_0_tiles"},
               "bfloat16": {"specjax_few_rows_bf16_pairs"}}[dtype]
    assert kernels & custom_calls(cpu), custom_calls(cpu)


def test_the_cpu_program_calls_the_kernels_and_cannot_be_exported():
    req = request(METHODS["speculative-chain"])
    run = loop.programs(req.spec).run
    lowered = run.lower(req.weights, *req.inputs).as_text()
    assert {"specjax_few_rows", "specjax_few_query_attention"} <= custom_calls(lowered)
    with pytest.raises(ValueError, match="custom calls"):
        export.export(run, platforms=("cpu",))(req.weights, *req.inputs)


def _product_rows(module_text: str) -> set[int]:
    """The query lengths T of the products of [B, T, D] activations in a module: the second
    dimension of each 3-D left operand of a dot_general."""
    rows = set()
    for line in module_text.splitlines():
        if "dot_general" in line:
            operand = re.search(r"\(tensor<(\d+)x(\d+)x(\d+)x[a-z]\w*>", line)
            if operand:
                rows.add(int(operand.group(2)))
    return rows


def _rounded_products(module_text: str) -> set[str]:
    """The shapes of the xors on a float's bits in a module (`quant.unfused`): each a product
    rounded on its own before the add it feeds."""
    return set(re.findall(r"stablehlo\.xor .* : tensor<([\dx]+)xi(?:16|32)>", module_text))


def test_the_exported_program_feeds_every_decode_call_at_the_law_width():
    # Issue 85: a GPU or TPU program (the kernels off, as `generate` makes it where they do not
    # serve) feeds the target 16 tokens a row in every call on the cache, a one-token step
    # included, so no product of the exported loop has a one-row left operand. There every
    # product that feeds an add in a layer (RoPE's two, the norms' squares) is rounded on its
    # own (`layers.rounded`), since XLA's GPU code, like its CPU code, contracts a multiply and
    # an add into an fma or not by the fusion: the loop holds those xors on the rows' bits at
    # 16 rows. The negative control, the same target at `law_width=1`, has one-row products
    # and no such xor.
    pair = testing.pair()
    config = pair.target.config
    prompts = [list(NGRAM_PROMPT), list(NGRAM_PROMPT[:5])]

    def exported(target):
        req = prepare(target, prompts, specjax.Autoregressive(),
                      specjax.SamplingParams(temperature=0.8), max_new_tokens=4, eos_ids=(),
                      kernels=False)
        program, leaves = flat_program(req)
        return export.export(program, platforms=("cuda", "tpu"))(*leaves).mlir_module()

    lawful = exported(pair.target)
    assert 16 in _product_rows(lawful) and 1 not in _product_rows(lawful), _product_rows(lawful)
    b, d = len(prompts), config.d_model
    rounded = _rounded_products(lawful)
    assert f"{b}x16x{d}" in rounded, rounded                            # the norms' squares
    assert f"{b}x16x{config.n_heads}x{config.head_dim}" in rounded, rounded       # RoPE's
    one = exported(dataclasses.replace(pair.target, config=config.replace(law_width=1)))
    assert 1 in _product_rows(one)
    assert not _rounded_products(one), _rounded_products(one)


def _branch_loops(module_text: str, rows: int, heads: int, head_dim: int) -> list[str]:
    """The while loops of a module over a call's nodes that each read their own key layout: the
    loop carries the layout, one list of cache slots a node [rows, T, S] (int32), and stacks
    each node's attention output [T, rows, heads, head_dim] (`layers._attend_by_branch`)."""
    loops = []
    for line in module_text.splitlines():
        if "stablehlo.while" not in line:
            continue
        types = line.rsplit(" : ", 1)[-1]
        for width in re.findall(rf"tensor<{rows}x(\d+)x\d+xi32>", types):
            if f"tensor<{width}x{rows}x{heads}x{head_dim}xf32>" in types:
                loops.append(line)
    return loops


def test_the_exported_tree_program_reads_each_nodes_branch_as_steps_do():
    # Issue 85, the tree gap: on XLA's path a tree call's attention is a loop over its nodes,
    # each attending over its branch laid out as one-token steps find it (`cache.branch_layout`),
    # so the exported GPU/TPU program of a tree method holds that loop, over the law's 16
    # positions. A chain needs none (its positions are a step's), and the negative control, the
    # same tree at `law_width=1` (the call at its own width, the cache's own layout), has none.
    pair = testing.pair()
    config = pair.target.config
    prompts = [list(NGRAM_PROMPT), list(NGRAM_PROMPT[:5])]

    def loops(target, method):
        req = prepare(target, prompts, method, specjax.SamplingParams(temperature=0.8),
                      max_new_tokens=4, eos_ids=(), kernels=False)
        program, leaves = flat_program(req)
        text = export.export(program, platforms=("cuda", "tpu"))(*leaves).mlir_module()
        return _branch_loops(text, len(prompts), config.n_heads, config.head_dim)

    tree = specjax.Speculative(pair.draft, tree=Tree.full((2, 2)), candidates="distinct")
    found = loops(pair.target, tree)
    assert found and all("tensor<16x" in line for line in found), found
    assert not loops(pair.target, specjax.Speculative(pair.draft, k=3))
    one = dataclasses.replace(pair.target, config=config.replace(law_width=1))
    assert not loops(one, tree)
