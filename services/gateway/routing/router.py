"""Send each scheduler request to a replica (routing.py decides which) and retry once elsewhere before output.

A call that fails before its first output with a status another replica may not share (unavailable, overloaded,
internal) is retried once on another live replica; UNAVAILABLE also takes the replica out until its health
check passes. An overloaded replica's refusal says how long it will refuse arrivals (`admit-after-ms`, at most a
second): until then routing passes it over while another is open, and `refusing_for_s` tells the gateway's
admission gate to shed arrivals before reading them when every replica refuses. Once output has been streamed,
errors go up as they are: resumption.py resumes the request elsewhere when the replica failed, else the stream
ends with an error event and [DONE]. The router never touches
Redis: it reads the PrefixMirror's memory.
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator
from dataclasses import dataclass

import grpc
import grpc.aio

from pagedserve.services.gateway.http.errors import OpenAIError, admit_after_s
from pagedserve.services.gateway.routing.policy import (
    Candidate,
    Choice,
    Route,
    RoutingPolicy,
    choose_by_prefix,
    choose_least_load,
    choose_round_robin,
    rendezvous_ranks,
)
from pagedserve.services.gateway.routing.prefix_mirror import PrefixMirror
from pagedserve.services.gateway.routing.replicas import Replica, ReplicaSet
from pagedserve.services.gateway.routing.router_metrics import RouterMetrics
from pagedserve.shared.block_hashes import ROOT_KEY, block_key, prompt_block_keys
from pagedserve.shared.request_io import GenerateRequest, RequestOutput

RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNKNOWN,
                       grpc.StatusCode.INTERNAL, grpc.StatusCode.ABORTED})
_PENDING_MAX_KEYS = 200_000  # pending keys kept per replica (about 3,000 prompts of 1,000 tokens)


@dataclass(frozen=True)
class RouterConfig:
    policy: RoutingPolicy = "prefix"
    load_cost_tokens: int = 128  # W in routing.py: prompt tokens one queued request is worth
    pending_ttl_s: float = 10.0  # a prompt sent to a replica counts as cached there this long (until published)
    max_resumes: int = 2  # replica failures a request may be resumed from (resumption.py)


class PendingPrefixes:
    """Blocks of prompts sent to one replica recently: cached there soon, before its index says so.

    Keys are kept in insertion order, which is expiry order (one TTL for all), so expired ones leave from the front
    in amortized O(1); past `max_keys` the oldest leave early."""

    def __init__(self, max_keys: int = _PENDING_MAX_KEYS) -> None:
        self._expiry_s: OrderedDict[bytes, float] = OrderedDict()
        self._max_keys = max_keys

    def __len__(self) -> int:
        return len(self._expiry_s)

    def add(self, keys: list[bytes], until_s: float, now_s: float) -> None:
        expiry = self._expiry_s
        for key in keys:
            expiry[key] = until_s
            expiry.move_to_end(key)
        while expiry and (len(expiry) > self._max_keys or next(iter(expiry.values())) <= now_s):
            expiry.popitem(last=False)

    def holds(self, key: bytes, now_s: float) -> bool:
        return self._expiry_s.get(key, 0.0) > now_s


class Router:
    def __init__(self, config: RouterConfig, replicas: ReplicaSet, mirror: PrefixMirror | None,
                 metrics: RouterMetrics) -> None:
        self.config = config
        self.replicas = replicas
        self.mirror = mirror
        self.metrics = metrics
        self._turn = 0
        self._pending: dict[str, PendingPrefixes] = {}  # replica name -> its pending prefixes
        self._followed: tuple[str, ...] = ()  # the instance ids the mirror follows

    # --- choosing -------------------------------------------------------------------------------------------

    def route(self, request: GenerateRequest, exclude: tuple[Replica, ...] = ()) -> Route | None:
        start_s = time.perf_counter()
        live = [r for r in self.replicas.live() if r not in exclude]
        if not live:
            return None
        now_s = time.monotonic()
        live = [r for r in live if r.refusing_until_s <= now_s] or live  # the open ones, when there are any
        if self.mirror is not None:
            self._follow()
        tokens = request.prompt_token_ids
        self._turn += 1
        if len(live) == 1:  # nothing to choose: no hashing, no prediction
            choice = Choice(0, 0, False)
        elif self.config.policy == "prefix":
            choice = self._by_prefix(live, request)
        else:
            candidates = [Candidate(r.name, self.load_of(r), 0) for r in live]
            choose = choose_least_load if self.config.policy == "least-load" else choose_round_robin
            choice = choose(candidates, self._turn)
        route = Route(live[choice.index], choice, len(tokens))
        self.metrics.decision_seconds.observe(time.perf_counter() - start_s)
        return route

    def _follow(self) -> None:
        """Have the mirror follow every identified replica (live or not: one that flaps keeps its view)."""
        names = tuple(r.name for r in self.replicas.replicas.values() if r.identity is not None)
        if names != self._followed:
            self.mirror.follow(list(names))
            self._followed = names

    def _by_prefix(self, live: list[Replica], request: GenerateRequest) -> Choice:
        tokens, salt = request.prompt_token_ids, request.cache_salt
        block_size = live[0].model.block_size
        first = block_key(ROOT_KEY, tokens[:block_size], salt)  # a partial block too: short prompts spread as well
        ranks = rendezvous_ranks([r.name for r in live], first)
        views = [self.mirror.view(r.name) if self.mirror is not None else None for r in live]
        indexed = any(view is not None for view in views)
        keys_of: dict[int, list[bytes]] = {}  # block size -> the prompt's keys (replicas of one model share one)
        now_s = time.monotonic()
        candidates = []
        for replica, view, rank in zip(live, views, ranks, strict=True):
            size = replica.model.block_size
            keys = keys_of.get(size)
            if keys is None:
                keys = keys_of[size] = prompt_block_keys(tokens, size, salt)
            if indexed:
                held = self._leading_blocks(keys, view.keys if view else set(), replica.name, now_s)
            else:  # no index: the first block's rendezvous owner stands in for the holder
                held = len(keys) if rank == 0 else 0
            candidates.append(Candidate(replica.name, self.load_of(replica), held))
        if not indexed:
            self.metrics.fallbacks.inc()
        choice = choose_by_prefix(candidates, len(tokens), block_size, self.config.load_cost_tokens, ranks)
        chosen = live[choice.index]
        if indexed:
            self._pending.setdefault(chosen.name, PendingPrefixes()).add(
                keys_of[chosen.model.block_size], now_s + self.config.pending_ttl_s, now_s)
        return choice

    def _leading_blocks(self, keys: list[bytes], cached: set[bytes], name: str, now_s: float) -> int:
        pending = self._pending.get(name)
        for count, key in enumerate(keys):
            if key not in cached and (pending is None or not pending.holds(key, now_s)):
                return count
        return len(keys)

    def refusing_for_s(self) -> float:
        """Seconds for which every live replica has said it refuses arrivals (0 when one is open or none is live)."""
        now_s = time.monotonic()
        waits = [r.refusing_until_s - now_s for r in self.replicas.live()]
        return max(0.0, min(waits)) if waits else 0.0

    def load_of(self, replica: Replica) -> int:
        """Requests running or waiting on the replica: its published count, or this gateway's own open calls when
        those are more (they count at once; the published figure lags and includes other gateways')."""
        view = self.mirror.view(replica.name) if self.mirror is not None else None
        published = view.load.num_running + view.load.num_waiting if view is not None and view.load else 0
        return max(published, replica.num_in_flight)

    # --- calling --------------------------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest, served_by: list[str] | None = None,
                       exclude: tuple[Replica, ...] = (), called: list[Replica] | None = None
                       ) -> AsyncGenerator[RequestOutput, None]:
        """The request's outputs from the replica routed to (retried once elsewhere before any output), never one
        in `exclude`; each replica a call is opened on is appended to `called` first."""
        tried: tuple[Replica, ...] = ()
        while True:
            route = self.route(request, (*exclude, *tried))
            if route is None:
                raise OpenAIError(503, "no scheduler replica is ready", code="service_unavailable")
            replica, started = route.replica, False
            if called is not None:
                called.append(replica)
            self.metrics.routed(route)
            replica.num_in_flight += 1
            try:
                async with contextlib.aclosing(replica.client.generate(request)) as outputs:
                    async for out in outputs:
                        if not started:
                            started = True
                            if served_by is not None:
                                served_by.append(replica.name)
                        if out.finished:
                            self.metrics.finished(replica.name, out.num_prompt_tokens, out.num_cached_tokens)
                        yield out
                return
            except grpc.aio.AioRpcError as exc:
                if exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED:
                    replica.refusing_until_s = time.monotonic() + admit_after_s(exc)
                if started or tried or exc.code() not in RETRYABLE:
                    raise
                if exc.code() is grpc.StatusCode.UNAVAILABLE:
                    self.replicas.mark_failed(replica, exc.details() or exc.code().name)
                tried = (replica,)
                if not any(r not in tried and r not in exclude for r in self.replicas.live()):
                    raise  # nowhere else to go: the client gets this replica's answer (say, 429)
                self.metrics.retries.labels(replica.name).inc()
            finally:
                replica.num_in_flight -= 1
