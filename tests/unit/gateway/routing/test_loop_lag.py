"""A health check that goes unanswered while the gateway's own loop is starved does not take the replica out or
abandon its calls; the same silence with a free-running loop does."""

from __future__ import annotations

import asyncio
import time

import pytest

from pagedserve.services.gateway.routing.loop_lag import LoopLag
from pagedserve.services.gateway.routing.replicas import Health, Replica, ReplicaIdentity, ReplicaSet
from tests.support.tasks import running
from tests.support.waiting import wait_for_async
from tests.unit.gateway.fake_scheduler import DESCRIPTION


class SilentClient:
    """Health never answers: after blocking the loop (`block_s`, a starved gateway) or after waiting."""

    address = "silent:1"

    def __init__(self, block_s: float = 0.0, wait_s: float = 0.0) -> None:
        self.block_s, self.wait_s, self.num_abandons = block_s, wait_s, 0

    async def check_health(self) -> Health:
        time.sleep(self.block_s)  # the loop runs nothing meanwhile
        await asyncio.sleep(self.wait_s)
        return Health.NO_ANSWER

    def abandon_calls(self) -> None:
        self.num_abandons += 1


def serving_replica(client) -> Replica:
    return Replica(client.address, client, ReplicaIdentity("r", False), DESCRIPTION, serving=True, num_in_flight=1)


async def check_with_lag(client) -> Replica:
    replicas = ReplicaSet([], lambda address: client, health_timeout_s=1.0)
    replica = serving_replica(client)
    async with running(replicas.loop_lag.run()):
        await wait_for_async(lambda: replicas.loop_lag._last_tick_s is not None, what="the lag monitor's first tick")
        await replicas._check(replica)
    return replica


@pytest.mark.asyncio
async def test_silence_during_a_starved_loop_is_inconclusive():
    client = SilentClient(block_s=0.6)
    replica = await check_with_lag(client)
    assert replica.serving and replica.answered and client.num_abandons == 0


@pytest.mark.asyncio
async def test_silence_with_a_free_loop_takes_the_replica_out():
    client = SilentClient(wait_s=0.6)
    replica = await check_with_lag(client)
    assert not replica.serving and not replica.answered and client.num_abandons == 1


def test_loop_lag_reports_past_and_ongoing_stalls():
    lag = LoopLag(tick_s=0.05)
    assert lag.worst_since(0.0, now_s=100.0) == 0.0  # not running: nothing measured
    lag._last_tick_s = 10.0
    lag.note_tick(10.05)  # on time
    lag.note_tick(10.60)  # 0.5 s late
    assert lag.worst_since(10.0, now_s=10.62) == pytest.approx(0.5)
    assert lag.worst_since(10.61, now_s=10.64) == 0.0  # that stall ended before
    assert lag.worst_since(10.7, now_s=12.0) == pytest.approx(1.35)  # one under way now
