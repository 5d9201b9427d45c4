"""The offline Python API: generate with the real scheduler and an in-process worker, no services needed.

    from pagedserve import LLM, SamplingParams, WorkerConfig
    llm = LLM(WorkerConfig(model_dir="models/SmolLM2-135M-Instruct"))
    [out] = llm.generate([llm.chat_prompt("What is the capital of France?")], SamplingParams(temperature=0))

The one top-level import name of this distribution. The repository's top-level folders are linked in (relative
symlinks, see docs/design/package-names.md) and imported only through it:
- pagedserve.services (services/): the services: gateway/, scheduler/, gpu_worker/ (one folder each); cli.py: the
  `pagedserve` command.
- pagedserve.shared (shared/): the contracts every service shares (sampling params, step and request protocol,
  config parsing).
- pagedserve.kernels (kernels/): Triton kernels for paged attention: cache write, paged decode (split-K) and paged
  prefill; cpu/: C kernels.
- pagedserve.benchmarks (benchmarks/): `pagedserve bench`: a streaming load generator and metrics reporter for
  OpenAI-compatible servers.
The names below are imported on first use, so `import pagedserve.shared.x` loads no model code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pagedserve.llm import LLM, Completion
    from pagedserve.services.gpu_worker.worker_config import WorkerConfig
    from pagedserve.services.scheduler.scheduler_config import SchedulerConfig
    from pagedserve.shared.sampling_params import SamplingParams

_EXPORTS = {
    "Completion": "pagedserve.llm",
    "LLM": "pagedserve.llm",
    "SamplingParams": "pagedserve.shared.sampling_params",
    "SchedulerConfig": "pagedserve.services.scheduler.scheduler_config",
    "WorkerConfig": "pagedserve.services.gpu_worker.worker_config",
}

__all__ = ["Completion", "LLM", "SamplingParams", "SchedulerConfig", "WorkerConfig"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
