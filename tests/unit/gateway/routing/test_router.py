"""The router over fake replicas: retry once before output, never after; prefix stickiness with the index, with
pending prompts, and without Redis (consistent hash); health taking replicas out and back; DNS changes."""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc
import grpc.aio
import pytest
from prometheus_client import CollectorRegistry

from pagedserve.services.gateway.http.errors import OpenAIError, admit_after_s
from pagedserve.services.gateway.routing.prefix_mirror import InstanceView, ReplicaLoad
from pagedserve.services.gateway.routing.replica_addresses import Target
from pagedserve.services.gateway.routing.replicas import ReplicaSet
from pagedserve.services.gateway.routing.router import PendingPrefixes, Router, RouterConfig
from pagedserve.services.gateway.routing.router_metrics import RouterMetrics
from pagedserve.shared.block_hashes import prompt_block_keys
from pagedserve.shared.request_io import GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams
from tests.support.waiting import wait_for_async
from tests.unit.gateway.fake_scheduler import FakeSchedulerClient, fake_replicas


def rpc_error(code: grpc.StatusCode, details: str = "boom", **trailing: str) -> grpc.aio.AioRpcError:
    metadata = grpc.aio.Metadata(*((key.replace("_", "-"), value) for key, value in trailing.items()))
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), metadata, details)


def request(req_id: str, prompt: list[int], salt: str | None = None) -> GenerateRequest:
    return GenerateRequest(req_id, prompt, SamplingParams(max_tokens=3, temperature=0.0), salt)


class FakeMirror:
    """Stands in for PrefixMirror: views set by the test."""

    def __init__(self) -> None:
        self.views: dict[str, InstanceView] = {}
        self.connected = True

    def follow(self, instance_ids: list[str]) -> None:
        for instance_id in instance_ids:
            self.views.setdefault(instance_id, InstanceView(synced=True))

    def view(self, instance_id: str) -> InstanceView | None:
        return self.views.get(instance_id) if self.connected else None


@contextlib.asynccontextmanager
async def running(replicas: ReplicaSet, num_live: int):
    task = asyncio.create_task(replicas.run())
    try:
        await wait_for_async(lambda: len(replicas.live()) == num_live)
        yield replicas
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def make_router(replicas: ReplicaSet, policy: str = "prefix", mirror=None) -> tuple[Router, RouterMetrics]:
    metrics = RouterMetrics(CollectorRegistry())
    return Router(RouterConfig(policy, load_cost_tokens=128, pending_ttl_s=30), replicas, mirror, metrics), metrics


async def run(router: Router, req: GenerateRequest) -> tuple[list, list[str]]:
    served_by: list[str] = []
    outputs = [out async for out in router.generate(req, served_by)]
    return outputs, served_by


def sample(metric, name: str) -> float:
    return metric.labels(name)._value.get()


@pytest.mark.asyncio
async def test_a_call_failing_before_output_is_retried_once_elsewhere(tokenizer):
    a, b = FakeSchedulerClient(tokenizer, instance_id="a"), FakeSchedulerClient(tokenizer, instance_id="b")
    a.fail_before_output = rpc_error(grpc.StatusCode.UNAVAILABLE, "connection refused")
    async with running(fake_replicas(a, b, health_interval_s=10), 2) as replicas:
        router, metrics = make_router(replicas, "round-robin")
        served = [(await run(router, request(f"r{i}", [1, 2, 3])))[1] for i in range(4)]
        assert served == [["b"]] * 4  # a failed once and is out until its health check passes
        assert len(a.requests) == 1 and sample(metrics.retries, "a") == 1
        assert [r.name for r in replicas.live()] == ["b"]
        assert replicas.replicas["a:1"].num_in_flight == replicas.replicas["b:1"].num_in_flight == 0


@pytest.mark.asyncio
async def test_overload_on_every_replica_reaches_the_client_after_one_retry(tokenizer):
    a, b = FakeSchedulerClient(tokenizer, instance_id="a"), FakeSchedulerClient(tokenizer, instance_id="b")
    a.fail_before_output = b.fail_before_output = rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full")
    async with running(fake_replicas(a, b), 2) as replicas:
        router, _ = make_router(replicas, "round-robin")
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await run(router, request("r", [1, 2, 3]))
        assert raised.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert len(a.requests) + len(b.requests) == 2  # one try and one retry, no more
        assert len(replicas.live()) == 2  # overload is not a failure of the replica


@pytest.mark.asyncio
async def test_a_refusing_replica_is_passed_over_and_all_refusing_is_told_to_the_gate(tokenizer):
    a, b = FakeSchedulerClient(tokenizer, instance_id="a"), FakeSchedulerClient(tokenizer, instance_id="b")
    a.fail_before_output = rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", admit_after_ms="400")
    async with running(fake_replicas(a, b, health_interval_s=10), 2) as replicas:
        router, _ = make_router(replicas, "round-robin")
        assert router.refusing_for_s() == 0.0
        served = [(await run(router, request(f"r{i}", [1, 2, 3])))[1] for i in range(4)]
        assert served == [["b"]] * 4 and len(a.requests) == 1  # a refused once, then routing passed it over
        assert 0.3 < replicas.replicas["a:1"].refusing_until_s - time.monotonic() <= 0.4
        assert router.refusing_for_s() == 0.0  # b is open: nothing to shed
        b.fail_before_output = rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", admit_after_ms="200")
        with pytest.raises(grpc.aio.AioRpcError):
            await run(router, request("r4", [1, 2, 3]))
        assert 0.1 < router.refusing_for_s() <= 0.2  # both refuse: the shorter promise
        replicas.replicas["b:1"].refusing_until_s = 0.0
        assert router.refusing_for_s() == 0.0


@pytest.mark.parametrize("value", ["abc", "-5", "nan", "0", ""])
def test_a_bad_or_empty_refusal_window_promises_nothing(value):
    assert admit_after_s(rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, admit_after_ms=value)) == 0.0


def test_a_refusal_window_is_trusted_for_a_second_at_most():
    assert admit_after_s(rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, admit_after_ms="38")) == pytest.approx(0.038)
    assert admit_after_s(rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, admit_after_ms="1e9")) == 1.0
    assert admit_after_s(rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED)) == 0.0


@pytest.mark.asyncio
async def test_no_retry_after_output_or_for_a_bad_request(tokenizer):
    a, b = FakeSchedulerClient(tokenizer, instance_id="a"), FakeSchedulerClient(tokenizer, instance_id="b")
    async with running(fake_replicas(a, b), 2) as replicas:
        router, metrics = make_router(replicas, "round-robin")
        a.fail_after = b.fail_after = (2, rpc_error(grpc.StatusCode.UNAVAILABLE, "worker lost"))
        served_by: list[str] = []
        outputs = []
        with pytest.raises(grpc.aio.AioRpcError):
            async for out in router.generate(request("mid", [1, 2]), served_by):
                outputs.append(out)
        assert len(outputs) == 2 and len(served_by) == 1 and len(a.requests) + len(b.requests) == 1
        a.fail_after = b.fail_after = (0, rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "prompt too long"))
        with pytest.raises(grpc.aio.AioRpcError):
            await run(router, request("bad", [1, 2]))
        assert len(a.requests) + len(b.requests) == 2
        assert sample(metrics.retries, "a") == sample(metrics.retries, "b") == 0


@pytest.mark.asyncio
async def test_no_replica_is_503(tokenizer):
    a = FakeSchedulerClient(tokenizer, instance_id="a", serving=False)
    replicas = fake_replicas(a)
    await replicas.discover()
    router, _ = make_router(replicas)
    with pytest.raises(OpenAIError) as raised:
        await run(router, request("r", [1]))
    assert raised.value.status == 503
    await replicas.close()


@pytest.mark.asyncio
async def test_prefix_routing_follows_the_index_then_pending_prompts_and_counts_it(tokenizer):
    fakes = [FakeSchedulerClient(tokenizer, instance_id=name) for name in ("a", "b", "c")]
    mirror = FakeMirror()
    async with running(fake_replicas(*fakes), 3) as replicas:
        router, metrics = make_router(replicas, "prefix", mirror)
        system = list(range(100, 100 + 160))  # ten blocks of 16
        mirror.follow(["a", "b", "c"])
        mirror.views["b"].keys = set(prompt_block_keys(system + [1], 16, None)[:8])
        _, served = await run(router, request("held", system + [7, 8]))
        assert served == ["b"] and sample(metrics.prefix_hits, "b") == 1
        assert sample(metrics.predicted_cached_tokens, "b") == 128
        assert sample(metrics.cached_tokens, "b") == 0  # the fake caches nothing: predicted vs real shows it
        # a new prompt: nobody holds it; the first request's replica holds it from then on (pending), and a
        # salted copy of the same text is another prompt altogether
        other = list(range(500, 500 + 96))
        first = (await run(router, request("o0", other + [1])))[1][0]
        assert {(await run(router, request(f"o{i}", other + [i])))[1][0] for i in range(1, 6)} == {first}
        salted = {(await run(router, request(f"s{i}", other + [1], salt=f"tenant-{i}")))[1][0] for i in range(12)}
        assert len(salted) > 1  # salts hash apart, so tenants spread
        # load outweighs a prefix: b holds 8 blocks (128 tokens), worth one queued request
        mirror.views["b"].load = ReplicaLoad(num_running=3, num_waiting=0, kv_usage=0.5, updated_at_s=0)
        assert (await run(router, request("busy", system + [9])))[1] != ["b"]


@pytest.mark.asyncio
async def test_without_the_index_a_prefix_sticks_to_its_consistent_hash_owner(tokenizer):
    fakes = [FakeSchedulerClient(tokenizer, instance_id=f"r{i}") for i in range(4)]
    mirror = FakeMirror()
    mirror.connected = False  # Redis down
    async with running(fake_replicas(*fakes), 4) as replicas:
        router, metrics = make_router(replicas, "prefix", mirror)
        owners = {}
        for group in range(8):
            prompt = [group] * 40
            served = {(await run(router, request(f"g{group}-{i}", prompt + [i])))[1][0] for i in range(3)}
            assert len(served) == 1, served
            owners[group] = served.pop()
        assert len(set(owners.values())) > 1  # different prefixes spread
        assert metrics.fallbacks._value.get() == 24


@pytest.mark.asyncio
async def test_one_live_replica_is_chosen_without_hashing_or_a_fallback(tokenizer, monkeypatch):
    """A single engine (the plain `serve`, or the one replica left) pays nothing for routing."""
    import pagedserve.services.gateway.routing.router as router_module

    def no_hashing(*args, **kwargs):
        raise AssertionError("hashed a prompt with one replica to choose from")

    monkeypatch.setattr(router_module, "prompt_block_keys", no_hashing)
    monkeypatch.setattr(router_module, "block_key", no_hashing)
    mirror = FakeMirror()
    mirror.connected = False
    async with running(fake_replicas(FakeSchedulerClient(tokenizer, instance_id="only")), 1) as replicas:
        router, metrics = make_router(replicas, "prefix", mirror)
        assert (await run(router, request("r", list(range(100)))))[1] == ["only"]
        assert metrics.fallbacks._value.get() == 0 and sample(metrics.predicted_cached_tokens, "only") == 0
        assert sample(metrics.requests, "only") == 1


@pytest.mark.asyncio
async def test_health_takes_a_replica_out_and_brings_it_back(tokenizer):
    a, b = FakeSchedulerClient(tokenizer, instance_id="a"), FakeSchedulerClient(tokenizer, instance_id="b")
    async with running(fake_replicas(a, b), 2) as replicas:
        a.serving = False
        await wait_for_async(lambda: [r.name for r in replicas.live()] == ["b"], timeout_s=2)
        router, _ = make_router(replicas, "round-robin")
        assert {(await run(router, request(f"r{i}", [1])))[1][0] for i in range(4)} == {"b"}
        a.serving = True
        await wait_for_async(lambda: len(replicas.live()) == 2, timeout_s=2)


@pytest.mark.asyncio
async def test_dns_changes_add_and_retire_replicas_and_one_instance_counts_once(tokenizer):
    fakes = {f"10.0.0.{i}:50051": FakeSchedulerClient(tokenizer, instance_id=f"pod-{i}") for i in range(1, 4)}
    fakes["10.0.0.9:50051"] = FakeSchedulerClient(tokenizer, instance_id="pod-1")  # pod-1 again, another address
    answer = ["10.0.0.1:50051", "10.0.0.2:50051"]

    async def resolve(target: Target) -> list[str]:
        if answer is None:
            raise OSError("name does not resolve")
        return list(answer)

    replicas = ReplicaSet([Target("engine", 50051)], fakes.__getitem__, 0.02, 3600, resolver=resolve)
    async with running(replicas, 2):
        answer = ["10.0.0.2:50051", "10.0.0.3:50051", "10.0.0.9:50051"]
        await replicas.discover()
        await wait_for_async(lambda: sorted(r.name for r in replicas.live()) == ["pod-1", "pod-2", "pod-3"])
        answer = None  # DNS fails: the last answer stands
        await replicas.discover()
        assert len(replicas.replicas) == 3
        answer = ["10.0.0.9:50051", "10.0.0.1:50051"]  # pod-1 twice: one replica
        await replicas.discover()
        await wait_for_async(lambda: [r.name for r in replicas.live()] == ["pod-1"])


@pytest.mark.asyncio
async def test_a_replica_that_stops_answering_has_its_waiting_calls_retried_elsewhere(tokenizer):
    a, b = FakeSchedulerClient(tokenizer, instance_id="a"), FakeSchedulerClient(tokenizer, instance_id="b")
    async with running(fake_replicas(a, b), 2) as replicas:
        router, _ = make_router(replicas, "round-robin")
        a.hung = True  # routed to before the health check notices: the call waits for nothing
        results = await asyncio.wait_for(asyncio.gather(*(run(router, request(f"r{i}", [1])) for i in range(4))), 30)
        assert [served for _, served in results] == [["b"]] * 4
        assert a.num_abandons == 1 and len(a.requests) >= 1


def test_pending_prompts_expire_in_order_and_are_capped():
    pending = PendingPrefixes(max_keys=3)
    pending.add([b"a", b"b"], until_s=10, now_s=0)
    pending.add([b"c", b"d"], until_s=20, now_s=5)
    assert len(pending) == 3 and not pending.holds(b"a", 5) and pending.holds(b"b", 5)  # the oldest left early
    pending.add([b"b"], until_s=30, now_s=15)  # sent again: renewed, and the expired ones leave
    assert len(pending) == 3 and pending.holds(b"b", 25) and not pending.holds(b"c", 25)
    pending.add([b"e"], until_s=40, now_s=21)
    assert len(pending) == 2 and pending.holds(b"e", 39)
