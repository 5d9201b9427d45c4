"""bf16 projections on weights prepacked once for oneDNN (torch's mkldnn linear ops).

F.linear on a bf16 CPU tensor reorders the weight into oneDNN's blocked layout on every call; for the few rows of
a decode step that reorder costs about as much as the product. Packed once at warm-up (a copy beside each
weight), all weights of the default model's 30 layers take 15 ms for 8 rows on the Zen 4 CI machine (AVX512-BF16,
2 threads) against 28 in the C few-row kernel and F.linear, 20 ms for 16 rows (30 through F.linear) and 50 ms for
64 (76). Up to MIN_ROWS rows of a decode step the C kernel streams the weights faster (10 ms for one row against
14). The packing is for BATCH_HINT rows; every row count gives the same numbers, the same as F.linear bit for bit
(one oneDNN product), so prompt chunks of any size use it too (all weights at 512 rows: 277 ms against 293
through F.linear). CPUs with fast bf16 only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from services.gpu_worker.dtype_policy import cpu_has_fast_bf16

BATCH_HINT = 64  # rows oneDNN picks its packing for (a full decode batch)
MIN_ROWS = 4  # up to this many rows the C few-row kernel is faster (linear.py)


def supported(weight: torch.Tensor) -> bool:
    """bf16 weights on a CPU with AVX512-BF16 or AMX, and a torch built with oneDNN."""
    return (weight.dtype == torch.bfloat16 and weight.device.type == "cpu" and weight.dim() == 2
            and torch.backends.mkldnn.is_available() and cpu_has_fast_bf16())


def prepack(weight: torch.Tensor) -> torch.Tensor:
    """The weight [out, in] in oneDNN's layout (an opaque tensor for `prepacked_linear`)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, BATCH_HINT)


def prepacked_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [rows, in] @ weight.T (+ bias) through the prepacked weight."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")


def tried(weight: torch.Tensor) -> torch.Tensor:
    """prepack(weight), after checking on two rows that the packed product matches F.linear."""
    packed = prepack(weight)
    x = torch.ones(2, weight.shape[1], dtype=weight.dtype)
    if not torch.allclose(prepacked_linear(x, packed, None).float(), F.linear(x, weight).float(), rtol=1e-2,
                          atol=1e-2):
        raise RuntimeError("the prepacked oneDNN linear gave wrong numbers")
    return packed
