"""Which quantization a model folder's checkpoint holds: config.json's `quantization_config`, checked against
`--quantization` (vLLM's flag: it names the method the folder must hold; pagedserve does not quantize at load)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

INT4_METHODS = ("gptq", "awq")


class UnsupportedQuantizationError(ValueError):
    """A quantization_config (or --quantization) pagedserve cannot serve."""


@dataclass(frozen=True)
class QuantScheme:
    """method: "gptq" | "awq" (4-bit codes, `group` inputs per scale and zero) or "fp8" (float8_e4m3fn weights
    with per-tensor, per-channel or block scales; compressed-tensors' float-quantized format included)."""

    method: str
    bits: int = 4
    group: int = 128  # inputs per scale; -1: the whole row
    desc_act: bool = False  # GPTQ act-order: g_idx may not be i // group
    zero_offset: int = 1  # GPTQ v1 stores zero - 1; GPTQ v2 (gptq_v2 checkpoint_format) and AWQ store the zero


def read_scheme(model_dir: str | Path, requested: str | None = None) -> QuantScheme | None:
    """The folder's scheme, None for an unquantized one; UnsupportedQuantizationError for a method, format or
    bit width not served, or a `requested` method the folder does not hold."""
    path = Path(model_dir) / "config.json"
    raw = json.loads(path.read_text()).get("quantization_config") if path.is_file() else None
    if raw is None:
        if requested:
            raise UnsupportedQuantizationError(
                f"--quantization {requested}: {model_dir} holds no quantization_config; pagedserve serves "
                "checkpoints quantized ahead (GPTQ, AWQ, FP8) and does not quantize at load")
        return None
    scheme = _parse(raw)
    if requested and requested != scheme.method and not (requested == "compressed-tensors"
                                                         and raw.get("quant_method") == "compressed-tensors"):
        raise UnsupportedQuantizationError(f"--quantization {requested} does not match the checkpoint's "
                                           f"quantization_config ({raw.get('quant_method')})")
    return scheme


def _parse(raw: dict) -> QuantScheme:
    method = str(raw.get("quant_method", "")).lower()
    if method == "gptq":
        _check_int4(raw, method)
        v2 = raw.get("checkpoint_format", "gptq") == "gptq_v2"
        return QuantScheme("gptq", 4, int(raw.get("group_size", 128)), bool(raw.get("desc_act", False)),
                           0 if v2 else 1)
    if method == "awq":
        _check_int4(raw, method)
        version = str(raw.get("version", "gemm")).lower()
        if version != "gemm":
            raise UnsupportedQuantizationError(f"AWQ version {version!r} is not served (the GEMM layout is)")
        if not raw.get("zero_point", True):
            raise UnsupportedQuantizationError("AWQ without zero points is not served")
        return QuantScheme("awq", 4, int(raw.get("group_size", raw.get("q_group_size", 128))), False, 0)
    if method == "fp8":
        if raw.get("activation_scheme", "dynamic") not in ("dynamic", "static"):
            raise UnsupportedQuantizationError(f"fp8 activation_scheme {raw['activation_scheme']!r} is not served")
        return QuantScheme("fp8", 8)
    if method == "compressed-tensors":
        return _compressed_tensors(raw)
    raise UnsupportedQuantizationError(f"quantization method {method or 'missing'!r} is not served "
                                       "(gptq, awq, fp8 and compressed-tensors FP8 are)")


def _check_int4(raw: dict, method: str) -> None:
    bits = int(raw.get("bits", raw.get("w_bit", 4)))
    if bits != 4:
        raise UnsupportedQuantizationError(f"{method} with {bits}-bit weights is not served (4-bit is)")


def _compressed_tensors(raw: dict) -> QuantScheme:
    """compressed-tensors' float-quantized (W8A8) or naive-quantized format with 8-bit float weights
    (llm-compressor's FP8 schemes); activations' dynamic FP8 quantization is not applied (weights only)."""
    fmt = raw.get("format")
    groups = list((raw.get("config_groups") or {}).values())
    weights = [g.get("weights") or {} for g in groups]
    fp8 = all(w.get("type") == "float" and int(w.get("num_bits", 0)) == 8 for w in weights)
    if fmt not in ("float-quantized", "naive-quantized") or not groups or not fp8:
        described = sorted({f"{w.get('type')}{w.get('num_bits')}" for w in weights})
        raise UnsupportedQuantizationError(f"compressed-tensors format {fmt!r} with weights {described} is not "
                                           "served (float- or naive-quantized with 8-bit float weights is)")
    return QuantScheme("fp8", 8)


def has_int4_scheme(model_dir: str | Path) -> bool:
    """Whether the folder holds a GPTQ or AWQ checkpoint (False for any other, or an unreadable config)."""
    try:
        scheme = read_scheme(model_dir)
    except (UnsupportedQuantizationError, ValueError):
        return False
    return scheme is not None and scheme.method in INT4_METHODS
