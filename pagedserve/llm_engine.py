"""The in-process engine: the real scheduler driving an in-process worker, one step at a time.

With `async_scheduling` the engine keeps the order of calls the services' async loop has: step N+1 is scheduled
before step N's output reaches the scheduler (the worker runs the steps in order and feeds its own samples
forward), so the offline engine exercises the same protocol on the real model, deterministically.
"""

from __future__ import annotations

from pagedserve.services.gpu_worker.worker import PendingStep, Worker
from pagedserve.services.scheduler.scheduler import Scheduler, SchedulerOutput
from pagedserve.services.scheduler.scheduler_config import SchedulerConfig
from pagedserve.shared.request_io import GenerateRequest, RequestOutput


class LLMEngine:
    def __init__(self, worker: Worker, scheduler_config: SchedulerConfig, async_scheduling: bool = False) -> None:
        self.worker = worker
        self.description = worker.describe()
        self.scheduler = Scheduler(scheduler_config, self.description)
        self.async_scheduling = async_scheduling
        self._in_flight: tuple[SchedulerOutput, PendingStep] | None = None  # async: ran, output not yet applied

    def add_request(self, request: GenerateRequest) -> None:
        """Raises RequestRejected, or GrammarError for a grammar the engine refuses."""
        self.scheduler.add_request(request)
        if request.sampling.structured_output is not None:
            try:
                self.worker.prepare_grammar(request.sampling.structured_output)
            except BaseException:
                self.scheduler.abort_request(request.req_id)
                raise
            self.scheduler.grammar_ready(request.req_id)

    def abort_request(self, req_id: str) -> bool:
        return self.scheduler.abort_request(req_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or self._in_flight is not None

    def step(self) -> list[RequestOutput]:
        scheduled = self.scheduler.schedule()
        step = scheduled.step_input
        if not self.async_scheduling:
            return self.scheduler.update_from_output(scheduled, self.worker.execute_step(step))
        ran = None if step.is_empty and not step.finished_req_ids else (scheduled, self.worker.launch_step(step))
        done, self._in_flight = self._in_flight, ran  # step N's output is taken after step N+1 was launched
        return self.scheduler.update_from_output(done[0], done[1].result()) if done else []
