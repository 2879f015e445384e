"""Loading errors name the file and the tensor; configs are read from Hugging Face config.json."""

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import specjax
from specjax import CheckpointError, ModelConfig
from specjax.model.config import ConfigError
from tests.support.hf_models import tiny_gpt2, tiny_llama

# In the fast tier, every test of this module (tests/conftest.py, docs/tests.md).
pytestmark = pytest.mark.fast


@pytest.fixture
def llama_dir(tmp_path):
    tiny_llama(tmp_path, kv_heads=2)
    return tmp_path


def rewrite_weights(directory, change):
    path = directory / "model.safetensors"
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path)


def test_missing_directory(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist") as info:
        specjax.load(tmp_path / "nope")
    assert "nope" in str(info.value)


def test_missing_config(llama_dir):
    (llama_dir / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json"):
        specjax.load(llama_dir)


def test_missing_weights(llama_dir):
    (llama_dir / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        specjax.load(llama_dir)


def test_unknown_model_type(llama_dir):
    config = json.loads((llama_dir / "config.json").read_text())
    config["model_type"] = "mamba"
    (llama_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="unknown model_type 'mamba'"):
        specjax.load(llama_dir)


def test_missing_tensor_is_named(llama_dir):
    rewrite_weights(llama_dir, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match="missing tensor 'model.layers.1.mlp.up_proj.weight'"):
        specjax.load(llama_dir)


def test_unexpected_tensor_is_named(llama_dir):
    rewrite_weights(llama_dir, lambda t: t.update({"model.extra.weight": np.zeros(3, np.float32)}))
    with pytest.raises(CheckpointError, match="model.extra.weight") as info:
        specjax.load(llama_dir)
    assert "model.safetensors" in str(info.value)


def test_wrong_shape_is_named(llama_dir):
    def shrink(t):
        t["model.layers.0.self_attn.k_proj.weight"] = t["model.layers.0.self_attn.k_proj.weight"][:8]
    rewrite_weights(llama_dir, shrink)
    with pytest.raises(CheckpointError, match=r"'model.layers.0.self_attn.k_proj.weight' has shape \(8, 32\)"):
        specjax.load(llama_dir)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_safetensors_is_named(llama_dir, damage):
    path = llama_dir / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes({"truncate": data[: len(data) // 2], "garbage": b"\x07" * 100,
                      "empty": b""}[damage])
    with pytest.raises(CheckpointError, match="corrupt or unreadable") as info:
        specjax.load(llama_dir)
    assert "model.safetensors" in str(info.value)


def test_sharded_checkpoint_loads_and_missing_shard_is_named(tmp_path):
    tiny_llama(tmp_path / "one")
    tensors = load_file(tmp_path / "one" / "model.safetensors")
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_text((tmp_path / "one" / "config.json").read_text())
    names = sorted(tensors)
    weight_map = {}
    for i, part in enumerate((names[::2], names[1::2])):
        file = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, sharded / file)
        weight_map.update({n: file for n in part})
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    one, two = specjax.load(tmp_path / "one"), specjax.load(sharded)
    tokens, positions = np.array([[1, 2, 3]]), np.array([[0, 1, 2]])
    np.testing.assert_array_equal(np.asarray(specjax.forward(one.params, one.config, tokens, positions)[0]),
                                  np.asarray(specjax.forward(two.params, two.config, tokens, positions)[0]))
    (sharded / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors"):
        specjax.load(sharded)


def test_gpt2_without_transformer_prefix_and_with_buffers(tmp_path):
    # The original openai-community/gpt2 upload has no "transformer." prefix and carries the
    # attention-mask buffers; both must load.
    tiny_gpt2(tmp_path)
    def strip(t):
        for name in list(t):
            if name.startswith("transformer."):
                t[name[len("transformer."):]] = t.pop(name)
        t["h.0.attn.bias"] = np.ones((1, 1, 4, 4), np.float32)
    rewrite_weights(tmp_path, strip)
    model = specjax.load(tmp_path)
    assert model.config.arch == "gpt2"


def test_bad_tokenizer_is_named(llama_dir):
    (llama_dir / "tokenizer.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="tokenizer.json"):
        specjax.load(llama_dir)


@pytest.mark.parametrize("change, needle", [
    ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4}}, "'yarn'"),
    ({"model_type": "mistral", "sliding_window": 16}, "sliding_window=16"),
    ({"num_key_value_heads": 3}, "n_kv_heads=3"),
    ({"hidden_act": "relu2"}, "'relu2'"),
])
def test_unsupported_configs_are_named(change, needle):
    base = {"model_type": "llama", "vocab_size": 10, "hidden_size": 16, "num_hidden_layers": 1,
            "num_attention_heads": 4, "intermediate_size": 32, "max_position_embeddings": 64}
    with pytest.raises(ConfigError) as info:
        ModelConfig.from_hf({**base, **change})
    assert needle in str(info.value)


def test_config_is_hashable_and_round_trips_through_hf():
    config = ModelConfig.from_hf({
        "model_type": "llama", "vocab_size": 10, "hidden_size": 16, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 32,
        "max_position_embeddings": 64,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
        "rope_theta": 500000.0})
    assert hash(config) == hash(ModelConfig.from_hf(config.to_hf()))
    assert config == ModelConfig.from_hf(config.to_hf())
    assert config.rope_theta == 500000.0 and config.rope_scaling_dict["factor"] == 8.0
