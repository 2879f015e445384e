"""ModelConfig: the static description of a GPT-2 or Llama-family model (and of the products a
program runs it with: `Kernels`).

A config is frozen and hashable so that it can be a static argument under `jax.jit`: two
models with equal configs share compiled code. It is read from a Hugging Face `config.json`
(`ModelConfig.from_hf`) and written back (`to_hf`) when specjax saves a checkpoint.

Two architectures cover every supported `model_type`:

- ``gpt2``: learned absolute positions, LayerNorm, gelu MLP, biases everywhere.
- ``llama``: RoPE, RMSNorm, SwiGLU MLP, grouped-query attention. `mistral` (without a sliding
  window), `qwen2` (q/k/v biases) and `qwen3` (an RMSNorm over each head's queries and keys
  before RoPE, `qk_norm`; an explicit head_dim) differ from Llama only in config, so they map
  here too.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Callable, NamedTuple

ARCHITECTURES = ("gpt2", "llama")
DTYPES = ("float32", "bfloat16", "int8", "q8_0")
# The dtypes whose matrices are 8-bit (activations, cache and sums float32): "int8" multiplies
# the float32 activations by the dequantised weights; "q8_0" quantises the activations too.
EIGHT_BIT = ("int8", "q8_0")
_LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")
_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
                "gelu": "gelu", "silu": "silu", "swish": "silu"}


class Kernels(NamedTuple):
    """What a CPU plug-in provides (`specjax.kernels.plugin()`), and what a config's `kernels`
    names: each entry computes in one call what the formulation named beside it computes, and
    is called only in a program lowered for a CPU, for the calls `specjax.model.linear` (the
    one interface to it, where it is re-exported) gives it. With a stack [L, ...], `layer` ([]
    int32) is the matrix's or the cache's index in it, read in place."""
    # (x [R, I] float32, w [(L,) O, I] float32 or bfloat16, layer) -> [R, O] float32, XLA's
    # dot; differentiable.
    product: Callable
    # (x [R, I] bfloat16, w [(L,) O, I] bfloat16, layer) -> [R, O] float32: the product of two
    # bfloat16 operands, summed in pairs where the CPU has the instruction; differentiable.
    product_bf16_pairs: Callable
    # (x [R, I] float32, values [(L,) O, I] int8, scales [(L,) O, I / B] float16, layer) ->
    # [R, O] float32: `product` on the dequantised weights, bit for bit.
    product_int8: Callable
    # (x [T, I] float32, values, scales, layer) -> [T, O] float32: `q8_0_law` of x quantised.
    product_q8_0: Callable
    # (x [T, I] float32, tiles [(L,) O / 16, I / 32 * 544] int8, values, scales, layer) ->
    # [T, O] float32: `product_q8_0` on the weights in the kernel's order
    # (`quant.pack_tiles`), the same bits.
    product_q8_0_tiles: Callable
    # (q [B, T, N, H], keys [(L,) B, K, H, S], values [(L,) B, K, S, H], mask [B, T, S],
    # limit [B], layer) -> [B, T, N, H]: `layers.attend`, reading no slot at or past limit.
    attention: Callable
    # (positions [B, T] int32, inv_freq [H/2] float32) -> [2, B, T, H/2]: `layers.rope_tables`.
    rope_tables: Callable
    # (q [B, T, N, H], k [B, T, K, H], tables) -> (q, k) float32: `layers.apply_rope`.
    rope: Callable

    def __repr__(self) -> str:      # a config's repr, not six functions'
        return "Kernels(CPU plug-in)"


class ConfigError(ValueError):
    """A config.json that specjax cannot run, with the offending key and value."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    arch: str                      # "gpt2" or "llama"
    vocab_size: int                # V
    d_model: int                   # D
    n_layers: int                  # L
    n_heads: int                   # N query heads
    n_kv_heads: int                # K key/value heads (N for MHA, 1 for MQA)
    head_dim: int                  # H
    d_ff: int                      # F
    max_positions: int             # context window
    norm_eps: float
    activation: str                # "gelu_tanh", "gelu" or "silu"
    tie_embeddings: bool
    qkv_bias: bool = False         # GPT-2, Qwen2, Llama with attention_bias
    out_bias: bool = False         # GPT-2, Llama with attention_bias
    mlp_bias: bool = False         # GPT-2, Llama with mlp_bias
    qk_norm: bool = False          # Qwen3: RMSNorm of each head's q and k (weights [H]) before RoPE
    rope_theta: float = 10000.0
    # Hashable form of the rope scaling dict, e.g. (("factor", 8.0), ("rope_type", "llama3"), ...).
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    model_type: str = ""           # the original Hugging Face model_type
    # The weights' dtype: "float32", "bfloat16" (also the activations' and the cache's), "int8"
    # (8-bit matrices, `specjax.model.quant`; activations and cache float32) or "q8_0" (the
    # same matrices, each product quantising its activations too: llama.cpp's Q8_0).
    dtype: str = "float32"
    # The rows each call on a cache takes, its tokens padded up to a multiple of it (a prompt's
    # calls excepted). None: chosen by the path a program takes (`transformer.lawful`):
    # `transformer.LAW_WIDTH` where XLA's formulation runs (a GPU, a TPU, a CPU with the kernels
    # off), so that a token's logits do not depend on how many tokens share its call, and 1 (no
    # padding) on the CPU kernels' path, which has its own law. 1 turns the padding off.
    law_width: int | None = None
    # The CPU plug-in whose kernels the products, RoPE and attention of a few-token call use
    # (`Kernels`); None: XLA's formulations at every width. A program's
    # choice, not the model's: `transformer.lawful` sets it (with `law_width`) where programs
    # are built, so programs with and without the kernels have different static configs.
    kernels: Kernels | None = None

    def __post_init__(self):
        if self.arch not in ARCHITECTURES:
            raise ConfigError(f"unknown architecture {self.arch!r}; expected one of {ARCHITECTURES}")
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                     "d_ff", "max_positions"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if self.qk_norm and self.arch != "llama":
            raise ConfigError(f"qk_norm applies to the llama architecture, not {self.arch!r}")
        if self.arch == "llama" and self.head_dim % 2:
            raise ConfigError(f"RoPE needs an even head_dim, got {self.head_dim}")
        if self.law_width is not None and (not isinstance(self.law_width, int)
                                           or isinstance(self.law_width, bool)
                                           or self.law_width < 1):
            raise ConfigError(f"law_width must be a positive integer, got {self.law_width!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.kernels is not None and not isinstance(self.kernels, Kernels):
            raise ConfigError(f"kernels must be a Kernels or None, got {self.kernels!r}")

    @property
    def compute_dtype(self) -> str:
        """The activations' and the KV cache's dtype: the weights' own, float32 for 8-bit ones."""
        return "float32" if self.dtype in EIGHT_BIT else self.dtype

    @property
    def n_groups(self) -> int:
        """G = N / K: query heads that share one key/value head."""
        return self.n_heads // self.n_kv_heads

    @property
    def rope_scaling_dict(self) -> dict[str, Any] | None:
        return dict(self.rope_scaling) if self.rope_scaling else None

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    # -- Hugging Face config.json -------------------------------------------------------------

    @classmethod
    def from_hf(cls, hf: dict[str, Any], source: str = "config.json") -> "ModelConfig":
        """Builds a config from a parsed Hugging Face config.json (transformers v4 or v5)."""
        model_type = hf.get("model_type")
        eos = hf.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        common = dict(bos_token_id=hf.get("bos_token_id"), eos_token_ids=eos_ids,
                      model_type=model_type)

        def need(key):
            if hf.get(key) is None:
                raise ConfigError(f"{source}: model_type {model_type!r} needs {key!r}")
            return hf[key]

        def build(**fields):
            try:
                return cls(**fields, **common)
            except ConfigError as e:    # __post_init__ does not know which file it checks
                raise ConfigError(f"{source}: {e}") from None

        if model_type == "gpt2":
            _unsupported(hf, model_type, source)
            d = need("n_embd")
            return build(arch="gpt2", vocab_size=need("vocab_size"), d_model=d,
                         n_layers=need("n_layer"), n_heads=need("n_head"), n_kv_heads=need("n_head"),
                         head_dim=d // need("n_head"), d_ff=hf.get("n_inner") or 4 * d,
                         max_positions=need("n_positions"),
                         norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
                         activation=_activation(hf.get("activation_function", "gelu_new"), source),
                         tie_embeddings=hf.get("tie_word_embeddings", True),
                         qkv_bias=True, out_bias=True, mlp_bias=True)

        if model_type in _LLAMA_FAMILY:
            _unsupported(hf, model_type, source)
            d, n = need("hidden_size"), need("num_attention_heads")
            # transformers v5 moved rope_theta and rope_scaling into one `rope_parameters` dict.
            rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
            theta = float(rope.pop("rope_theta", hf.get("rope_theta", 10000.0)))
            rope_type = rope.get("rope_type", rope.get("type", "default"))
            scaling = _rope_scaling(rope, rope_type, source)
            attention_bias = bool(hf.get("attention_bias", False))
            return build(arch="llama", vocab_size=need("vocab_size"), d_model=d,
                         n_layers=need("num_hidden_layers"), n_heads=n,
                         n_kv_heads=hf.get("num_key_value_heads") or n,
                         head_dim=hf.get("head_dim") or d // n, d_ff=need("intermediate_size"),
                         max_positions=need("max_position_embeddings"),
                         norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
                         activation=_activation(hf.get("hidden_act", "silu"), source),
                         tie_embeddings=hf.get("tie_word_embeddings", False),
                         qkv_bias=attention_bias or model_type == "qwen2",
                         out_bias=attention_bias, mlp_bias=bool(hf.get("mlp_bias", False)),
                         qk_norm=model_type == "qwen3", rope_theta=theta, rope_scaling=scaling)

        raise ConfigError(f"{source}: unknown model_type {model_type!r}; "
                          f"supported: gpt2, {', '.join(_LLAMA_FAMILY)}")

    @classmethod
    def from_file(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        try:
            hf = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"missing {path}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path} is not valid JSON: {e}") from None
        if not isinstance(hf, dict):
            raise ConfigError(f"{path} does not hold a JSON object")
        return cls.from_hf(hf, source=str(path))

    def to_hf(self) -> dict[str, Any]:
        """The Hugging Face config.json for this config (what transformers needs to load it)."""
        eos = list(self.eos_token_ids) if len(self.eos_token_ids) != 1 else self.eos_token_ids[0]
        common = {"vocab_size": self.vocab_size, "bos_token_id": self.bos_token_id,
                  "eos_token_id": eos if self.eos_token_ids else None,
                  "tie_word_embeddings": self.tie_embeddings, "torch_dtype": "float32"}
        if self.arch == "gpt2":
            act = {"gelu_tanh": "gelu_new", "gelu": "gelu"}[self.activation]
            return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
                    "n_embd": self.d_model, "n_layer": self.n_layers, "n_head": self.n_heads,
                    "n_inner": self.d_ff, "n_positions": self.max_positions,
                    "layer_norm_epsilon": self.norm_eps, "activation_function": act, **common}
        rope = {"rope_type": "default", "rope_theta": self.rope_theta}
        rope.update(self.rope_scaling_dict or {})
        # Qwen3's q/k norms need its own model_type: no other reads them.
        family = (dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"],
                       use_sliding_window=False) if self.qk_norm
                  else dict(model_type="llama", architectures=["LlamaForCausalLM"]))
        return {**family,
                "hidden_size": self.d_model, "num_hidden_layers": self.n_layers,
                "num_attention_heads": self.n_heads, "num_key_value_heads": self.n_kv_heads,
                "head_dim": self.head_dim, "intermediate_size": self.d_ff,
                "max_position_embeddings": self.max_positions, "rms_norm_eps": self.norm_eps,
                "hidden_act": self.activation, "rope_theta": self.rope_theta,
                "rope_scaling": self.rope_scaling_dict, "rope_parameters": rope,
                "attention_bias": self.qkv_bias, "mlp_bias": self.mlp_bias, **common}


def _unsupported(hf: dict[str, Any], model_type: str, source: str) -> None:
    """Refuses the options of config.json that change the model in ways specjax does not run
    (GPT-2's attention scalings, Mistral's and Qwen's sliding windows)."""
    if model_type == "gpt2":
        if hf.get("scale_attn_by_inverse_layer_idx") or hf.get("reorder_and_upcast_attn"):
            raise ConfigError(f"{source}: scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn "
                              "are not supported")
        if hf.get("scale_attn_weights") is False:
            raise ConfigError(f"{source}: scale_attn_weights=false is not supported")
    if model_type == "mistral" and hf.get("sliding_window") is not None:
        window = hf["sliding_window"]
        if window < hf.get("max_position_embeddings", 0):
            raise ConfigError(f"{source}: mistral sliding_window={window} is not supported")
    if model_type in ("qwen2", "qwen3") and hf.get("use_sliding_window"):
        raise ConfigError(f"{source}: {model_type} use_sliding_window=true is not supported")


def _activation(name: str, source: str) -> str:
    if name not in _ACTIVATIONS:
        raise ConfigError(f"{source}: unsupported activation {name!r}; supported: {sorted(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]


def _rope_scaling(rope: dict[str, Any], rope_type: str, source: str):
    if rope_type == "default":
        return None
    if rope_type == "linear":
        keys = ("factor",)
    elif rope_type == "llama3":
        keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    else:
        raise ConfigError(f"{source}: rope scaling type {rope_type!r} is not supported "
                          "(supported: default, linear, llama3)")
    missing = [k for k in keys if k not in rope]
    if missing:
        raise ConfigError(f"{source}: rope scaling {rope_type!r} is missing {missing}")
    values = {k: float(rope[k]) for k in keys}
    if not all(math.isfinite(v) and v > 0 for v in values.values()):
        raise ConfigError(f"{source}: rope scaling values must be positive, got {values}")
    return tuple(sorted({"rope_type": rope_type, **values}.items()))
