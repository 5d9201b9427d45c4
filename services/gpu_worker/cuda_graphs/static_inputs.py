"""The static device buffers a captured decode reads, filled by one host-to-device copy a step.

Layout for padded size B (int32, contiguous, the first B * (6 + W) elements of one buffer; W = the block table's
fixed width, max_model_len / block_size rounded up):
    [0, B)    token ids        [B, 2B)   positions      [2B, 3B)  slot mapping    [3B, 4B)  sequence lengths
    [4B, 5B)  feed rows        [5B, 6B)  feed sources   [6B, 6B + B * W)  block tables, row-major
A step fills its real rows in a pinned staging buffer; padding rows get token 0, position 0, slot -1 (the cache
write skips it), length 1 and an all-zero table row (block 0, read and never written). The feed fields say which
rows take their token from the previous step's sampled ids on the device (a token the host has not seen yet).

Two staging buffers alternate: a step writes one while the copy of the step before may still be queued on the
device from the other; an event per buffer says when its last copy has run (CUDA only).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedserve.services.gpu_worker.request_state import RequestState

NUM_FIELDS = 6


@dataclass
class DecodeViews:
    """The static tensors one graph of padded size B reads (views into the shared device buffer)."""

    token_ids: torch.Tensor  # [B]
    positions: torch.Tensor  # [B]
    slot_mapping: torch.Tensor  # [B]
    seq_lens: torch.Tensor  # [B]
    feed_rows: torch.Tensor  # [B], the first num_fed meaningful
    feed_sources: torch.Tensor  # [B]
    block_tables: torch.Tensor  # [B, W]


@dataclass
class StaticInputs:
    device_buffer: torch.Tensor  # [max_size * (NUM_FIELDS + W)] int32 on the device
    staging: list[torch.Tensor]  # two host copies of it, pinned on CUDA
    copied: list[torch.cuda.Event | None]  # per staging buffer: its last copy has run (None on CPU)
    width: int  # W
    block_size: int
    turn: int = 0

    @classmethod
    def allocate(cls, max_size: int, width: int, block_size: int, device: torch.device) -> StaticInputs:
        numel = max_size * (NUM_FIELDS + width)
        cuda = device.type == "cuda"
        staging = [torch.zeros(numel, dtype=torch.int32, pin_memory=cuda) for _ in range(2)]
        events = [torch.cuda.Event() if cuda else None for _ in range(2)]
        return cls(torch.zeros(numel, dtype=torch.int32, device=device), staging, events, width, block_size)

    def views(self, size: int) -> DecodeViews:
        b = size
        fields = [self.device_buffer[i * b: (i + 1) * b] for i in range(NUM_FIELDS)]
        tables = self.device_buffer[NUM_FIELDS * b: (NUM_FIELDS + self.width) * b].view(b, self.width)
        return DecodeViews(*fields, tables)

    def stage(self, requests: list[RequestState], size: int, previous_step: int) -> int:
        """Write one decode row per request (padded to `size`), then copy them in one transfer; returns how many
        rows take their token from the previous step's samples (`previous_step`: that step's serial)."""
        b, w, bs = size, self.width, self.block_size
        count = b * (NUM_FIELDS + w)
        staging, event = self.staging[self.turn], self.copied[self.turn]
        if event is not None:
            event.synchronize()  # its copy of two steps ago has run: the buffer may be rewritten
        host = staging[:count].numpy()
        fields = host[: NUM_FIELDS * b].reshape(NUM_FIELDS, b)
        tables = host[NUM_FIELDS * b:].reshape(b, w)
        fields[:4] = ((0,), (0,), (-1,), (1,))
        tables[:] = 0
        num_fed = 0
        for i, r in enumerate(requests):
            pos = r.num_computed_tokens
            if pos < len(r.token_ids):
                fields[0, i] = r.token_ids[pos]
            else:  # sampled by the previous step, on the device only
                fields[4, num_fed], fields[5, num_fed] = i, r.fed_row(previous_step)
                num_fed += 1
            fields[1, i] = pos
            fields[2, i] = r.block_ids[pos // bs] * bs + pos % bs
            fields[3, i] = pos + 1
            tables[i, : len(r.block_ids)] = r.block_ids
        self.device_buffer[:count].copy_(staging[:count], non_blocking=True)
        if event is not None:
            event.record()
        self.turn ^= 1
        return num_fed
