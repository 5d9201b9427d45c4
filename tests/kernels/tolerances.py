"""How close a kernel's output must be to the fp32 reference, per input dtype."""

from __future__ import annotations

import torch

# The reference sees the same rounded inputs, so only the kernel's own roundings count, with u the unit roundoff
# (fp16 2**-11, bf16 2**-8): probabilities rounded to the input dtype before P @ V (<= u * max|v|, about 4.5u for
# a few hundred randn values) plus the output rounding (<= u * |out|). Hence atol ~ 6u and rtol ~ 2u.
# fp32 accumulates in fp32 with IEEE dots (no TF32), so only summation order differs: ~1e-6 seen, 1e-5 allowed.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {  # dtype -> (atol, rtol)
    torch.float32: (1e-5, 1e-5),
    torch.float16: (6 * 2**-11, 2 * 2**-11),
    torch.bfloat16: (6 * 2**-8, 2 * 2**-8),
}


def assert_close_to_ref(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """Compare a kernel output with the fp32 reference at the tolerance of the input dtype."""
    atol, rtol = TOLERANCES[dtype]
    assert out.dtype == dtype
    torch.testing.assert_close(out.float().cpu(), ref, atol=atol, rtol=rtol)
