"""The gateway's live set of engine replicas: addresses (re-resolved), health, identity and model of each.

A replica is one scheduler (with its worker) at one address. Each has a health task polling gRPC health every
`health_interval_s` (a check unanswered within the client's health timeout counts as down), so a dead or hung
replica is out within interval + timeout, and comes back at the first SERVING answer (its identity and model are
read again then: a restarted scheduler may be another instance). A failed call marks it down at once
(`mark_failed`). A replica that stops answering also has its open calls abandoned (they fail as UNAVAILABLE, so
none waits on it forever); one that answers NOT_SERVING (draining, say) keeps them: it is finishing them.
A check unanswered while this gateway's own event loop stalled (for STARVED_FRACTION of the health timeout or
more) proves nothing about the replica: it is ignored, and the next poll judges.
DNS names are re-resolved every `resolve_interval_s`; a vanished address leaves routing at once and its channel
is closed once its last call ended. A name that fails to resolve keeps its last addresses.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from pagedserve.services.gateway.routing.loop_lag import LoopLag
from pagedserve.services.gateway.routing.replica_addresses import Target, resolve
from pagedserve.shared.request_io import GenerateRequest, RequestOutput
from pagedserve.shared.scheduler_stats import SchedulerStats
from pagedserve.shared.step_protocol import ModelDescription

log = logging.getLogger(__name__)

STARVED_FRACTION = 0.25  # a loop stall this fraction of the health timeout makes an unanswered check inconclusive


@dataclass(frozen=True)
class ReplicaIdentity:
    instance_id: str  # the scheduler's --instance-id: its label in metrics and headers, its Redis namespace
    publishes_prefix_blocks: bool  # its prefix-cache index is in Redis


class Health(enum.Enum):
    SERVING = "serving"
    NOT_SERVING = "not_serving"  # it answered: up, but not taking requests (starting, worker lost, draining)
    NO_ANSWER = "no_answer"  # unreachable, or no answer within the health timeout (dead or hung)


class SchedulerLink(Protocol):
    """What the gateway calls on one scheduler (SchedulerClient; fakes in tests)."""

    address: str

    def connect(self) -> None: ...
    def generate(self, request: GenerateRequest) -> AsyncIterator[RequestOutput]: ...
    async def check_health(self) -> Health: ...
    def abandon_calls(self) -> None: ...
    async def identify(self) -> ReplicaIdentity: ...
    async def describe(self) -> ModelDescription: ...
    async def get_stats(self) -> SchedulerStats: ...
    async def close(self) -> None: ...


@dataclass
class Replica:
    address: str
    client: SchedulerLink
    identity: ReplicaIdentity | None = None
    model: ModelDescription | None = None
    serving: bool = False  # the last health check (or call) found it SERVING
    num_in_flight: int = 0  # this gateway's Generate calls open on it
    answered: bool = True  # its last health check got an answer
    refusing_until_s: float = 0.0  # time.monotonic() until which it said it refuses arrivals (overloaded)
    task: asyncio.Task | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.identity.instance_id if self.identity else self.address

    @property
    def routable(self) -> bool:
        return self.serving and self.identity is not None and self.model is not None


Resolver = Callable[[Target], Awaitable[list[str]]]


class ReplicaSet:
    def __init__(self, targets: list[Target], make_client: Callable[[str], SchedulerLink],
                 health_interval_s: float = 1.0, resolve_interval_s: float = 5.0,
                 resolver: Resolver = resolve, health_timeout_s: float = 2.0) -> None:
        self.targets = targets
        self.health_timeout_s = health_timeout_s
        self.loop_lag = LoopLag()
        self._make_client = make_client
        self.health_interval_s = health_interval_s
        self.resolve_interval_s = resolve_interval_s
        self._resolver = resolver
        self.replicas: dict[str, Replica] = {}  # address -> replica, in discovery order
        self._addresses_of: dict[Target, list[str]] = {}  # the last good resolution of each target
        self._retiring: list[Replica] = []  # gone from DNS, closed once their calls ended
        self.model: ModelDescription | None = None  # the served model: the first ready replica's
        self._resolve_failed: set[Target] = set()

    def live(self) -> list[Replica]:
        """Routable replicas, one per instance (a scheduler reached at two addresses counts once)."""
        seen: set[str] = set()
        live = []
        for replica in self.replicas.values():
            if replica.routable and replica.name not in seen:
                seen.add(replica.name)
                live.append(replica)
        return live

    @property
    def ready(self) -> bool:
        return any(replica.routable for replica in self.replicas.values())

    def mark_failed(self, replica: Replica, why: str) -> None:
        """A call found the replica unavailable: out of routing until a health check says SERVING again."""
        if replica.serving:
            log.warning("replica %s at %s failed a call (%s): out until healthy", replica.name, replica.address, why)
        replica.serving = False

    async def run(self) -> None:
        """Resolve the targets now and every resolve_interval_s; each replica's health task and the loop-lag
        sampler run beside."""
        lag_task = asyncio.create_task(self.loop_lag.run(), name="loop-lag")
        try:
            while True:
                await self.discover()
                await asyncio.sleep(self.resolve_interval_s)
        finally:
            lag_task.cancel()
            await self.close()

    async def check_now(self) -> None:
        """Check every replica that is out of routing at once (as its health task would at its next poll)."""
        await asyncio.gather(*(self._check(r) for r in list(self.replicas.values()) if not r.routable))

    async def discover(self) -> None:
        """Resolve the targets; start watching new addresses, retire vanished ones."""
        addresses: list[str] = []
        for target in self.targets:
            for address in await self._resolve(target):
                if address not in addresses:
                    addresses.append(address)
        for address in addresses:
            if address not in self.replicas:
                self._add(address)
        for address in [a for a in self.replicas if a not in addresses]:
            self._retire(self.replicas.pop(address))
        await self._close_retired()

    async def _resolve(self, target: Target) -> list[str]:
        try:
            addresses = await self._resolver(target)
        except OSError as exc:
            if target not in self._resolve_failed:
                log.warning("cannot resolve scheduler %s:%d (%s): keeping %d known addresses", target.host,
                            target.port, exc, len(self._addresses_of.get(target, [])))
                self._resolve_failed.add(target)
            return self._addresses_of.get(target, [])
        self._resolve_failed.discard(target)
        self._addresses_of[target] = addresses
        return addresses

    def _add(self, address: str) -> None:
        client = self._make_client(address)
        client.connect()
        replica = Replica(address, client)
        replica.task = asyncio.create_task(self._watch(replica), name=f"health-{address}")
        self.replicas[address] = replica
        log.info("scheduler address %s found", address)

    def _retire(self, replica: Replica) -> None:
        log.info("scheduler address %s (%s) is gone from DNS", replica.address, replica.name)
        replica.serving = False
        if replica.task is not None:
            replica.task.cancel()
        self._retiring.append(replica)

    async def _close_retired(self) -> None:
        for replica in [r for r in self._retiring if r.num_in_flight == 0]:
            self._retiring.remove(replica)
            await replica.client.close()

    async def _watch(self, replica: Replica) -> None:
        while True:
            await self._check(replica)
            await asyncio.sleep(self.health_interval_s)

    async def _check(self, replica: Replica) -> None:
        started_s = time.monotonic()
        health = await replica.client.check_health()
        if health is Health.NO_ANSWER and self._starved_since(started_s):
            return
        serving = health is Health.SERVING
        if serving and not replica.serving:
            serving = await self._introduce(replica)
        elif not serving and replica.serving:
            log.warning("replica %s at %s: %s, out of routing", replica.name, replica.address, health.value)
        if health is Health.NO_ANSWER and replica.answered and replica.num_in_flight:
            log.warning("replica %s at %s stopped answering: abandoning its %d open calls", replica.name,
                        replica.address, replica.num_in_flight)
            replica.client.abandon_calls()
        replica.answered = health is not Health.NO_ANSWER
        replica.serving = serving

    def _starved_since(self, started_s: float) -> bool:
        stall_s = self.loop_lag.worst_since(started_s)
        if stall_s < STARVED_FRACTION * self.health_timeout_s:
            return False
        log.warning("a health check went unanswered while this gateway's event loop stalled %.2f s: ignored",
                    stall_s)
        return True

    async def _introduce(self, replica: Replica) -> bool:
        """Read who a replica that turned SERVING is, and whether it serves our model; False to keep it out."""
        try:
            replica.identity = await replica.client.identify()
            replica.model = await replica.client.describe()
        except Exception as exc:  # retried at the next health check
            log.warning("replica at %s answered health but not identify/describe: %s", replica.address, exc)
            return False
        if self.model is not None and replica.model.model_name != self.model.model_name:
            log.error("replica %s at %s serves %s, not %s: left out", replica.name, replica.address,
                      replica.model.model_name, self.model.model_name)
            return False
        self.model = replica.model  # the latest facts: a worker restarted behind it may serve another context
        log.info("replica %s at %s ready: %s (context %d, blocks of %d)", replica.name, replica.address,
                 replica.model.model_name, replica.model.max_model_len, replica.model.block_size)
        return True

    async def close(self) -> None:
        replicas = [*self.replicas.values(), *self._retiring]
        for replica in replicas:
            if replica.task is not None:
                replica.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await replica.task
        for replica in replicas:
            await replica.client.close()
        self.replicas.clear()
        self._retiring.clear()
