"""torch.compile for the worker's CPU hot spots, with room for the graphs a process needs."""

from __future__ import annotations

from collections.abc import Callable

import torch

RECOMPILE_LIMIT = 64


def compile_function(fn: Callable, **options) -> Callable:
    """torch.compile(fn, **options) after raising dynamo's per-function graph limit (default 8) to 64.

    Sizes of 1 specialise and each weight shape or dtype is a graph of its own, so a process that builds several
    models (tests, benchmarks) would otherwise hit the limit: eager fall-back, or an error with fullgraph=True.
    """
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    return torch.compile(fn, **options)
