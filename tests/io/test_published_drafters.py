"""The field's drafters as published: EAGLE-3 (the EAGLE repo's layout and speculators'), EAGLE-1
and Medusa-1 checkpoints written here from random tensors in each layout, loaded by specjax and
compared with a PyTorch forward written below from the published description (not from
specjax's code); their round trips through `save_drafter` / `save_heads`; their hostile
variants; and greedy equality with the loaded drafters.

The target is a tiny Hugging Face Llama (7 layers, so that EAGLE-3's default taps 2, 3 and 4
are distinct); its hidden states come from transformers. Drafters use GQA (4 query heads, 2
key/value heads) and EAGLE-3 a draft vocabulary of 20 of the target's 32 ids.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

import specjax
from specjax.api.drafters import drafter_log_probs
from specjax.api.generate import GenerationError, generate
from specjax.heads import medusa
from specjax.heads.eagle import init_drafter
from specjax.io.eagle import save_drafter
from specjax.io.medusa import save_heads
from specjax.model.transformer import hidden_states
from specjax.sampling.tree import Tree
from tests.support.hf_models import tiny_llama

V, D, LAYERS, DRAFT_VOCAB = 32, 32, 7, 20
N, K, H, F, EPS, THETA = 4, 2, 8, 48, 1e-5, 10000.0
TOKENS = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8], [2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5]]
pytestmark = pytest.mark.xdist_group("published-drafters")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    directory = tmp_path_factory.mktemp("target")
    hf = tiny_llama(directory, vocab=V, d=D, layers=LAYERS, heads=4, kv_heads=2, seed=3)
    return specjax.load(directory), hf


def layer_config(**extra) -> dict:
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": D,
            "num_hidden_layers": 1, "num_attention_heads": N, "num_key_value_heads": K,
            "head_dim": H, "intermediate_size": F, "vocab_size": V, "rms_norm_eps": EPS,
            "rope_theta": THETA, "max_position_embeddings": 128, "hidden_act": "silu",
            "tie_word_embeddings": False, **extra}


def random_layer(rng, prefix: str, width: int, input_norm: bool, hidden_norm: bool) -> dict:
    def w(*shape):
        return (0.2 * rng.standard_normal(shape)).astype(np.float32)

    def norm():
        return (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    t = {"self_attn.q_proj.weight": w(N * H, width), "self_attn.k_proj.weight": w(K * H, width),
         "self_attn.v_proj.weight": w(K * H, width), "self_attn.o_proj.weight": w(D, N * H),
         "mlp.gate_proj.weight": w(F, D), "mlp.up_proj.weight": w(F, D),
         "mlp.down_proj.weight": w(D, F), "post_attention_layernorm.weight": norm()}
    if input_norm:
        t["input_layernorm.weight"] = norm()
    if hidden_norm:
        t["hidden_norm.weight"] = norm()
    return {prefix + k: v for k, v in t.items()}


def draft_ids(rng) -> np.ndarray:
    return np.sort(rng.permutation(V)[:DRAFT_VOCAB])


def write_eagle3(directory, seed, layout, norm_before_residual=False, taps=None,
                 own_embeddings=False):
    """An EAGLE-3 checkpoint in the EAGLE repo's layout ("eagle": midlayer.*, taps left to the
    default) or speculators' ("speculators": layers.0.*, taps and options in its config)."""
    rng = np.random.default_rng(seed)
    prefix = "midlayer." if layout == "eagle" else "layers.0."
    n_taps = len(taps) if taps else 3
    t = random_layer(rng, prefix, 2 * D, True, True)
    ids = draft_ids(rng)
    t2d = np.zeros(V, bool)
    t2d[ids] = True
    t.update({"fc.weight": (0.2 * rng.standard_normal((D, n_taps * D))).astype(np.float32),
              "norm.weight": (1 + 0.1 * rng.standard_normal(D)).astype(np.float32),
              "lm_head.weight": (0.3 * rng.standard_normal((DRAFT_VOCAB, D))).astype(np.float32),
              "d2t": (ids - np.arange(DRAFT_VOCAB)).astype(np.int64), "t2d": t2d})
    if own_embeddings:
        t["embed_tokens.weight"] = rng.standard_normal((V, D)).astype(np.float32)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(t, str(directory / "model.safetensors"))
    if layout == "eagle":
        config = dict(layer_config(architectures=["LlamaForCausalLMEagle3"]),
                      draft_vocab_size=DRAFT_VOCAB)
    else:
        config = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
                  "transformer_layer_config": layer_config(), "draft_vocab_size": DRAFT_VOCAB,
                  "norm_before_residual": norm_before_residual, "target_hidden_size": D,
                  "eagle_aux_hidden_state_layer_ids": list(taps)}
    (directory / "config.json").write_text(json.dumps(config))
    return t


def write_eagle1(directory, seed):
    """An EAGLE-1 checkpoint as the EAGLE repo ships it: a torch pickle of tensors."""
    rng = np.random.default_rng(seed)
    t = random_layer(rng, "layers.0.", D, False, False)
    t["fc.weight"] = (0.2 * rng.standard_normal((D, 2 * D))).astype(np.float32)
    t["fc.bias"] = (0.1 * rng.standard_normal(D)).astype(np.float32)
    directory.mkdir(parents=True, exist_ok=True)
    torch.save({k: torch.from_numpy(v) for k, v in t.items()}, directory / "pytorch_model.bin")
    (directory / "config.json").write_text(json.dumps(dict(layer_config(), bias=True)))
    return t


def write_medusa(directory, seed, heads=3, blocks=2, pickle=False):
    rng = np.random.default_rng(seed)
    t = {}
    for i in range(heads):
        for j in range(blocks):
            t[f"{i}.{j}.linear.weight"] = (0.2 * rng.standard_normal((D, D))).astype(np.float32)
            t[f"{i}.{j}.linear.bias"] = (0.1 * rng.standard_normal(D)).astype(np.float32)
        t[f"{i}.{blocks}.weight"] = (0.3 * rng.standard_normal((V, D))).astype(np.float32)
    directory.mkdir(parents=True, exist_ok=True)
    if pickle:
        torch.save({k: torch.from_numpy(v) for k, v in t.items()},
                   directory / "medusa_lm_head.pt")
    else:
        save_file(t, str(directory / "medusa_lm_head.safetensors"))
    (directory / "config.json").write_text(json.dumps(
        {"medusa_num_heads": heads, "medusa_num_layers": blocks,
         "base_model_name_or_path": "tiny-llama"}))
    return t


# -- The published forwards, in PyTorch, from the papers' and authors' descriptions -------------

def rms(x, w):
    return torch.as_tensor(w) * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


def rope(x):
    """Llama's rotary embedding in the half-split layout, positions 0 .. T - 1 (the EAGLE repo
    starts a drafter's positions at 0 for the pair (h_0, x_1))."""
    t, half = x.shape[1], x.shape[-1] // 2
    inv = 1.0 / THETA ** (torch.arange(0, 2 * half, 2, dtype=torch.float32) / (2 * half))
    angle = torch.arange(t, dtype=torch.float32)[:, None] * inv[None]
    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos[None, :, None] + rotated * sin[None, :, None]


def attention(x, t, prefix):
    b, s, _ = x.shape

    def proj(name, heads):
        return (x @ torch.as_tensor(t[prefix + f"self_attn.{name}.weight"]).T).view(b, s, heads, H)
    q, k, v = rope(proj("q_proj", N)), rope(proj("k_proj", K)), proj("v_proj", K)
    k, v = k.repeat_interleave(N // K, dim=2), v.repeat_interleave(N // K, dim=2)
    scores = torch.einsum("btnh,bsnh->bnts", q, k) / math.sqrt(H)
    scores = scores.masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), -math.inf)
    out = torch.einsum("bnts,bsnh->btnh", scores.softmax(-1), v).reshape(b, s, N * H)
    return out @ torch.as_tensor(t[prefix + "self_attn.o_proj.weight"]).T


def mlp(x, t, prefix):
    def w(name):
        return torch.as_tensor(t[prefix + f"mlp.{name}.weight"])
    return (torch.nn.functional.silu(x @ w("gate_proj").T) * (x @ w("up_proj").T)) @ w("down_proj").T


def eagle3_logits(t, prefix, taps, tokens, embed, norm_before_residual=False):
    """EAGLE-3 (Li et al. 2025): the pair (taps_t, x_{t+1}) for t = 0 .. T - 2 -> logits over
    the draft vocabulary [B, T - 1, S]."""
    g = taps[:, :-1] @ torch.as_tensor(t["fc.weight"]).T
    e = embed[tokens[:, 1:]]
    hidden = rms(g, t[prefix + "hidden_norm.weight"])
    x = torch.cat([rms(e, t[prefix + "input_layernorm.weight"]), hidden], -1)
    h = (hidden if norm_before_residual else g) + attention(x, t, prefix)
    h = h + mlp(rms(h, t[prefix + "post_attention_layernorm.weight"]), t, prefix)
    return rms(h, t["norm.weight"]) @ torch.as_tensor(t["lm_head.weight"]).T


def eagle1_logits(t, feature, tokens, embed, lm_head):
    """EAGLE-1 (Li et al. 2024): fc over [E x_{t+1} ; f_t], one layer with no input norm, the
    target's LM head on its output -> [B, T - 1, V]."""
    z = torch.cat([embed[tokens[:, 1:]], feature[:, :-1]], -1) @ torch.as_tensor(
        t["fc.weight"]).T + torch.as_tensor(t["fc.bias"])
    h = z + attention(z, t, "layers.0.")
    h = h + mlp(rms(h, t["layers.0.post_attention_layernorm.weight"]), t, "layers.0.")
    return h @ lm_head.T


def medusa_logits(t, hidden, heads, blocks):
    """Medusa-1 (Cai et al. 2024): per head, ResBlocks z + SiLU(W z + b), then its own LM head
    -> [B, T, heads, V]."""
    out = []
    for i in range(heads):
        z = hidden
        for j in range(blocks):
            z = z + torch.nn.functional.silu(z @ torch.as_tensor(t[f"{i}.{j}.linear.weight"]).T
                                             + torch.as_tensor(t[f"{i}.{j}.linear.bias"]))
        out.append(z @ torch.as_tensor(t[f"{i}.{blocks}.weight"]).T)
    return torch.stack(out, -2)


def hf_states(hf, tokens):
    with torch.no_grad():
        out = hf.model(torch.as_tensor(tokens), output_hidden_states=True)
    return out.last_hidden_state, out.hidden_states     # hidden_states[n]: after n layers


def assert_log_probs_match(specjax_lp, torch_logits, ids):
    """specjax's [B, T, V] log-probabilities at slots 1 .. T - 1 against the torch logits of
    the pairs t = 0 .. T - 2 over the ids `ids`; every other id must be -inf."""
    got = np.asarray(specjax_lp)[:, 1:]
    want = torch.log_softmax(torch_logits, -1).numpy()
    np.testing.assert_allclose(got[..., ids], want, rtol=1e-5, atol=2e-5)
    outside = np.setdiff1d(np.arange(V), ids)
    assert np.all(np.isneginf(got[..., outside]))


# -- Parity ----------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["eagle", "speculators", "speculators-norm-before-residual"])
def test_eagle3_matches_the_published_forward(target, tmp_path, layout):
    model, hf = target
    nbr = layout.endswith("norm-before-residual")
    taps = None if layout == "eagle" else (1, 3, 5)
    t = write_eagle3(tmp_path / layout, 5, layout.split("-")[0], nbr, taps,
                     own_embeddings=layout == "speculators")
    drafter = specjax.load(tmp_path / layout)
    assert drafter.config.kind == "eagle3" and drafter.config.subset_size == DRAFT_VOCAB
    embed = torch.as_tensor(t["embed_tokens.weight"]) if "embed_tokens.weight" in t \
        else hf.model.embed_tokens.weight.detach()
    _, states = hf_states(hf, TOKENS)
    tapped = torch.cat([states[n] for n in (taps or (2, 3, 4))], -1)      # the repo's default
    prefix = "midlayer." if layout == "eagle" else "layers.0."
    with torch.no_grad():
        want = eagle3_logits(t, prefix, tapped, torch.as_tensor(TOKENS), embed, nbr)
    ids = np.arange(DRAFT_VOCAB) + t["d2t"]
    assert_log_probs_match(drafter_log_probs(model, drafter, TOKENS), want, ids)


def test_eagle1_matches_the_published_forward(target, tmp_path):
    model, hf = target
    t = write_eagle1(tmp_path / "eagle1", 6)
    drafter = specjax.load(tmp_path / "eagle1")
    assert drafter.config.kind == "eagle1" and drafter.config.head == "target"
    feature, _ = hf_states(hf, TOKENS)           # the base model's output: after its final norm
    with torch.no_grad():
        want = eagle1_logits(t, feature, torch.as_tensor(TOKENS),
                             hf.model.embed_tokens.weight.detach(), hf.lm_head.weight.detach())
    assert_log_probs_match(drafter_log_probs(model, drafter, TOKENS), want, np.arange(V))


@pytest.mark.parametrize("pickle", [False, True])
def test_medusa1_matches_the_published_forward(target, tmp_path, pickle):
    model, hf = target
    t = write_medusa(tmp_path / "medusa", 7, pickle=pickle)
    heads = specjax.load(tmp_path / "medusa")
    assert heads.config.head == "own" and heads.config.num_blocks == 2
    feature, _ = hf_states(hf, TOKENS)
    with torch.no_grad():
        want = medusa_logits(t, feature, 3, 2).numpy()
    h, _ = hidden_states(model.params, model.config, np.asarray(TOKENS),
                         np.broadcast_to(np.arange(len(TOKENS[0])), (2, len(TOKENS[0]))))
    got = medusa.subset_logits(medusa.runtime_weights(heads, model), h, kernels=None)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=2e-5)


# -- Round trips and greedy equality -----------------------------------------------------------

def test_published_layouts_round_trip_exactly(target, tmp_path):
    model, _ = target
    write_eagle3(tmp_path / "in3", 8, "speculators", True, (1, 3, 5), own_embeddings=True)
    write_eagle1(tmp_path / "in1", 9)
    write_medusa(tmp_path / "inm", 10)
    for source, fmt in (("in3", "speculators"), ("in3", "eagle"), ("in1", "eagle")):
        drafter = specjax.load(tmp_path / source)
        again = specjax.load(save_drafter(drafter, tmp_path / f"out-{source}-{fmt}",
                                                  format=fmt))
        assert again.config == drafter.config, (source, fmt)
        np.testing.assert_array_equal(again.token_ids, drafter.token_ids)
        for a, b in zip(*(sorted(_leaves(d.params).items()) for d in (drafter, again))):
            np.testing.assert_array_equal(a[1], b[1], err_msg=f"{source} {fmt} {a[0]}")
        # The trees it was tuned with travel in config.json's `eagle_tree` (dynamic or static)
        # and `eagle_sampled_tree`.
        assert drafter.tree is None and again.tree is None and again.sampled_tree is None
        for i, (tree, sampled) in enumerate(((specjax.DynamicTree(4, 4, 8), Tree.chain(3)),
                                             (Tree.full((2, 1)), None))):
            treed = specjax.load(save_drafter(
                dataclasses.replace(drafter, tree=tree, sampled_tree=sampled),
                tmp_path / f"treed-{source}-{fmt}-{i}", format=fmt))
            assert (treed.tree, treed.sampled_tree) == (tree, sampled), (source, fmt, tree)
    raw = json.loads((tmp_path / "treed-in3-eagle-0" / "config.json").read_text())
    assert raw["eagle_tree"] == {"depth": 4, "top_k": 4, "total_token": 8}
    assert raw["eagle_sampled_tree"] == [[0], [0, 0], [0, 0, 0]]
    # speculators' config states its proposal, a greedy chain of the tree's depth (vLLM's k).
    raw = json.loads((tmp_path / "treed-in3-speculators-1" / "config.json").read_text())
    assert raw["eagle_tree"] == [[0], [1], [0, 0], [1, 0]]
    proposal = raw["speculators_config"]
    assert (proposal["algorithm"], proposal["default_proposal_method"],
            proposal["proposal_methods"]) == ("eagle3", "greedy", [
                {"proposal_type": "greedy", "speculative_tokens": 2}])
    for value, words in (({"depth": 4, "top_k": 4}, "depth, top_k, total_token"),
                         ({"depth": 2, "top_k": 2, "total_token": 9}, "makes 6 nodes"),
                         ([[1]], "skips a rank"), ("4,4,8", "")):
        (tmp_path / "treed-in3-speculators-1" / "config.json").write_text(
            json.dumps(dict(raw, eagle_tree=value)))
        with pytest.raises(specjax.CheckpointError, match=f"config.json: eagle_tree: .*{words}"):
            specjax.load(tmp_path / "treed-in3-speculators-1")
    # A file's tree that would draft past the context is refused by generate, not run.
    (tmp_path / "treed-in3-speculators-1" / "config.json").write_text(
        json.dumps(dict(raw, eagle_tree={"depth": 10**6, "top_k": 10**3, "total_token": 4})))
    hostile = specjax.load(tmp_path / "treed-in3-speculators-1")
    with pytest.raises(GenerationError, match="drafts 999999000 frontier slots"):
        generate(model, [[1, 2]], method=specjax.Eagle(drafter=hostile), max_new_tokens=2)
    (tmp_path / "treed-in3-speculators-1" / "config.json").write_text(
        json.dumps(dict(raw, eagle_sampled_tree=[[0, 0]])))
    with pytest.raises(specjax.CheckpointError, match="eagle_sampled_tree: .*"):
        specjax.load(tmp_path / "treed-in3-speculators-1")
    heads = specjax.load(tmp_path / "inm")
    assert heads.tree is None                     # FasterDecoding's config names no tree
    tree = Tree.from_paths([[0], [1], [0, 0], [0, 0, 0]])
    for fmt in ("medusa", "specjax"):
        again = specjax.load(save_heads(heads, tmp_path / f"outm-{fmt}", format=fmt))
        assert again.config == heads.config and again.tree is None
        for a, b in zip(*(sorted(_leaves(h.params).items()) for h in (heads, again))):
            np.testing.assert_array_equal(a[1], b[1])
        # A tree travels with the heads: in FasterDecoding's layout as `medusa_choices`.
        treed = save_heads(dataclasses.replace(heads, tree=tree),
                                   tmp_path / f"treed-{fmt}", format=fmt)
        assert specjax.load(treed).tree == tree
    raw = json.loads((tmp_path / "treed-medusa" / "config.json").read_text())
    assert raw["medusa_choices"] == [[0], [1], [0, 0], [0, 0, 0]]
    for choices, words in (([[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]], "4 deep but there are "
                                                                     "only 3 heads"),
                           ([[1]], "skips a rank")):
        (tmp_path / "treed-medusa" / "config.json").write_text(
            json.dumps(dict(raw, medusa_choices=choices)))
        with pytest.raises(specjax.CheckpointError, match=f"medusa_choices.*{words}"):
            specjax.load(tmp_path / "treed-medusa")
    shipped = specjax.load(save_drafter(init_drafter(
        model, token_ids=np.arange(8), style="specjax"), tmp_path / "mine"))
    with pytest.raises(ValueError, match="specjax's variant"):
        save_drafter(shipped, tmp_path / "nope", format="eagle")
    with pytest.raises(ValueError, match="format must be one of"):
        save_drafter(shipped, tmp_path / "nope", format="vllm")


def _leaves(params) -> dict:
    import jax
    return {jax.tree_util.keystr(p): np.asarray(v)
            for p, v in jax.tree_util.tree_leaves_with_path(params)}


def test_loaded_published_drafters_give_the_greedy_output(target, tmp_path):
    model, _ = target
    write_eagle3(tmp_path / "e3", 11, "eagle")
    write_medusa(tmp_path / "m", 12)
    prompts = [[3, 1, 4, 1, 5], [9, 2]]
    ar = generate(model, prompts, sampling=specjax.SamplingParams(temperature=0.0),
                  max_new_tokens=12)
    for tree in (specjax.DynamicTree(3, 2, 5), Tree.full((2, 2))):
        out = generate(model, prompts,
                       method=specjax.Eagle(drafter=specjax.load(tmp_path / "e3"), tree=tree),
                       sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=12)
        assert out.tokens == ar.tokens, tree
    out = generate(model, prompts,
                   method=specjax.Medusa(heads=specjax.load(tmp_path / "m"), tree=Tree.full((2, 2))),
                   sampling=specjax.SamplingParams(temperature=0.0), max_new_tokens=12)
    assert out.tokens == ar.tokens


# -- Hostile layouts -----------------------------------------------------------------------

def test_hostile_published_layouts_are_checkpoint_errors(target, tmp_path):
    model, _ = target

    def variant(name, change=None, config=None, layout="speculators"):
        directory = tmp_path / name
        t = write_eagle3(directory, 13, layout, taps=(1, 3, 5))
        if change:
            change(t)
            save_file(t, str(directory / "model.safetensors"))
        if config:
            raw = json.loads((directory / "config.json").read_text())
            config(raw)
            (directory / "config.json").write_text(json.dumps(raw))
        return directory

    def shift(t):
        t["d2t"] = t["d2t"] + V
    cases = {
        variant("d2t", shift): "'d2t' maps draft ids outside",
        variant("t2d", lambda t: t["t2d"].__setitem__(slice(None), True)): "'t2d' disagrees",
        variant("missing", lambda t: t.pop("layers.0.hidden_norm.weight")):
            "missing tensor 'layers.0.hidden_norm.weight'",
        variant("extra", lambda t: t.update(surprise=np.zeros(2, np.float32))): "unexpected",
        variant("shape", lambda t: t.update({"fc.weight": np.zeros((D, D), np.float32)})):
            "'fc.weight' has shape",
        variant("nan", lambda t: t["norm.weight"].__setitem__(0, np.nan)): "non-finite",
        variant("type", config=lambda c: c.update(speculators_model_type="medusa")):
            "speculators_model_type 'medusa'",
        variant("option", config=lambda c: c.update(norm_before_fc=True)): "norm_before_fc",
        variant("taps", config=lambda c: c.update(eagle_aux_hidden_state_layer_ids=[3, 1])):
            "increasing",
    }
    for directory, words in cases.items():
        with pytest.raises(specjax.CheckpointError) as e:
            specjax.load(directory)
        assert str(directory) in str(e.value) and words in str(e.value), str(e.value)
    deep = specjax.load(variant("deep", config=lambda c: c.update(
        eagle_aux_hidden_state_layer_ids=[1, 3, 7])))
    with pytest.raises(GenerationError, match=r"after \[1, 3, 7\] layers"):
        generate(model, [[1, 2]], method=specjax.Eagle(drafter=deep), max_new_tokens=2)
    wide = specjax.load(variant("wide", config=lambda c: c["transformer_layer_config"].update(
        vocab_size=V + 1), change=lambda t: t.update(t2d=np.zeros(V + 1, bool)) or
        t["t2d"].__setitem__(np.arange(DRAFT_VOCAB) + t["d2t"], True)))
    with pytest.raises(GenerationError, match="vocab_size"):
        generate(model, [[1, 2]], method=specjax.Eagle(drafter=wide), max_new_tokens=2)


class _Exploit:
    def __reduce__(self):
        return (exec, ("import pathlib; pathlib.Path('PWNED').write_text('x')",))


def test_pickles_are_read_only_through_weights_only(tmp_path, monkeypatch):
    write_medusa(tmp_path / "evil", 14, pickle=True)
    torch.save({"0.0.linear.weight": _Exploit()}, tmp_path / "evil" / "medusa_lm_head.pt")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(specjax.CheckpointError, match="weights_only"):
        specjax.load(tmp_path / "evil")
    assert not (tmp_path / "PWNED").exists()
    write_eagle1(tmp_path / "plain", 15)
    monkeypatch.setitem(sys.modules, "torch", None)          # as if torch were not installed
    with pytest.raises(specjax.CheckpointError, match="never unpickles.*safetensors"):
        specjax.load(tmp_path / "plain")
