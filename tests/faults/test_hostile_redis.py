"""A hostile Redis (an endless array reply) or a mute one (accepts, never answers) behind a real scheduler and
gateway: chat latency stays within 1.2x of the same stack without Redis, and neither process burns a core on it.
The stack runs without Redis and with the fake one in alternating rounds, latencies pooled per side, so the
machine's drift during the test falls on both alike."""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

import pytest

from tests.faults.hostile_redis import HostileRedis
from tests.integration.processes import wait_for
from tests.support.fault_stack import FaultStack, running_fault_stack

BODY = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0.0,
        "ignore_eos": True}
NUM_REQUESTS = 10
ROUNDS = 2
IDLE_S = 4.0
TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass
class Run:
    latencies_s: list[float]
    scheduler_cores: float  # CPU used over the requests and an idle window, per wall second
    gateway_cores: float


def cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S  # utime + stime


@pytest.fixture(scope="module")
def redis_stack(tmp_path_factory) -> FaultStack:
    with running_fault_stack(tmp_path_factory.mktemp("hostile-redis")) as running:
        yield running


def restart_with_redis(stack: FaultStack, redis_url: str | None) -> None:
    """Scheduler and gateway started again, both pointed at `redis_url` (None: no Redis at all)."""
    stack.gateway.kill()
    stack.scheduler.kill()
    flags = ["--redis-url", redis_url] if redis_url else []
    stack.scheduler.argv = stack.base_argv["scheduler"] + flags
    stack.scheduler.start()
    wait_for(stack.scheduler_ready, 120, interval_s=0.1, what="the scheduler SERVING")
    stack.gateway.argv = stack.base_argv["gateway"] + flags
    stack.gateway.start()
    stack.wait_health(200, 120)
    stack.warm_up()
    time.sleep(1.0)  # the Redis clients' first rounds are done


def measure(stack: FaultStack) -> Run:
    pids = stack.scheduler.process.pid, stack.gateway.process.pid
    cpu_before, start_s = [cpu_s(pid) for pid in pids], time.monotonic()
    latencies = []
    for _ in range(NUM_REQUESTS):
        sent_s = time.monotonic()
        response = stack.http.post("/v1/chat/completions", json=BODY)
        assert response.status_code == 200, response.text
        latencies.append(time.monotonic() - sent_s)
    time.sleep(IDLE_S)
    wall_s = time.monotonic() - start_s
    scheduler, gateway = ((cpu_s(pid) - before) / wall_s for pid, before in zip(pids, cpu_before, strict=True))
    return Run(latencies, scheduler, gateway)


def pooled_median_s(runs: list[Run]) -> float:
    return statistics.median(latency for run in runs for latency in run.latencies_s)


@pytest.mark.parametrize("mode", ["flood", "silent"])
def test_a_hostile_redis_costs_neither_latency_nor_a_core(redis_stack, mode):
    server = HostileRedis(mode).start()
    baseline: list[Run] = []
    hostile: list[Run] = []
    windows: list[tuple[int, float]] = []  # (connections made, seconds) of each hostile round
    try:
        for _ in range(ROUNDS):
            restart_with_redis(redis_stack, None)
            baseline.append(measure(redis_stack))
            restart_with_redis(redis_stack, server.url)
            connections_before, start_s = server.num_connections, time.monotonic()
            hostile.append(measure(redis_stack))
            windows.append((server.num_connections - connections_before, time.monotonic() - start_s))
    finally:
        redis_stack.gateway.kill()
        redis_stack.scheduler.kill()
        server.stop()
    report = (f"{mode}: median without Redis {pooled_median_s(baseline):.3f} s, with it {pooled_median_s(hostile):.3f}"
              f" s; baseline {baseline}, hostile {hostile}, {server.num_connections} connections")
    print(report)
    assert server.num_connections > 0, "the services never reached the fake Redis: " + report
    assert pooled_median_s(hostile) <= 1.2 * pooled_median_s(baseline), report
    for base, bad in zip(baseline, hostile, strict=True):
        assert bad.scheduler_cores <= base.scheduler_cores + 0.1, report
        assert bad.gateway_cores <= base.gateway_cores + 0.1, report
    # two clients, each at most one connection per backoff round (>= 1 s once the 2 s cap is reached)
    for connections, window_s in windows:
        assert connections <= 2 * (window_s + 4), report
