"""Decode-only steps in one C call (platforms/cpu/one_call_decode.py) give the layer-by-layer path's numbers,
bit for bit, in the hidden states and in the KV cache, and are left out where a layer does not run on the C kernels."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers
from gguf import GGMLQuantizationType

from pagedserve.kernels.cpu.decode_layers import DecodeLayers
from pagedserve.services.gpu_worker.attention.backend import AttentionShape
from pagedserve.services.gpu_worker.input_batch import build_model_input
from pagedserve.services.gpu_worker.kv_cache import KVCache
from pagedserve.services.gpu_worker.layers.linear import TorchLinear
from pagedserve.services.gpu_worker.loader import load_model
from pagedserve.services.gpu_worker.model_config import load_model_config
from pagedserve.services.gpu_worker.platforms.cpu.one_call_decode import OneCallDecode, build_one_call_decode
from pagedserve.services.gpu_worker.platforms.cpu.platform import CpuPlatform
from pagedserve.services.gpu_worker.request_state import RequestState
from pagedserve.shared.sampling_params import SamplingParams
from tests.kernels.test_cpu_packed_linear import grid_weight

# head size 64 (what the C decode attention takes), sizes multiples of 32 (the grids' groups)
_SIZES = dict(vocab_size=101, hidden_size=128, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=64, max_position_embeddings=256)
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**_SIZES),
    "qwen2": lambda: transformers.Qwen2Config(**_SIZES),  # q|k|v biases
    "mistral": lambda: transformers.MistralConfig(**_SIZES, sliding_window=12),
    "qwen3": lambda: transformers.Qwen3Config(**_SIZES),  # q/k norms: not taken
}
CLASSES = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
           "mistral": transformers.MistralForCausalLM, "qwen3": transformers.Qwen3ForCausalLM}
BLOCK = 4
CHUNK_BLOCK = 16  # the C prefill attention (the batch-invariant mode's) takes blocks of multiples of 16


def _save(name: str, folder, grid: bool) -> None:
    """A random model; with `grid`, every projection on a 4-bit grid (as the default model's)."""
    torch.manual_seed(0)
    model = CLASSES[name](CONFIGS[name]())
    with torch.no_grad():
        for module_name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and grid and module_name != "lm_head":
                module.weight.copy_(grid_weight(*module.weight.shape, GGMLQuantizationType.Q4_1))
            if isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.normal_(0.0, 0.5)
    model.save_pretrained(folder)


class Paged:
    """The model over a paged cache, built as the worker builds it (C kernels), with or without the one-call path."""

    def __init__(self, folder, int8: bool, cache_dtype: torch.dtype, fused: bool, batch_invariant: bool = False,
                 block: int | None = None) -> None:
        c = self.config = load_model_config(folder, "float32")
        shape = AttentionShape(c.num_heads, c.num_kv_heads, c.head_dim, c.head_dim ** -0.5, c.sliding_window)
        self.platform = CpuPlatform(native_kernels=True, torch_compile=False, int8_activations=int8,
                                    batch_invariant=batch_invariant)
        self.block = block or (CHUNK_BLOCK if batch_invariant else BLOCK)
        self.backend = self.platform.attention_backend("torch", shape, torch.float32, cache_dtype, self.block)
        self.model = load_model(folder, c, self.backend, 256, self.platform)
        self.kv = KVCache.allocate(c, 64, self.block, torch.device("cpu"), cache_dtype)
        self.forward = self.platform.model_forward(self.model, self.backend, self.kv)
        self.one_call = self.forward if isinstance(self.forward, OneCallDecode) else None
        if not fused:
            self.forward = self.model.forward

    @torch.inference_mode()
    def step(self, states: list[RequestState], counts: list[int], skip_row: int | None = None) -> torch.Tensor:
        batch = build_model_input(states, counts, self.block, torch.device("cpu"))
        if skip_row is not None:
            batch.meta.slot_mapping[skip_row] = -1
        hidden = self.forward(batch.token_ids, batch.positions, self.kv.layers, batch.meta, None)
        for state, n in zip(states, counts, strict=True):
            state.num_computed_tokens += n
        return hidden


def _requests(lengths: list[int]) -> list[RequestState]:
    states = []
    for i, length in enumerate(lengths):
        ids = torch.randint(0, 101, (length + 8,), generator=torch.Generator().manual_seed(i)).tolist()
        state = RequestState(f"r{i}", ids, length, SamplingParams(temperature=0.0), [], 0, ())
        state.block_ids.extend(range(16 * i, 16 * i + 16))
        states.append(state)
    return states


def _run(paged: Paged, lengths: list[int], decodes: int) -> list[torch.Tensor]:
    """Prompts whole, then `decodes` decode-only steps (one of them with a skipped cache write); the hidden
    states of each decode step."""
    states = _requests(lengths)
    paged.step(states, lengths)
    return [paged.step(states, [1] * len(states), skip_row=1 if d == 1 else None) for d in range(decodes)]


@pytest.mark.parametrize("batch_invariant", [False, True])
@pytest.mark.parametrize("name", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize(("int8", "cache_dtype"), [(False, torch.float32), (True, torch.float16)])
def test_one_call_gives_the_layer_path_numbers(tmp_path, name: str, int8: bool, cache_dtype: torch.dtype,
                                               batch_invariant: bool) -> None:
    """Both attention kernels: the decode one, and (batch-invariant mode) the prefill one."""
    _save(name, tmp_path, grid=int8)
    fused, layered = (Paged(tmp_path, int8, cache_dtype, fused=f, batch_invariant=batch_invariant)
                      for f in (True, False))
    assert fused.one_call is not None
    assert (fused.one_call.layers.kernels.prefill is not None) == batch_invariant
    if int8:
        assert fused.one_call.layers.kernels.int8 is not None, "the grid weights should take int8 inputs"
    lengths = [3, 17, 9]  # past the sliding window of 12, across block edges
    for ours, theirs in zip(_run(fused, lengths, 5), _run(layered, lengths, 5), strict=True):
        assert torch.equal(ours, theirs)
    for (k1, v1), (k2, v2) in zip(fused.kv.layers, layered.kv.layers, strict=True):
        assert torch.equal(k1, k2) and torch.equal(v1, v2)


@pytest.mark.parametrize("name", ["llama", "mistral"])
def test_in_batch_invariant_mode_a_one_call_decode_gets_its_prompt_row_numbers(tmp_path, name: str) -> None:
    """The mode's promise through the one-call path: a token decoded beside others gets the numbers it gets as the
    last row of its whole prompt computed alone."""
    _save(name, tmp_path, grid=True)
    lengths = [3, 17, 9]
    decoded = Paged(tmp_path, True, torch.float16, fused=True, batch_invariant=True)
    states = _requests(lengths)
    decoded.step(states, lengths)
    hidden = decoded.step(states, [1] * len(lengths))
    for i, length in enumerate(lengths):
        alone = Paged(tmp_path, True, torch.float16, fused=True, batch_invariant=True)
        prompt = _requests(lengths)[i: i + 1]
        assert torch.equal(alone.step(prompt, [length + 1])[-1], hidden[i])


def test_the_one_call_path_runs_decode_steps_only(tmp_path, monkeypatch) -> None:
    _save("llama", tmp_path, grid=False)
    paged = Paged(tmp_path, False, torch.float32, fused=True)
    calls = []
    original = DecodeLayers.__call__
    monkeypatch.setattr(DecodeLayers, "__call__", lambda self, *a: calls.append(1) or original(self, *a))
    states = _requests([5, 6])
    paged.step(states, [5, 6])
    assert not calls  # prefill
    paged.step(states, [1, 1])
    assert len(calls) == 1


def test_q_k_norms_stay_layer_by_layer(tmp_path, caplog) -> None:
    _save("qwen3", tmp_path, grid=False)
    with caplog.at_level("INFO"):
        assert Paged(tmp_path, False, torch.float32, fused=True).one_call is None
    assert "q/k norms" in caplog.text


def test_a_projection_outside_the_c_gemms_stays_layer_by_layer(tmp_path, caplog) -> None:
    _save("llama", tmp_path, grid=False)
    paged = Paged(tmp_path, False, torch.float32, fused=False)
    down = paged.model.layers[1].mlp.down_proj
    down.kernel = TorchLinear(down.weight, down.bias)
    with caplog.at_level("INFO"):
        assert build_one_call_decode(paged.model, paged.kv, paged.backend, paged.platform.native) is None
    assert "a projection outside the C GEMMs" in caplog.text


def test_a_projection_of_another_width_than_the_shape_is_refused(tmp_path) -> None:
    """decode_layers.c sizes its scratch from the shape: a layer whose projection disagrees must not reach it."""
    _save("llama", tmp_path, grid=False)
    paged = Paged(tmp_path, False, torch.float32, fused=True)
    fused = paged.one_call.layers
    wide = dataclasses.replace(fused.layers[1], gate_up=fused.layers[1].down)
    with pytest.raises(ValueError, match="layer 1: the gate_up projection is 96 -> 128"):
        DecodeLayers(fused.kernels, fused.shape, [fused.layers[0], wide])
