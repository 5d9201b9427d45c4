"""The offline Python API: generate with the real scheduler and an in-process worker, no services needed.

    from pagedserve import LLM, SamplingParams, WorkerConfig
    llm = LLM(WorkerConfig(model_dir="models/SmolLM2-135M-Instruct"))
    [out] = llm.generate([llm.chat_prompt("What is the capital of France?")], SamplingParams(temperature=0))
"""

from pagedserve.llm import LLM, Completion
from services.gpu_worker.worker_config import WorkerConfig
from services.scheduler.scheduler_config import SchedulerConfig
from shared.sampling_params import SamplingParams

__all__ = ["LLM", "Completion", "SamplingParams", "SchedulerConfig", "WorkerConfig"]
