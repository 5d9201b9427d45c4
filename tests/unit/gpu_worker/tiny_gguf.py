"""Tiny random Llama / Qwen2 models written as GGUF files with the `gguf` package's GGUFWriter (quantized by
gguf.quants, or ggml_kquant_encoder for K-quants), as llama.cpp's converter writes them (q/k rows permuted for
llama), beside the fp32 transformers model holding the same weights dequantized: the reference."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch
import transformers
from gguf import GGMLQuantizationType as T

from tests.unit.gpu_worker import ggml_kquant_encoder as kq

_COMMON = dict(vocab_size=300, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
               num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5)
CONFIGS = {"llama": lambda: transformers.LlamaConfig(**_COMMON, tie_word_embeddings=True),
           "qwen2": lambda: transformers.Qwen2Config(**_COMMON, tie_word_embeddings=False)}
_CLASSES = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM}
_KQUANTS = {T.Q4_K: kq.quantize_q4_k, T.Q5_K: kq.quantize_q5_k, T.Q6_K: kq.quantize_q6_k}
_GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
# a Q4_K_M-like mix: the types llama.cpp's Q4_K_M gives each tensor
MIXED = {"attn_v": T.Q6_K, "ffn_down": T.Q6_K, "token_embd": T.Q8_0, "output": T.Q6_K, "": T.Q4_K}


def gguf_name(hf: str) -> str:
    if hf.startswith("model.layers."):
        layer, rest = hf.removeprefix("model.layers.").split(".", 1)
        module, kind = rest.rsplit(".", 1)
        return f"blk.{layer}.{_GGUF_NAMES[module]}.{kind}"
    return {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight"}[hf]


def quantize(w: np.ndarray, qtype: T) -> np.ndarray:
    return _KQUANTS[qtype](w) if qtype in _KQUANTS else gguf.quants.quantize(w, qtype)


def _llama_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf's q/k row order: each head's two rotary halves interleaved."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(arch: str, folder: Path, qtypes: T | dict[str, T], seed: int = 0) -> torch.nn.Module:
    """Write `folder`/model.gguf (2-D weights in `qtypes`: one type, or per GGUF tensor kind with "" the default;
    norms and biases F32) and its config.json; return the fp32 transformers model of the dequantized weights."""
    torch.manual_seed(seed)
    config = CONFIGS[arch]()
    config._attn_implementation = "eager"
    model = _CLASSES[arch](config).eval()
    writer = gguf.GGUFWriter(str(folder / "model.gguf"), arch)
    c = config
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_rope_freq_base(c.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_vocab_size(c.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    reference = {}
    with torch.no_grad():
        for name, param in model.state_dict().items():
            if name == "lm_head.weight" and c.tie_word_embeddings:
                continue
            w = param.float().numpy()
            if name.endswith("bias"):
                w = w + np.random.default_rng(seed).normal(0, 0.5, w.shape).astype(np.float32)
            kind = gguf_name(name).split(".")[-2]
            qtype = qtypes if isinstance(qtypes, T) else qtypes.get(kind, qtypes[""])
            if w.ndim == 1 or qtype == T.F32:
                stored, reference[name] = w, w
            else:
                stored = quantize(w, qtype)
                reference[name] = gguf.quants.dequantize(stored, qtype)
            if arch == "llama" and ("q_proj" in name or "k_proj" in name):
                stored = _llama_permute(stored, c.num_attention_heads if "q_proj" in name else c.num_key_value_heads)
            writer.add_tensor(gguf_name(name), stored, raw_dtype=None if stored.dtype == np.float32 else qtype)
        model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in reference.items()}, strict=False)
        if c.tie_word_embeddings:
            model.tie_weights()
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    raw = config.to_dict()
    raw.update(architectures=[type(model).__name__], dtype="float32")
    (folder / "config.json").write_text(json.dumps(raw))
    return model
