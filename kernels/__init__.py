"""Triton kernels for paged attention: cache write, paged decode (split-K) and paged prefill; cpu/: C kernels."""
