"""Triton kernel tests against plain torch references (interpreter on CPU, native with TRITON_INTERPRET=0 on a GPU)."""
