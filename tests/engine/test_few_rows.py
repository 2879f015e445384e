"""The few-row kernels (the plug-in `specjax.kernels`) and the choice of formulation by call width
(`specjax.model.linear`): the kernels build here (or the test says why not); the product computes what XLA computes (to
float32 rounding), gives a row the same bits whatever the call's width, and differentiates; the
attention computes XLA's attention without reading a slot past the ones in use, in chains and
token trees; and the model keeps its parity with transformers in the calls that use them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax import kernels
from specjax.kernels import ffi
from specjax.model.cache import attention_mask
from specjax.model.layers import attend, attend_cache
from specjax.model.linear import FEW_ROWS, linear
from specjax.model.transformer import forward
from tests.support.hf_models import hf_logits, tiny_gpt2, tiny_llama
from tests.exactness.test_parity import assert_logits_close


@pytest.fixture(scope="module", autouse=True)
def registered():
    if kernels._compiler() is None:
        pytest.skip("no C++ compiler here ($CXX, g++, c++, clang++): the kernels cannot be "
                    "built, and generate runs XLA's formulation (tests/engine/test_kernels.py)")
    # With a compiler, a kernel that stopped compiling must fail here, not fall back to XLA's
    # products with only a warning.
    assert kernels.ensure()


def test_the_kernel_builds_and_registers_here():
    assert kernels.plugin() is ffi.KERNELS
    library = kernels.build()
    built = library.stat().st_mtime_ns
    assert kernels.build() == library and library.stat().st_mtime_ns == built  # found, not rebuilt


def on(x, w, out_dtype=None, prefill=False):
    """`linear` given the kernels, as a config that names them gives them."""
    return linear(x, w, out_dtype, prefill=prefill, kernels=ffi.KERNELS)


def off(x, w, out_dtype=None, prefill=False):
    """`linear` given no kernels: XLA's formulation at every width."""
    return linear(x, w, out_dtype, prefill=prefill, kernels=None)


def random(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# (leading axes of x, I, O): I and O around the kernel's vector width (4, 8 or 16 floats) and
# its blocks (R rows of w, TB rows of x), so every tail is taken; leading axes as a model has.
SHAPES = [((2,), 576, 192), ((5,), 576, 1536), ((1, 9), 1536, 576), ((17,), 30, 13),
          ((32,), 37, 7), ((3,), 5, 3), ((2, 3), 64, 33), ((13,), 16, 1)]


@pytest.mark.parametrize("lead,n_in,n_out", SHAPES)
def test_product_equals_the_exact_product_to_float32_rounding(lead, n_in, n_out):
    x, w = random((*lead, n_in), 0), random((n_out, n_in), 1)
    ours = np.asarray(jax.jit(ffi.product)(x, w))
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    # Summing I float32 products: an error of a few ulps of sum |w x| per output.
    bound = 4 * n_in * np.finfo(np.float32).eps * (np.abs(x) @ np.abs(w).T)
    assert ours.shape == exact.shape
    assert np.all(np.abs(ours - exact) <= bound)
    xla = np.asarray(jnp.einsum("...I,OI->...O", x, w))
    assert np.all(np.abs(xla - exact) <= bound)           # the bound is one XLA meets too


def test_a_row_gets_the_same_bits_whatever_the_width():
    # The kernel sums each output in one fixed order, whatever the number of rows, the blocks
    # they fall in and the thread that computes them (specjax/kernels/few_rows.cc), so a token
    # checked in a tree of 17 gets the bits it gets in a call of 2.
    x, w = random((32, 576), 2), random((1536, 576), 3)
    product = jax.jit(ffi.product)
    full = np.asarray(product(x, w))
    for rows in (2, 3, 5, 8, 9, 13, 17, 31):
        np.testing.assert_array_equal(np.asarray(product(x[:rows], w)), full[:rows])
    np.testing.assert_array_equal(np.asarray(product(x, w)), full)   # and from call to call


def formulation(rows, dtype=jnp.float32, out_dtype=None, product=on):
    x, w = jnp.ones((1, rows, 24), dtype), jnp.ones((40, 24), dtype)
    text = str(jax.make_jaxpr(lambda x, w: product(x, w, out_dtype))(x, w))
    return "kernel" if ffi.PRODUCT_TARGET in text else "xla"


def test_linear_picks_the_kernel_for_few_rows_only():
    # One row too: a one-token step must sum as a verify call's rows do (issue 62), in every
    # dtype; past 32 rows XLA's GEMM.
    assert [formulation(rows) for rows in (1, 2, 5, 32, 33, 256)] == \
        ["kernel", "kernel", "kernel", "kernel", "xla", "xla"]
    assert (FEW_ROWS.start, FEW_ROWS.stop) == (1, 33)
    assert [formulation(rows, jnp.bfloat16) for rows in (1, 5, 32, 33)] == \
        ["kernel", "kernel", "kernel", "xla"]
    assert formulation(5, jnp.bfloat16, out_dtype=jnp.float32) == "kernel"
    assert formulation(5, jnp.float16) == "xla"                           # no float16 kernel
    # The same call traced without the kernels, then with them again: no switch, no state.
    assert formulation(5, product=off) == "xla"
    assert formulation(5) == "kernel"


def test_a_large_batchs_decoding_call_takes_the_kernel_in_calls_of_at_most_32_rows():
    # Rows of at most 32 tokens (decoding steps and verify calls) take the kernel whatever the
    # batch, in calls as even as they divide; longer rows (prefill) take XLA's GEMM. Every row
    # gets the bits it gets alone, in float32, bfloat16 and 8-bit weights.
    from specjax.model.linear import kernel_chunks
    from specjax.model.quant import quantize

    assert kernel_chunks((5, 24)) == (5,)
    assert kernel_chunks((4, 9, 24)) == (18, 18)
    assert kernel_chunks((64, 1, 24)) == (32, 32)
    assert kernel_chunks((11, 3, 24)) == (17, 16)
    assert kernel_chunks((2, 33, 24)) == ()                  # a prefill: XLA's GEMM
    assert kernel_chunks((40, 24)) == (20, 20)               # rows of one token
    assert len(kernel_chunks((1024, 1, 24))) == 32
    assert kernel_chunks((1025, 1, 24)) == ()                # past CHUNKED_ROWS: XLA's GEMM
    assert formulation(36) == "xla"                          # [1, 36, I]: one row of 36 tokens
    x = random((4, 9, 576), 12)
    for w in (random((70, 576), 13), jnp.asarray(random((70, 576), 13), jnp.bfloat16),
              quantize(random((70, 576), 13))):
        text = jax.jit(on).lower(x, w).as_text()           # lowered for this CPU
        assert "specjax_few_rows" in text and "dot_general" not in text
        prefill = jax.jit(lambda x, w: on(x, w, prefill=True))   # a prefill's: XLA's GEMM
        assert "dot_general" in prefill.lower(x, w).as_text()
        ours = np.asarray(jax.jit(on)(x, w))
        alone = np.stack([np.asarray(jax.jit(on)(x[b, t][None], w))[0]
                          for b in range(4) for t in range(9)]).reshape(ours.shape)
        np.testing.assert_array_equal(ours, alone)


def test_bfloat16_weights_give_the_float32_kernels_bits_on_the_widened_weights():
    # The bfloat16 kernel widens each weight exactly and sums in the float32 kernel's order, so
    # its products are the float32 kernel's on w.astype(float32), bit for bit, at every width;
    # I = 577 leaves a tail in every row. And linear() casts in and out around it.
    x = random((32, 577), 8)
    w = jnp.asarray(random((300, 577), 9), jnp.bfloat16)
    product = jax.jit(ffi.product)
    for rows in (1, 2, 5, 17, 32):
        ours = np.asarray(product(x[:rows], w))
        np.testing.assert_array_equal(ours, np.asarray(product(x[:rows], w.astype(jnp.float32))))
        exact = x[:rows].astype(np.float64) @ np.asarray(w, np.float64).T
        np.testing.assert_allclose(ours, exact, rtol=1e-4, atol=1e-4)
    xb = jnp.asarray(x[:5], jnp.bfloat16)
    y = jax.jit(on)(xb, w)                  # bfloat16 activations: the pair product's
    assert y.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(y), np.asarray(
        jax.jit(ffi.product_bf16_pairs)(xb, w).astype(jnp.bfloat16)))


def vdpbf16ps_product(x, w) -> np.ndarray:
    """x [T, I] . w [O, I]^T for bfloat16 operands (I a multiple of 32) as AVX512_BF16's
    VDPBF16PS computes it, written from Intel's description of the instruction: lane l of each
    chunk of 32 inputs adds the product of inputs 2l + 1, then of inputs 2l, to its float32 sum,
    each add rounded to nearest even (bfloat16 products are exact in float32; no denormals
    occur in these data), then the 16 lanes summed in order, as the kernel's other products do."""
    x, w = np.asarray(x, np.float32), np.asarray(w, np.float32)
    (t, i), o = x.shape, w.shape[0]
    lanes = np.zeros((t, o, 16), np.float32)
    for c in range(0, i, 32):
        xs, ws = x[:, c:c + 32].reshape(t, 16, 2), w[:, c:c + 32].reshape(o, 16, 2)
        for k in (1, 0):
            lanes = lanes + xs[:, None, :, k] * ws[None, :, :, k]     # exact products, one add
    total = np.zeros((t, o), np.float32)
    for lane in range(16):
        total = total + lanes[..., lane]
    return total


def test_bfloat16_pairs_are_the_instructions_arithmetic_or_the_widened_law_and_keep_a_rows_bits():
    # With bfloat16 activations the kernel multiplies pairs where the CPU has AVX512_BF16
    # (`kernels.paths()`), else it widens x and takes the bfloat16 kernel's law. Either way a
    # row's sums do not depend on the call's width (I = 576 + 32: chunks only; 577: a tail).
    rng = np.random.default_rng(10)
    for n_in in (608, 577):
        x = jnp.asarray(rng.standard_normal((32, n_in)), jnp.bfloat16)
        w = jnp.asarray(rng.standard_normal((70, n_in)), jnp.bfloat16)
        pairs = jax.jit(ffi.product_bf16_pairs)
        full = np.asarray(pairs(x, w))
        for rows in (1, 2, 3, 5, 6, 9, 17):
            np.testing.assert_array_equal(np.asarray(pairs(x[:rows], w)), full[:rows],
                                          err_msg=f"I = {n_in}, {rows} rows")
        widened = np.asarray(jax.jit(ffi.product)(x.astype(jnp.float32), w))
        if kernels.paths()["bfloat16"] == "avx512-bf16":
            if n_in % 32 == 0:
                np.testing.assert_array_equal(full, vdpbf16ps_product(x, w))
            # The control: the widened law is another order, so it is told apart.
            assert np.mean(full != widened) > 0.3
        else:
            np.testing.assert_array_equal(full, widened)


def test_int8_weights_give_the_float32_kernels_bits_on_the_dequantized_weights():
    # The 8-bit kernel dequantises each value exactly (an int8 times a float16 scale) and sums
    # in the float32 kernel's order: its products are the float32 kernel's on dequantize(w), bit
    # for bit, at every width. Blocks of 32 (Q8_0) and a scale per row (I = 48, not a multiple
    # of 32); I = 1,536 in blocks of 32 as SmolLM2's down projection.
    from specjax.model.quant import dequantize, quantize

    product = jax.jit(ffi.product)
    product_int8 = jax.jit(ffi.product_int8)
    for n_in, n_out, block in ((1536, 100, 32), (48, 37, 48), (64, 300, 32)):
        x, w = random((32, n_in), 10), quantize(random((n_out, n_in), 11))
        assert w.block == block and w.scales.dtype == jnp.float16
        dense = dequantize(w)
        for rows in (1, 2, 5, 17, 32):
            ours = np.asarray(product_int8(x[:rows], w.values, w.scales))
            np.testing.assert_array_equal(ours, np.asarray(product(x[:rows], dense)))
        # linear() takes the kernel, and XLA's product of the dequantised weights where the
        # kernels are off; the two agree to float32 rounding: the bound of the first test, which
        # XLA's product meets too. (With the switch this layer had, the XLA product traced
        # first was the one both calls ran: `jax.jit(linear)` kept its trace.)
        np.testing.assert_array_equal(np.asarray(jax.jit(on)(x[:1], w)),
                                      np.asarray(product(x[:1], dense)))
        xla, ours = np.asarray(jax.jit(off)(x, w)), np.asarray(jax.jit(on)(x, w))
        assert not np.array_equal(xla, ours) or n_in < 64       # two formulations, two orders
        bound = 8 * n_in * np.finfo(np.float32).eps * (np.abs(x) @ np.abs(np.asarray(dense)).T)
        assert np.all(np.abs(ours - xla) <= bound)


def test_linear_picks_the_int8_kernel_for_up_to_32_rows():
    from specjax.model.quant import quantize

    def formulation_int8(rows, n_in=32, product=on):
        x, w = jnp.ones((1, rows, n_in)), quantize(np.ones((40, n_in), np.float32))
        text = str(jax.make_jaxpr(product)(x, w))
        return "kernel" if ffi.INT8_TARGET in text else "xla"

    assert [formulation_int8(rows) for rows in (1, 5, 32, 33)] == \
        ["kernel", "kernel", "kernel", "xla"]
    assert formulation_int8(5, n_in=24) == "xla"     # a block of 24: not whole vectors
    assert formulation_int8(5, product=off) == "xla"


def test_gradients_through_the_kernel_equal_xlas():
    x, w = random((5, 48), 4), random((20, 48), 5)
    def loss(product):
        return lambda x, w: jnp.sum(jnp.sin(product(x, w)))
    ours = jax.grad(loss(on), argnums=(0, 1))(x, w)
    theirs = jax.grad(loss(off), argnums=(0, 1))(x, w)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_vmap_over_the_kernel():
    xs, w = random((4, 5, 48), 6), random((20, 48), 7)
    mapped = jax.jit(jax.vmap(lambda x: on(x, w)))(xs)
    np.testing.assert_allclose(mapped, np.einsum("bti,oi->bto", xs, w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("length", [1, 5, 17])
def test_few_token_calls_match_transformers(tmp_path, arch, length):
    # test_parity's calls have 80 rows (XLA's products); these have the widths of a decoding
    # step and of verify calls. D = 30 and 5 heads leave a tail in every row of every weight.
    hf = (tiny_llama(tmp_path, d=30, heads=5, kv_heads=5) if arch == "llama"
          else tiny_gpt2(tmp_path, d=30, heads=3))
    model = specjax.load(tmp_path)
    tokens = np.random.default_rng(length).integers(0, model.config.vocab_size, (1, length))
    positions = np.arange(length)[None]
    assert formulation(length) == "kernel"
    config = model.config.replace(kernels=ffi.KERNELS)
    ours, _ = jax.jit(forward, static_argnums=1)(model.params, config, tokens, positions)
    assert_logits_close(ours, hf_logits(hf, tokens))


# -- The few-query attention kernel -------------------------------------------------------------

def cache_and_queries(b, t, kv_heads, g, h, slots, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, t, kv_heads * g, h)).astype(np.float32)
    keys = rng.standard_normal((b, kv_heads, h, slots)).astype(np.float32)
    values = rng.standard_normal((b, kv_heads, slots, h)).astype(np.float32)
    return q, keys, values


@pytest.mark.parametrize("b,t,kv_heads,g,h,slots,last", [
    (1, 1, 3, 3, 64, 2048, [49]),            # SmolLM2's heads, a step early in a long buffer
    (1, 5, 3, 3, 64, 2048, [1499]),          # a verify call deep in the cache: six chunks
    (2, 9, 2, 1, 12, 700, [255, 530]),       # ragged rows, a chunk's last slot, H = 12
    (3, 32, 1, 4, 16, 300, [31, 299, 100]),  # 128 query rows per key head; the buffer's end
])
def test_attention_equals_xlas_and_reads_no_slot_past_the_limit(b, t, kv_heads, g, h, slots,
                                                                  last):
    q, keys, values = cache_and_queries(b, t, kv_heads, g, h, slots, seed=t)
    query_slots = np.array(last)[:, None] - (t - 1) + np.arange(t)            # [B, T]
    key_slots = np.broadcast_to(np.arange(slots), (b, slots))
    mask = np.asarray(attention_mask(jnp.asarray(query_slots), jnp.asarray(key_slots)))
    limit = query_slots.max(axis=1) + 1
    expected = np.asarray(attend(q, keys, values, mask))
    # Slots at or past a row's limit hold NaN: one read would make that row's output NaN.
    for row, end in enumerate(limit):
        keys[row, :, :, end:] = np.nan
        values[row, :, end:] = np.nan
    ours = np.asarray(jax.jit(ffi.few_query_attention)(q, keys, values, mask, limit))
    np.testing.assert_allclose(ours, expected, rtol=2e-5, atol=2e-5)


def test_attention_to_a_bfloat16_cache_is_the_float32_kernels_on_the_widened_cache():
    q, keys, values = cache_and_queries(2, 9, 3, 3, 64, 700, seed=11)
    keys, values = jnp.asarray(keys, jnp.bfloat16), jnp.asarray(values, jnp.bfloat16)
    query_slots = np.array([[300], [650]]) - 8 + np.arange(9)
    mask = attention_mask(jnp.asarray(query_slots), jnp.broadcast_to(jnp.arange(700), (2, 700)))
    limit = query_slots.max(axis=1) + 1
    attend_kernel = jax.jit(ffi.few_query_attention)
    ours = attend_kernel(jnp.asarray(q, jnp.bfloat16), keys, values, mask, limit)
    assert ours.dtype == jnp.bfloat16                      # the cache's dtype, as attend gives
    widened = attend_kernel(jnp.asarray(q, jnp.bfloat16).astype(jnp.float32),
                            keys.astype(jnp.float32), values.astype(jnp.float32), mask, limit)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(widened.astype(jnp.bfloat16)))
    expected = attend(q, keys.astype(jnp.float32), values.astype(jnp.float32), mask)
    np.testing.assert_allclose(np.asarray(ours, np.float32), expected, rtol=2e-2, atol=2e-2)


def test_attention_in_a_token_tree_sees_ancestors_only():
    # A sparse tree's mask (cache.attention_mask with TreeAttention), one tree per row.
    from specjax.model.cache import TreeAttention
    from specjax.sampling.tree import Tree

    tree = Tree.full((2, 2, 1))
    n = tree.ancestors.shape[0]                # the root and its nodes
    q, keys, values = cache_and_queries(2, n, 3, 3, 64, 1024, seed=7)
    root = jnp.array([300, 700], jnp.int32)
    attention = TreeAttention(root=root, ancestors=jnp.asarray(tree.ancestors))
    query_slots = attention.slots(n)
    key_slots = jnp.broadcast_to(jnp.arange(1024), (2, 1024))
    mask = attention_mask(query_slots, key_slots, attention)
    expected = attend(q, keys, values, mask)
    ours = jax.jit(ffi.few_query_attention)(q, keys, values, mask, jnp.max(query_slots, 1) + 1)
    np.testing.assert_allclose(ours, expected, rtol=2e-5, atol=2e-5)


def test_attention_uses_the_kernel_for_few_queries_only():
    def uses(t, dtype=jnp.float32, plugin=ffi.KERNELS):
        q = jnp.ones((1, t, 4, 8), dtype)
        k, v = jnp.ones((1, 1, 2, 8, 64), dtype), jnp.ones((1, 1, 2, 64, 8), dtype)  # L = 1
        slots = jnp.broadcast_to(jnp.arange(t), (1, t))
        text = str(jax.make_jaxpr(lambda *a: attend_cache(*a, kernels=plugin))(q, k, v, slots))
        return ffi.ATTENTION_TARGET in text

    assert [uses(t) for t in (1, 5, 32, 33, 64)] == [True, True, True, False, False]
    assert uses(5, jnp.bfloat16) and not uses(5, jnp.float16)
    assert not uses(5, plugin=None)


AVX2_SCRIPT = """
import json, sys
import jax, jax.numpy as jnp, numpy as np
from specjax import kernels
kernels.FLAGS = kernels.FLAGS + ("-mno-avx512f", "-mno-f16c") + tuple(sys.argv[2:])
assert kernels.load(cache_dir=sys.argv[1])
from specjax.kernels import ffi as L
from specjax.model.linear import q8_0_law
from specjax.model.quant import dequantize, pack_tiles, quantize, quantize_rows
rng = np.random.default_rng(0)
bad = []
for O, I in ((37, 64), (5, 577), (64, 48), (3, 24), (32, 96)):
    x = rng.standard_normal((32, I)).astype(np.float32)
    w = rng.standard_normal((O, I)).astype(np.float32)
    wb, q = jnp.asarray(w, jnp.bfloat16), quantize(w)
    forms = {"f32": (L.product, (w,)), "bf16": (L.product, (wb,))}
    # bfloat16 activations: without AVX512_BF16, x widened and the bfloat16 kernel's law.
    xb = jnp.asarray(x, jnp.bfloat16)
    if not np.array_equal(np.asarray(jax.jit(L.product_bf16_pairs)(xb, wb)),
                          np.asarray(jax.jit(L.product)(xb.astype(jnp.float32), wb))):
        bad.append(["bf16 pairs", O, I])
    if I % 16 == 0:
        forms["int8"] = (L.product_int8, (q.values, q.scales))
    full = {k: np.asarray(jax.jit(f)(x, *a)) for k, (f, a) in forms.items()}
    # q8_0, with values of -128 in one matrix (ggml's quantiser makes none; a file may hold them).
    v8 = q.values.at[:, ::7].set(-128) if O == 32 else q.values
    law = jax.jit(lambda x: q8_0_law(*quantize_rows(x, q.block), v8, q.scales))
    tiles = pack_tiles(v8, q.scales)
    for rows in (1, 2, 17, 32):          # q8_0: the kernel's AVX2 paths are the law
        if not np.array_equal(np.asarray(jax.jit(L.product_q8_0)(x[:rows], v8, q.scales)),
                              np.asarray(law(x[:rows]))):
            bad.append(["q8_0", O, I, rows])
        if tiles is not None and not np.array_equal(
                np.asarray(jax.jit(L.product_q8_0_tiles)(x[:rows], tiles, v8, q.scales)),
                np.asarray(law(x[:rows]))):
            bad.append(["q8_0 tiles", O, I, rows])
    for rows in (1, 2, 3, 5, 6, 9, 17):
        for k, (f, a) in forms.items():
            if not np.array_equal(np.asarray(jax.jit(f)(x[:rows], *a)), full[k][:rows]):
                bad.append(["width", k, O, I, rows])
        same = {"bf16": wb.astype(jnp.float32)}
        if "int8" in forms:
            same["int8"] = dequantize(q)
        for k, dense in same.items():
            if not np.array_equal(full[k][:rows], np.asarray(jax.jit(L.product)(x[:rows], dense))[:rows]):
                bad.append(["dtype", k, O, I, rows])
import ctypes
from specjax.kernels import _loaded
path = _loaded[-1].specjax_q8_0_path
path.restype = ctypes.c_char_p
print(json.dumps([path().decode(), bad]))
"""


def test_an_avx2_build_keeps_the_bits_contracts(tmp_path):
    # The kernels built without AVX-512 and F16C (the AVX2 hosts' code, and the portable
    # float16 conversions; on an AVX2 host the first flag changes nothing), in a process of its
    # own (its targets have the names of this process's): a row gets the same bits whatever
    # the width, in every dtype, the bfloat16 and int8 products are the float32 kernel's on the
    # widened or dequantised weights, and the q8_0 product (no VNNI tiles here) is its law. Odd numbers of rows of w
    # (a one-row block) and of x (6 = 5 + 1) included: there GCC had left `acc += a * b`
    # unfused for AVX2, until the kernel fused it explicitly.
    import json
    import subprocess
    import sys

    # Built twice: as the CPU allows (AVX-VNNI's 256-bit VPDPBUSD for q8_0 where it has it),
    # and without AVX-VNNI (VPMADDUBSW, the Zen 3 hosts' path; the same build where the CPU has
    # no AVX-VNNI anyway).
    vnni = "avx_vnni" in open("/proc/cpuinfo").read().split()
    for flags, path in (((), "avx-vnni" if vnni else "avx2"), (("-mno-avxvnni",), "avx2")):
        done = subprocess.run([sys.executable, "-c", AVX2_SCRIPT, str(tmp_path), *flags],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert json.loads(done.stdout.splitlines()[-1]) == [path, []], flags
