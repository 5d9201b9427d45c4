"""Drive a real Scheduler against the FakeWorker, one engine step at a time, collecting what streams back.

Also the two halves of an admission for tests that drive a KVCacheManager without a scheduler (`admit`, `compute`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedserve.services.scheduler.kv_cache_manager import KVCacheManager
from pagedserve.services.scheduler.request import Request
from pagedserve.services.scheduler.scheduler import Scheduler, SchedulerOutput
from pagedserve.services.scheduler.scheduler_config import SchedulerConfig
from pagedserve.shared.request_io import FinishReason, GenerateRequest, RequestOutput
from pagedserve.shared.sampling_params import SamplingParams
from pagedserve.shared.step_protocol import ModelDescription, StepOutput
from tests.support.fake_worker import FakeWorker, describe


def make_config(**overrides) -> SchedulerConfig:
    """No watermark and no finish slack unless asked for, so that tests can count blocks and chunks exactly."""
    overrides.setdefault("watermark", 0.0)
    overrides.setdefault("prefill_finish_slack", 0)
    return SchedulerConfig(**overrides)


def req_ids(requests) -> list[str]:
    return [r.req_id for r in requests]


def gen(req_id: str, prompt: list[int], salt: str | None = None, **sampling) -> GenerateRequest:
    sampling.setdefault("max_tokens", 4)
    return GenerateRequest(req_id, list(prompt), SamplingParams(**sampling), cache_salt=salt, arrival_time_s=0.0)


@dataclass
class Stream:
    """Everything one request streamed back, as the engine loop would hand it to the gateway."""

    token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    outputs: list[RequestOutput] = field(default_factory=list)


class Harness:
    def __init__(self, config: SchedulerConfig | None = None, description: ModelDescription | None = None,
                 eos_prob: float = 0.0, scripts: dict[str, list[int]] | None = None) -> None:
        self.description = description or describe()
        self.scheduler = Scheduler(config or SchedulerConfig(), self.description)
        self.worker = FakeWorker(self.description, eos_prob=eos_prob, scripts=scripts)
        self.streams: dict[str, Stream] = {}

    @property
    def kv(self) -> KVCacheManager:
        return self.scheduler.kv

    def add(self, request: GenerateRequest) -> None:
        self.scheduler.add_request(request)
        self.streams[request.req_id] = Stream()

    def schedule(self) -> SchedulerOutput:
        return self.scheduler.schedule()

    def finish_step(self, scheduled: SchedulerOutput) -> list[RequestOutput]:
        """Run a scheduled step on the worker and feed the result back (split so tests can act in between)."""
        return self.feed(scheduled, self.worker.execute_step(scheduled.step_input))

    def feed(self, scheduled: SchedulerOutput, step_output: StepOutput) -> list[RequestOutput]:
        outputs = self.scheduler.update_from_output(scheduled, step_output)
        for out in outputs:
            stream = self.streams[out.req_id]
            assert stream.finish_reason is None, f"{out.req_id} streamed after it finished"
            stream.token_ids.extend(out.new_token_ids)
            stream.finish_reason = out.finish_reason
            stream.outputs.append(out)
        return outputs

    def step(self) -> tuple[SchedulerOutput, list[RequestOutput]]:
        scheduled = self.schedule()
        return scheduled, self.finish_step(scheduled)

    def run(self, max_steps: int = 1000) -> int:
        """Step until nothing is left (and the worker was told about every finish); returns the steps taken."""
        for num_steps in range(max_steps):
            if not (self.scheduler.has_unfinished_requests() or self.scheduler.finished_req_ids):
                return num_steps
            self.step()
        raise AssertionError(f"requests still unfinished after {max_steps} steps: "
                             f"waiting {[r.req_id for r in self.scheduler.waiting]}, "
                             f"running {[r.req_id for r in self.scheduler.running]}")

    def abort(self, req_id: str) -> bool:
        aborted = self.scheduler.abort_request(req_id)
        if aborted:
            self.streams[req_id].finish_reason = FinishReason.ABORT
        return aborted


def make_request(req_id: str, prompt: list[int], salt: str | None = None, **sampling) -> Request:
    return Request.from_generate(gen(req_id, prompt, salt, **sampling))


def admit(kv: KVCacheManager, request: Request, num_new: int | None = None, watermark: bool = True) -> list[int]:
    """What the scheduler does for an admission: prefix lookup, slots for the rest (or `num_new`), count it."""
    prefix = kv.find_prefix(request)
    num_hit = prefix.num_tokens(kv.block_size)
    num_new = request.num_tokens - num_hit if num_new is None else num_new
    appended = kv.allocate_slots(request, num_new, prefix, admission=watermark)
    assert appended is not None, f"no room for {request.req_id}"
    kv.record_prefix_query(request.num_tokens, prefix)
    request.num_computed_tokens = num_hit
    return appended


def compute(kv: KVCacheManager, request: Request, num_tokens: int) -> None:
    """What update_from_output does once the worker computed `num_tokens` more tokens."""
    request.num_computed_tokens += num_tokens
    kv.cache_full_blocks(request)
