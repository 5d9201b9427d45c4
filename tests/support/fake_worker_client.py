"""The worker client the engine loop talks to, over the suite's one fake worker (`tests.support.fake_worker`).

Each step runs on a `FakeWorker`, which checks the step protocol and the KV discipline and samples SAMPLED_TOKEN;
around it, this client adds what the gRPC client sees: it can restart (a new incarnation, maybe with another pool),
fail or hang its next step, fail chosen requests, gate grammar preparation, and answer probes. Steps submitted
while others are pending run after them, in order, like the worker's Steps stream; a step that fails fails every
step after it until the loop resets the stream.
"""

from __future__ import annotations

import asyncio
import dataclasses

import grpc
import grpc.aio

from pagedserve.services.scheduler.worker_monitor import WorkerProbe, WorkerStatus
from pagedserve.shared.step_protocol import FailedRequest, ModelDescription, StepInput, StepOutput
from pagedserve.shared.structured_output import StructuredOutput
from tests.support.fake_worker import FakeWorker, Mirror

SAMPLED_TOKEN = 7
DESCRIPTION = ModelDescription(model_name="fake", architecture="LlamaForCausalLM", max_model_len=256, vocab_size=100,
                                num_kv_blocks=32, block_size=4, eos_token_ids=(2,), dtype="float32", device="cpu",
                                attention_backend="torch", kv_cache_bytes=1, incarnation_id="first")


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class FakeWorkerClient:
    address = "fake-worker"
    step_timeout_s = 30.0

    def __init__(self, step_delay_s: float = 0.0) -> None:
        self.step_delay_s = step_delay_s
        self.worker = FakeWorker(DESCRIPTION, fixed_token=SAMPLED_TOKEN)
        self.steps: list[StepInput] = []
        self.fail_next_step = False
        self.num_describes = 0
        self.status = WorkerStatus.SERVING  # what probes see
        self.back = asyncio.Event()  # wait_until_ready returns once set
        self.back.set()
        self.failures: dict[str, FailedRequest] = {}  # req_id -> how the worker fails it when scheduled
        self.hang = asyncio.Event()  # steps wait while it is set (a stopped worker)
        self.hung_steps = 0
        self.num_resets = 0
        self.max_pending = 0  # the most steps ever submitted and not yet answered
        self._last: asyncio.Future | None = None  # the last step submitted on the current "stream"
        self._num_pending = 0
        self.grammar_gate: asyncio.Event | None = None  # set: PrepareGrammar waits for it (a slow compile)
        self.refused_grammars: set[str] = set()  # specs answered INVALID_ARGUMENT
        self.prepared_grammars: list[str] = []  # spec of every PrepareGrammar call

    @property
    def description(self) -> ModelDescription:
        return self.worker.description

    @property
    def mirrors(self) -> dict[str, Mirror]:
        return self.worker.mirrors

    async def prepare_grammar(self, structured: StructuredOutput) -> None:
        self.prepared_grammars.append(structured.spec)
        if self.grammar_gate is not None:
            await self.grammar_gate.wait()
        if structured.spec in self.refused_grammars:
            raise grpc.aio.AioRpcError(grpc.StatusCode.INVALID_ARGUMENT, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                       "the regex cannot be compiled: bad")

    def restart(self, **changes) -> None:
        """A new incarnation with an empty pool: every mirror is gone."""
        self.worker.restart(dataclasses.replace(self.description,
                                                incarnation_id=self.description.incarnation_id + "+", **changes))

    def submit(self, step: StepInput, step_id: int, traceparents: dict[str, str],
               step_traceparent: str = "") -> asyncio.Future:
        previous = self._last
        self._num_pending += 1
        self.max_pending = max(self.max_pending, self._num_pending)

        async def in_order() -> StepOutput:
            try:
                if previous is not None:
                    await asyncio.wait({previous})
                    if not previous.cancelled() and previous.exception() is not None:
                        raise previous.exception()  # the stream is broken
                return await self.step(step, step_id, traceparents)
            finally:
                self._num_pending -= 1

        self._last = asyncio.ensure_future(in_order())
        return self._last

    async def reset_stream(self) -> None:
        self.num_resets += 1
        self._last = None

    async def wait_until_ready(self) -> ModelDescription:
        await self.back.wait()
        self.num_describes += 1
        return self.description

    async def probe(self, timeout_s: float) -> WorkerProbe:
        if self.status is WorkerStatus.SERVING:
            return WorkerProbe(self.status, self.description)
        return WorkerProbe(self.status, detail="DEADLINE_EXCEEDED")

    async def step(self, step: StepInput, step_id: int, traceparents: dict[str, str]) -> StepOutput:
        self.steps.append(step)
        await asyncio.sleep(self.step_delay_s)
        if self.hang.is_set():
            self.hung_steps += 1
            await asyncio.Event().wait()  # never answers; the engine must give up on it
        if self.fail_next_step:
            self.fail_next_step = False
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, "connection refused")
        if step.incarnation_id != self.description.incarnation_id:
            return StepOutput(incarnation_id=self.description.incarnation_id)
        output = self.worker.execute_step(step)
        output.incarnation_id = self.description.incarnation_id
        failed = {req_id for req_id in step.num_scheduled_tokens if req_id in self.failures}
        for req_id in failed:
            output.failed.append(self.failures.pop(req_id))
            del self.mirrors[req_id]
        kept = [i for i, req_id in enumerate(output.req_ids) if req_id not in failed]
        output.req_ids = [output.req_ids[i] for i in kept]
        output.sampled_token_ids = [output.sampled_token_ids[i] for i in kept]
        output.logprobs = [output.logprobs[i] for i in kept]
        return output
