"""Per-step attention metadata, built once by the model runner and shared by every layer."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

from pagedserve.services.gpu_worker.step_rows import StepRows


@dataclass
class AttentionMetadata:
    """Describes one flattened, unpadded batch.

    Requests are ordered decodes first: the first `num_decodes` requests have exactly one query token each, the
    rest are prefill chunks of any length. Request i owns query rows [query_start_loc[i], query_start_loc[i+1])
    and its keys/values live at positions [0, seq_lens[i]) of its paged context; its query tokens are the last
    `q_len` of those positions, so token j of the chunk sits at position seq_lens[i] - q_len + j.
    """

    slot_mapping: torch.Tensor  # [T] int64: cache slot (block_id * block_size + offset) of each new token; < 0 skips
    query_start_loc: torch.Tensor  # [B + 1] int32, on the device
    seq_lens: torch.Tensor  # [B] int32, on the device: context length including this step's tokens
    block_tables: torch.Tensor  # [B, max_num_blocks] int32, on the device; padded with 0 past a request's blocks
    num_decodes: int  # requests [0, num_decodes) have one query token each
    max_query_len: int
    max_seq_len: int
    query_start_loc_cpu: list[int]  # host copies, for host-side loops and launch grids
    seq_lens_cpu: list[int]
    scratch: dict = field(default_factory=dict)  # per-step tensors a backend derives once for every layer

    @property
    def num_requests(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_decode_tokens(self) -> int:
        return self.num_decodes

    @cached_property
    def rows(self) -> StepRows:
        """The step's rows: every query row, decodes first."""
        return StepRows(self.query_start_loc_cpu[-1], self.num_decodes)
