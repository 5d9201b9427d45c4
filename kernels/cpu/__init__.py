"""C kernels for CPU workers, compiled with the machine's C compiler when a worker starts (see build.py)."""
