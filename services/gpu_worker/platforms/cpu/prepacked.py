"""bf16 products on weights prepacked once for oneDNN (torch's mkldnn linear ops), and their row-count contract.

F.linear on a bf16 CPU tensor reorders the weight into oneDNN's blocked layout on every call; a weight packed once
(a copy beside it, for BATCH_HINT rows) skips that and gives the same oneDNN product, bit for bit. CPUs with fast
bf16 only (AVX512-BF16 or AMX).

Row-count contract: without AMX a row's outputs do not depend on how many rows share the call, from two rows up
(a lone row is computed as two by the caller). With AMX oneDNN's kernel and blocking, and so a row's last bits,
follow the row count; `prepacked_linear(..., tile)` then runs calls of exactly `tile` rows (fewer rows fill a
scratch tile, more end with an overlapping tile), so a row's numbers depend neither on its place nor on the rows
beside it. Measurements: docs/cpu.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pagedserve.services.gpu_worker.platforms.cpu.cpu_flags import cpu_has_amx, cpu_has_fast_bf16

BATCH_HINT = 64  # rows oneDNN picks its packing for (a full decode batch)
MIN_ROWS = 4  # up to this many decode rows the C few-row kernel is faster than a prepacked product
TILE_ROWS = 64  # rows per oneDNN call on AMX CPUs (tile_rows)


def supported(weight: torch.Tensor) -> bool:
    """bf16 weights on a CPU with AVX512-BF16 or AMX, and a torch built with oneDNN."""
    return (weight.dtype == torch.bfloat16 and weight.device.type == "cpu" and weight.dim() == 2
            and torch.backends.mkldnn.is_available() and cpu_has_fast_bf16())


def prepack(weight: torch.Tensor) -> torch.Tensor:
    """The weight [out, in] in oneDNN's layout (an opaque tensor for `prepacked_linear`)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, BATCH_HINT)


def tile_rows() -> int:
    """Rows per oneDNN call that keep a row's numbers independent of the row count: TILE_ROWS on AMX CPUs, else 0
    (any count: from two rows up they are)."""
    return TILE_ROWS if cpu_has_amx() else 0


def prepacked_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, tile: int = 0
                     ) -> torch.Tensor:
    """x [rows, in] @ weight.T (+ bias) through the prepacked weight; `tile` > 0: in calls of exactly that many
    rows. Fewer rows sit in a scratch tile beside stale rows, which no row's numbers depend on; more rows end with
    the last `tile` rows (overlapping the previous tile), so no rows are copied."""
    x = x.contiguous()
    rows = x.shape[0]
    if tile <= 0 or rows == tile:
        return _linear(x, packed, bias)
    if rows < tile:
        scratch = _scratch(tile, x.shape[1], x.dtype)
        scratch[:rows] = x
        return _linear(scratch, packed, bias)[:rows]
    starts = [*range(0, rows - tile, tile), rows - tile]
    outs = [_linear(x[start: start + tile], packed, bias) for start in starts]
    covered = starts[-2] + tile  # rows the tiles before the last one gave
    outs[-1] = outs[-1][covered - starts[-1]:]
    return torch.cat(outs)


_scratches: dict[tuple[int, int, torch.dtype], torch.Tensor] = {}


def _scratch(rows: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    """A [rows, width] input tile kept across calls (each call fills its own rows first)."""
    key = (rows, width, dtype)
    if key not in _scratches:
        with torch.inference_mode(False):  # a normal tensor: writable inside inference mode and out of it
            _scratches[key] = torch.zeros(rows, width, dtype=dtype)
    return _scratches[key]


def _linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def tried(weight: torch.Tensor) -> torch.Tensor:
    """prepack(weight), after checking on two rows that the packed product matches F.linear."""
    packed = prepack(weight)
    x = torch.ones(2, weight.shape[1], dtype=weight.dtype)
    if not torch.allclose(prepacked_linear(x, packed, None).float(), F.linear(x, weight).float(), rtol=1e-2,
                          atol=1e-2):
        raise RuntimeError("the prepacked oneDNN linear gave wrong numbers")
    return packed
