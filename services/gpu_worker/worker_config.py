"""The gpu-worker's configuration: one frozen dataclass, filled once from CLI flags / environment."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pagedserve.shared.cli_config import check_choices
from pagedserve.shared.speculative_config import SpeculativeConfig

DtypeName = Literal["auto", "float32", "bfloat16", "float16"]
KVCacheDtypeName = Literal["auto", "float32", "bfloat16", "float16", "fp8", "fp8_e4m3"]  # fp8: e4m3, CUDA only
AttentionBackendName = Literal["auto", "torch", "triton"]
LoadFormatName = Literal["auto", "dummy"]
QuantizationName = Literal["gptq", "awq", "fp8", "compressed-tensors"]


@dataclass(frozen=True)
class WorkerConfig:
    model_dir: str  # Hugging Face model folder: config.json, *.safetensors
    load_format: LoadFormatName = "auto"  # auto (the folder's safetensors) or dummy (seeded random weights)
    quantization: QuantizationName | None = None  # vLLM's -q: the method the folder's quantization_config must hold
    model_name: str | None = field(default=None, metadata={  # vLLM's name for it: --served-model-name
        "aliases": ("--served-model-name",), "help": "the name clients send as `model`; default: the folder name"})
    dtype: DtypeName = "auto"  # auto (fp32 checkpoints: bfloat16 on fast-bf16 devices), float32, bfloat16, float16
    device: str = "auto"  # auto (cuda when available), cpu, cuda, cuda:N
    block_size: int = 16  # tokens per KV block (the unit of allocation and of prefix caching)
    kv_cache_dtype: KVCacheDtypeName = "auto"  # auto (fp16 for fp32 models on CPU, else the model's), a dtype, fp8
    kv_cache_memory_bytes: int = 4 * 1024**3  # CPU budget for the KV pool (SmolLM2-135M with fp16 KV: 186k tokens)
    gpu_memory_utilization: float = 0.85  # fraction of free GPU memory (after weights) for the KV pool
    attention_backend: AttentionBackendName = "auto"  # auto, torch, triton
    max_model_len: int | None = None  # defaults to the model's max_position_embeddings
    torch_compile: bool = True  # CPU: torch.compile decode attention and one-row matmuls (needs a C++ compiler)
    native_kernels: bool = True  # CPU: C kernels of kernels/cpu (decode attention, few-row linears), built at start
    int8_activations: bool = True  # CPU, fp32: 4- and 8-bit grid weights (GGUF blocks) multiply int8-quantized inputs
    batch_invariant: bool = False  # CPU: a request's numbers never depend on its batch, chunking or preemption
    num_threads: int | None = None  # torch intra-op threads on CPU (None: torch's default)
    enforce_eager: bool = False  # CUDA: never capture decode graphs (vLLM's --enforce-eager)
    cuda_graph_sizes: str = ""  # CUDA: padded decode sizes to capture, comma-separated ("": 1,2,4,8,...,256)
    max_num_seqs: int = 64  # running requests at most (the scheduler's limit; no decode graph past it)
    tensor_parallel_size: int = field(default=1, metadata={  # vLLM's name
        "aliases": ("-tp",), "help": "ranks the model is split over (one process a device; on CPU the threads split)"})
    distributed_timeout_s: float = 60.0  # tensor parallelism: a collective waiting longer fails the worker
    # the scheduler's flag too (`serve` gives both the one value): the worker reads a draft model's folder from it
    speculative_config: str = field(default="", metadata={"help": (
        'speculative decoding as vLLM\'s JSON (empty: off): \'{"method": "ngram", "num_speculative_tokens": 4, '
        '"prompt_lookup_min": 2, "prompt_lookup_max": 4, "disable_by_batch_size": 8}\' or \'{"method": '
        '"draft_model", "model": "DRAFT_DIR", "num_speculative_tokens": 4}\' (a small model of the same tokenizer '
        'that the worker runs beside the target; docs/speculative_decoding.md)')})

    def __post_init__(self) -> None:
        check_choices(self)
        if self.tensor_parallel_size < 1:
            raise ValueError("--tensor-parallel-size must be at least 1")
        speculative = SpeculativeConfig.from_json(self.speculative_config)  # refuses a bad one at start
        if speculative is not None and speculative.uses_draft_model and self.tensor_parallel_size > 1:
            raise ValueError("a draft model (--speculative-config) runs on one device: not with tensor parallelism")

    @property
    def draft_model_dir(self) -> str | None:
        """The draft model's folder when speculation uses one."""
        speculative = SpeculativeConfig.from_json(self.speculative_config)
        return speculative.model if speculative is not None and speculative.uses_draft_model else None
