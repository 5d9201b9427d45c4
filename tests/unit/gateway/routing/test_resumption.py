"""Resumption over fake replicas: a request whose replica fails or drains goes on elsewhere as a continuation (no
token twice, none missing, counts right), within its budget; request errors are not resumed; span event + counter."""

from __future__ import annotations

import grpc
import grpc.aio
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from pagedserve.services.gateway.routing.replicas import ReplicaSet
from pagedserve.services.gateway.routing.resumption import ResumeBudget, generate_resuming
from pagedserve.services.gateway.routing.router import Router, RouterConfig
from pagedserve.services.gateway.routing.router_metrics import RouterMetrics
from pagedserve.shared.request_io import FinishReason, GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams
from tests.unit.gateway.fake_scheduler import FakeSchedulerClient, fake_replicas
from tests.unit.gateway.routing.test_router import rpc_error, running

PROMPT = [5, 6, 7, 8]


def make_router(replicas: ReplicaSet, max_resumes: int = 2) -> tuple[Router, RouterMetrics]:
    metrics = RouterMetrics(CollectorRegistry())
    config = RouterConfig("prefix", load_cost_tokens=128, pending_ttl_s=30, max_resumes=max_resumes)
    return Router(config, replicas, None, metrics), metrics


def request(max_tokens: int = 64) -> GenerateRequest:
    return GenerateRequest("r1", list(PROMPT), SamplingParams(max_tokens=max_tokens, temperature=0.8, seed=7))


def fakes(tokenizer, num: int = 2) -> list[FakeSchedulerClient]:
    reply = "one two three four five six seven eight nine ten"
    return [FakeSchedulerClient(tokenizer, reply, instance_id=name) for name in "abc"[:num]]


async def collect(router: Router, req: GenerateRequest) -> tuple[list, list[str]]:
    served_by: list[str] = []
    return [out async for out in generate_resuming(router, req, served_by)], served_by


def resumed(metrics: RouterMetrics, reason: str) -> float:
    return metrics.resumed.labels(reason)._value.get()


def routed_to(router: Router, exclude: tuple = ()) -> FakeSchedulerClient:
    """The replica the request goes to (without an index, prefix routing is a consistent hash of the prompt)."""
    route = router.route(request(), exclude)
    assert route is not None
    return route.replica.client


@pytest.mark.asyncio
async def test_a_replica_failing_after_k_tokens_is_resumed_elsewhere_without_a_gap_or_a_repeat(tokenizer):
    replicas_ = fakes(tokenizer)
    exporter, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with running(fake_replicas(*replicas_), 2) as replicas:
        router, metrics = make_router(replicas)
        first = routed_to(router)
        first.fail_after = (3, rpc_error(grpc.StatusCode.UNAVAILABLE, "worker lost"))
        with trace.use_span(provider.get_tracer("test").start_span("request"), end_on_exit=True):
            outputs, served_by = await collect(router, request())
    second = next(fake for fake in replicas_ if fake is not first)
    reply = first.reply_ids
    assert [t for out in outputs for t in out.new_token_ids] == reply  # each token once, in order
    assert [out.num_output_tokens for out in outputs] == list(range(1, len(reply) + 1))
    assert outputs[-1].finish_reason is FinishReason.STOP and outputs[-1].num_prompt_tokens == len(PROMPT)
    continuation = second.requests[0]
    assert continuation.resumed_output_token_ids == reply[:3] and continuation.prompt_token_ids == PROMPT
    assert continuation.sampling == request().sampling and continuation.req_id == "r1"
    assert first.requests[0].resumed_output_token_ids == []
    assert served_by == [first.instance_id, second.instance_id]
    assert resumed(metrics, "replica_failed") == 1 and resumed(metrics, "drain") == 0
    [span] = exporter.get_finished_spans()
    [event] = [e for e in span.events if e.name == "resumed"]
    assert dict(event.attributes) == {"reason": "replica_failed", "pagedserve.replica.old": first.instance_id,
                                      "pagedserve.replica.new": second.instance_id, "pagedserve.resumed_tokens": 3}


@pytest.mark.asyncio
async def test_a_failure_before_any_token_retries_with_nothing_resumed(tokenizer):
    replicas_ = fakes(tokenizer, 3)
    async with running(fake_replicas(*replicas_), 3) as replicas:
        router, metrics = make_router(replicas)
        first = routed_to(router)
        retried = routed_to(router, (replicas.replicas[first.address],))
        for fake in (first, retried):  # the router's own retry takes the first failure, resumption the second
            fake.fail_after = (0, rpc_error(grpc.StatusCode.UNAVAILABLE, "down"))
        outputs, _ = await collect(router, request())
    assert [t for out in outputs for t in out.new_token_ids] == replicas_[0].reply_ids
    assert all(r.resumed_output_token_ids == [] for fake in replicas_ for r in fake.requests)
    assert sum(len(fake.requests) for fake in replicas_) == 3 and resumed(metrics, "replica_failed") == 1


@pytest.mark.asyncio
async def test_past_its_budget_the_request_fails_with_the_replica_error(tokenizer):
    replicas_ = fakes(tokenizer, 3)
    for fake in replicas_:  # every replica fails every call after 2 tokens
        fake.fail_after = (2, rpc_error(grpc.StatusCode.UNAVAILABLE, "worker lost"))
    async with running(fake_replicas(*replicas_), 3) as replicas:
        router, metrics = make_router(replicas, max_resumes=1)
        outputs = []
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            async for out in generate_resuming(router, request(), []):
                outputs.append(out)
    assert raised.value.details() == "worker lost"
    assert [t for out in outputs for t in out.new_token_ids] == replicas_[0].reply_ids[:4]  # 2 + 2, then given up
    assert sum(len(fake.requests) for fake in replicas_) == 2 and resumed(metrics, "replica_failed") == 1


@pytest.mark.asyncio
async def test_with_no_other_replica_the_client_gets_the_replica_error(tokenizer):
    [only] = fakes(tokenizer, 1)
    only.fail_after = (2, rpc_error(grpc.StatusCode.UNAVAILABLE, "worker lost"))
    async with running(fake_replicas(only), 1) as replicas:
        router, metrics = make_router(replicas)
        with pytest.raises(grpc.aio.AioRpcError):
            await collect(router, request())
    assert len(only.requests) == 1 and resumed(metrics, "replica_failed") == 0


@pytest.mark.asyncio
@pytest.mark.parametrize("code", [grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT])
async def test_a_request_specific_error_is_not_resumed(tokenizer, code):
    replicas_ = fakes(tokenizer)
    for fake in replicas_:
        fake.fail_after = (2, rpc_error(code, "this request broke"))
    async with running(fake_replicas(*replicas_), 2) as replicas:
        router, metrics = make_router(replicas)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await collect(router, request())
    assert raised.value.code() is code
    assert sum(len(fake.requests) for fake in replicas_) == 1 and resumed(metrics, "replica_failed") == 0


@pytest.mark.asyncio
async def test_a_hand_off_resumes_elsewhere_outside_the_failure_budget(tokenizer):
    replicas_ = fakes(tokenizer)
    async with running(fake_replicas(*replicas_), 2) as replicas:
        router, metrics = make_router(replicas, max_resumes=0)
        first = routed_to(router)
        first.handoff_after = 4
        outputs, served_by = await collect(router, request())
    reply = replicas_[0].reply_ids
    assert [t for out in outputs for t in out.new_token_ids] == reply
    assert all(out.finish_reason is not FinishReason.HANDOFF for out in outputs)
    assert outputs[-1].finish_reason is FinishReason.STOP and outputs[-1].num_output_tokens == len(reply)
    assert len(served_by) == 2 and resumed(metrics, "drain") == 1 and resumed(metrics, "replica_failed") == 0
    assert first.requests[0].resumed_output_token_ids == []
    assert next(f for f in replicas_ if f is not first).requests[0].resumed_output_token_ids == reply[:4]


@pytest.mark.asyncio
async def test_hand_offs_without_progress_spend_the_failure_budget(tokenizer):
    replicas_ = fakes(tokenizer, 3)
    for fake in replicas_:
        fake.handoff_after = 0  # each takes the request and hands it straight back
    async with running(fake_replicas(*replicas_), 3) as replicas:
        router, metrics = make_router(replicas, max_resumes=1)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await collect(router, request())
    assert raised.value.code() is grpc.StatusCode.UNAVAILABLE and "draining" in raised.value.details()
    assert sum(len(fake.requests) for fake in replicas_) == 3  # the first is free, the second spends the one resume


def test_the_budget_counts_failures_and_hand_offs_that_made_no_progress():
    budget = ResumeBudget(max_resumes=1)
    assert budget.allows("drain", 0) and budget.allows("drain", 5)  # progress each time: free
    assert budget.allows("drain", 5)  # no progress: spends the one resume
    assert not budget.allows("replica_failed", 9)
    budget = ResumeBudget(max_resumes=2)
    assert budget.allows("replica_failed", 1) and budget.allows("replica_failed", 1)
    assert not budget.allows("replica_failed", 2) and budget.allows("drain", 3)
