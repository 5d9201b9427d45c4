"""Requantize a GGUF file (e.g. the default model's Q4_1) with llama.cpp's Q4_K_M type choice, metadata and
tokenizer copied: `PYTHONPATH=. python tools/requantize_q4_k_m.py in.gguf out.gguf` (from the repository root).

llama-quantize (not built by `make bench-peers-build`, which builds llama-server only) is the real tool; this
follows its rules in llama-quant.cpp: output (or a tied token_embd) Q6_K, attn_v and ffn_down Q6_K on the
use_more_bits layers, the rest Q4_K; rows that are not whole 256-blocks fall back, Q4_K -> Q5_0, Q6_K -> Q8_0
(SmolLM2-135M's 576-wide rows: most tensors end up Q5_0). K-quant blocks come from the tests' plain encoder
(round to nearest, no scale search as llama-quantize does), since the `gguf` package cannot quantize them; the
weights are the input's dequantized ones (a requantized Q4_1, not the original bf16).
"""

from __future__ import annotations

import sys
from collections import Counter

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

from tests.unit.gpu_worker import ggml_kquant_encoder as kq

_ENCODERS = {T.Q4_K: kq.quantize_q4_k, T.Q6_K: kq.quantize_q6_k}
_FALLBACK = {T.Q4_K: T.Q5_0, T.Q6_K: T.Q8_0}


def use_more_bits(layer: int, layers: int) -> bool:
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def q4_k_m_type(name: str, in_features: int, layers: int, has_output: bool) -> T:
    if name == "output.weight" or (name == "token_embd.weight" and not has_output):
        qtype = T.Q6_K
    elif name.endswith(("attn_v.weight", "ffn_down.weight")) and use_more_bits(int(name.split(".")[1]), layers):
        qtype = T.Q6_K
    else:
        qtype = T.Q4_K
    return _FALLBACK[qtype] if in_features % 256 else qtype


def requantize(source: str, target: str) -> Counter:
    reader = gguf.GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    layers = reader.fields[f"{arch}.block_count"].contents()
    writer = gguf.GGUFWriter(target, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", "general.file_type"):
            continue
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub_type)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    has_output = any(t.name == "output.weight" for t in reader.tensors)
    counts: Counter = Counter()
    for tensor in reader.tensors:
        shape = tuple(int(n) for n in reversed(tensor.shape))
        if len(shape) == 1 or tensor.tensor_type in (T.F32, T.F16):
            writer.add_tensor(tensor.name, np.array(tensor.data, dtype=np.float32).reshape(shape))
            continue
        weights = quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape).astype(np.float32)
        qtype = q4_k_m_type(tensor.name, shape[1], layers, has_output)
        encode = _ENCODERS.get(qtype, lambda w, t=qtype: quants.quantize(w, t))
        writer.add_tensor(tensor.name, encode(weights), raw_dtype=qtype)
        counts[qtype.name] += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return counts


if __name__ == "__main__":
    print(dict(requantize(sys.argv[1], sys.argv[2])))
