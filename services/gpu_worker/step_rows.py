"""Which rows of a step's hidden states are decodes: the per-step fact that row-count-sensitive kernels read.

A step's rows are ordered decodes first (input_batch.py). Kernels whose numbers for a row depend on how many rows
share the call give decode rows the numbers a decode-only step of as many rows gives them; they learn where the
decodes end from a StepRows passed with each call, never from state kept in a layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StepRows:
    """`num_rows` rows, of which the first `num_decodes` are decodes (one-token requests); the rest prompt rows."""

    num_rows: int
    num_decodes: int

    def __post_init__(self) -> None:
        assert 0 <= self.num_decodes <= self.num_rows, self


@dataclass(frozen=True)
class KeptRows:
    """The rows of a step whose final hidden states it needs (those that sample): increasing row indices on the
    device, and their own StepRows (counted on the host, so no device sync)."""

    indices: torch.Tensor  # [S] int64, increasing
    rows: StepRows  # rows.num_rows == len(indices)
