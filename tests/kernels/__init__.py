"""Triton kernel tests against plain torch references (interpreter on CPU, native with kernels.gpu_check)."""
