"""The in-process engine: the real scheduler driving an in-process worker, one step at a time."""

from __future__ import annotations

from services.gpu_worker.worker import Worker
from services.scheduler.scheduler import Scheduler
from services.scheduler.scheduler_config import SchedulerConfig
from shared.request_io import GenerateRequest, RequestOutput


class LLMEngine:
    def __init__(self, worker: Worker, scheduler_config: SchedulerConfig) -> None:
        self.worker = worker
        self.description = worker.describe()
        self.scheduler = Scheduler(scheduler_config, self.description)

    def add_request(self, request: GenerateRequest) -> None:
        self.scheduler.add_request(request)

    def abort_request(self, req_id: str) -> bool:
        return self.scheduler.abort_request(req_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        scheduled = self.scheduler.schedule()
        output = self.worker.execute_step(scheduled.step_input)
        return self.scheduler.update_from_output(scheduled, output)
