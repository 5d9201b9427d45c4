"""Model facts read from a Hugging Face config.json: the one place that knows config field spellings."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class UnsupportedModelError(ValueError):
    """The model folder names an architecture or feature this worker cannot run."""


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    rope_type: str = "default"  # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # Qwen2, or Llama's attention_bias
    o_bias: bool  # Llama's attention_bias
    mlp_bias: bool
    qk_norm: bool  # Qwen3: RMSNorm over each head of q and k before RoPE
    sliding_window: int | None
    dtype: torch.dtype
    hidden_act: str = "silu"

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


def parse_dtype(name: str, default: torch.dtype) -> torch.dtype:
    if name in ("auto", "", None):
        return default
    if name not in _DTYPES:
        raise ValueError(f"unsupported dtype {name!r}; choose one of auto, {', '.join(_DTYPES)}")
    return _DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    """The flag name of a model or KV cache dtype (an e4m3 cache: fp8_e4m3)."""
    if dtype == torch.float8_e4m3fn:
        return "fp8_e4m3"
    return next(name for name, value in _DTYPES.items() if value == dtype)


def _rope_config(raw: dict) -> RopeConfig:
    """transformers 5 writes `rope_parameters`; older configs write `rope_theta` and `rope_scaling`."""
    params = dict(raw.get("rope_parameters") or {})
    scaling = raw.get("rope_scaling") or {}
    params = {**scaling, **params}
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type not in ("default", "linear", "llama3"):
        raise UnsupportedModelError(f"rope type {rope_type!r} is not supported (default, linear, llama3 are)")
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)),
    )


def _config_dtype(raw: dict) -> torch.dtype:
    name = raw.get("dtype") or raw.get("torch_dtype") or "float32"
    return _DTYPES.get(name, torch.float32)


def _sliding_window(raw: dict, architecture: str) -> int | None:
    window = raw.get("sliding_window")
    if architecture == "MistralForCausalLM":
        return window
    if architecture in ("Qwen2ForCausalLM", "Qwen3ForCausalLM") and raw.get("use_sliding_window"):
        raise UnsupportedModelError("Qwen sliding-window layers (use_sliding_window=true) are not supported")
    return None


def model_config_from_dict(raw: dict, dtype: str = "auto") -> ModelConfig:
    architectures = raw.get("architectures") or []
    architecture = next((a for a in architectures if a in SUPPORTED_ARCHITECTURES), None)
    if architecture is None:
        raise UnsupportedModelError(
            f"unsupported architecture {architectures or 'missing'}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    hidden_act = raw.get("hidden_act", "silu")
    if hidden_act != "silu":
        raise UnsupportedModelError(f"activation {hidden_act!r} is not supported (silu is)")
    num_heads = raw["num_attention_heads"]
    attention_bias = bool(raw.get("attention_bias", False))
    is_qwen2 = architecture == "Qwen2ForCausalLM"
    return ModelConfig(
        architecture=architecture,
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_layers=raw["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=raw.get("num_key_value_heads") or num_heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // num_heads,
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope=_rope_config(raw),
        max_position_embeddings=raw.get("max_position_embeddings", 2048),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        qkv_bias=is_qwen2 or attention_bias,
        o_bias=attention_bias and not is_qwen2,
        mlp_bias=bool(raw.get("mlp_bias", False)),
        qk_norm=architecture == "Qwen3ForCausalLM",
        sliding_window=_sliding_window(raw, architecture),
        dtype=parse_dtype(dtype, _config_dtype(raw)),
        hidden_act=hidden_act,
    )


def load_model_config(model_dir: str | Path, dtype: str = "auto") -> ModelConfig:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in model folder {model_dir}")
    return model_config_from_dict(json.loads(path.read_text()), dtype)
