"""Which slice of every weight and head a tensor-parallel rank owns (Megatron-style, as vLLM splits them).

Column-parallel (split along output rows): q by heads, k and v by KV heads, gate and up by columns of the MLP.
Row-parallel (split along input columns): o_proj and down_proj; their outputs are partial sums, all-reduced, and
their biases live on rank 0 alone (zeros elsewhere) so that the sum adds them once. Embedding and output head split
by vocabulary (padded to a multiple of N with zero rows). KV heads fewer than N are replicated: each rank keeps the
one KV head its query heads read. Norms, q/k norms and rotary tables are whole on every rank.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import torch

from pagedserve.services.gpu_worker.model_config import ModelConfig, UnsupportedModelError

_COLUMN = re.compile(r"\.(q_proj|k_proj|v_proj|gate_proj|up_proj)\.(weight|bias)$")
_ROW = re.compile(r"\.(o_proj|down_proj)\.(weight|bias)$")
_VOCAB = ("model.embed_tokens.weight", "lm_head.weight")


@dataclass(frozen=True)
class ShardPlan:
    rank: int
    world_size: int
    config: ModelConfig  # the whole model's
    num_heads: int  # query heads on this rank
    num_kv_heads: int  # KV heads on this rank (1 when replicated)
    first_kv_head: int
    intermediate_size: int  # MLP columns on this rank
    vocab_per_rank: int  # padded vocabulary rows on each rank

    @classmethod
    def for_rank(cls, config: ModelConfig, rank: int, world_size: int) -> ShardPlan:
        """Raises UnsupportedModelError when the model's heads or MLP do not split over `world_size` ranks."""
        n, heads, kv = world_size, config.num_heads, config.num_kv_heads
        problems = []
        if heads % n:
            problems.append(f"{heads} attention heads")
        if kv % n and n % kv:
            problems.append(f"{kv} KV heads (neither a multiple nor a divisor of it)")
        if config.intermediate_size % n:
            problems.append(f"an MLP of {config.intermediate_size} columns")
        if problems:
            raise UnsupportedModelError(f"--tensor-parallel-size {n} does not divide {config.architecture}'s "
                                        f"{', '.join(problems)}; choose a size that does")
        local_kv = max(kv // n, 1)
        first_kv = rank * local_kv if kv >= n else rank // (n // kv)
        return cls(rank, n, config, heads // n, local_kv, first_kv, config.intermediate_size // n,
                   -(-config.vocab_size // n))

    @property
    def local_config(self) -> ModelConfig:
        """The config of this rank's part: its heads, MLP columns and vocabulary rows."""
        return replace(self.config, num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                       intermediate_size=self.intermediate_size, vocab_size=self.vocab_per_rank)

    @property
    def vocab_start(self) -> int:
        return self.rank * self.vocab_per_rank

    def take(self, name: str, tensor_slice) -> torch.Tensor:
        """This rank's part of checkpoint tensor `name`, read through a safetensors slice (only that part is read)."""
        shape = tensor_slice.get_shape()
        if name in _VOCAB:
            return self._vocab_rows(tensor_slice, shape)
        if (match := _COLUMN.search(name)) is not None:
            start, stop = self._column_rows(match.group(1))
            return tensor_slice[start:stop]
        if (match := _ROW.search(name)) is not None:
            if match.group(2) == "bias":
                return tensor_slice[:] if self.rank == 0 else torch.zeros(shape, dtype=_dtype(tensor_slice))
            size = shape[1] // self.world_size
            return tensor_slice[:, self.rank * size:(self.rank + 1) * size]
        return tensor_slice[:]

    def _column_rows(self, module: str) -> tuple[int, int]:
        d = self.config.head_dim
        if module == "q_proj":
            return self.rank * self.num_heads * d, (self.rank + 1) * self.num_heads * d
        if module in ("k_proj", "v_proj"):
            return self.first_kv_head * d, (self.first_kv_head + self.num_kv_heads) * d
        return self.rank * self.intermediate_size, (self.rank + 1) * self.intermediate_size

    def _vocab_rows(self, tensor_slice, shape: list[int]) -> torch.Tensor:
        start = min(self.vocab_start, shape[0])
        stop = min(self.vocab_start + self.vocab_per_rank, shape[0])
        rows = tensor_slice[start:stop]
        if stop - start == self.vocab_per_rank:
            return rows
        padded = torch.zeros((self.vocab_per_rank, *shape[1:]), dtype=rows.dtype)
        padded[:stop - start] = rows
        return padded


def _dtype(tensor_slice) -> torch.dtype:
    return {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}[tensor_slice.get_dtype()]
