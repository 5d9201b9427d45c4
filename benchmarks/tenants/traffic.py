"""The tenants benchmark's clients: each tenant sends with its own API key through its own HTTP session.

- `closed_loop`: `streams` clients, each sending its next request as soon as its last one ended, until `stop` is
  set; what is in flight then is awaited (so every record is complete). A tenant with ten times the streams of
  another keeps ten times as many requests outstanding: it offers ten times the other's rate at any service rate.
- `probes`: one request at a time, `gap_s` apart (so a probe finds the engine at another point of its step).

Every prompt is distinct (tenant, stream, sequence number) and of about the same length, so no request is a prefix
cache hit on another's prompt beyond the chat template, and the tenants' prompts cost the same.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp

from pagedserve.benchmarks.client import make_http_client, send_request
from pagedserve.benchmarks.datasets import BenchRequest
from pagedserve.benchmarks.payload import EndpointConfig
from pagedserve.benchmarks.records import RequestRecord

TOPICS = ("a lighthouse", "a harbour town", "an old clock", "a mountain road", "a winter garden", "a paper boat")


@dataclass(frozen=True)
class Tenant:
    name: str
    key: str
    max_tokens: int


@dataclass
class Client:
    """A tenant's session and the records of everything it sent; times from `t0` (perf_counter)."""
    tenant: Tenant
    endpoint: EndpointConfig
    session: aiohttp.ClientSession
    t0: float
    records: list[RequestRecord]

    @classmethod
    def open(cls, tenant: Tenant, base_url: str, model: str, t0: float) -> Client:
        endpoint = EndpointConfig(base_url, model, api_key=tenant.key, ignore_eos=True, eos_suppression="ignore-eos",
                                  request_timeout_s=300.0)
        return cls(tenant, endpoint, make_http_client(endpoint), t0, [])

    async def send(self, stream: int, seq: int, records: list[RequestRecord] | None = None) -> RequestRecord:
        """One request; its record goes to `records` (default: the client's own)."""
        topic = TOPICS[(stream + seq) % len(TOPICS)]
        request = BenchRequest(f"[{self.tenant.name} {stream}.{seq}] Write a short story about {topic}.", None,
                               self.tenant.max_tokens)
        target = self.records if records is None else records
        record = RequestRecord(len(target), self.tenant.max_tokens, send_offset_s=time.perf_counter() - self.t0)
        target.append(record)
        return await send_request(self.session, self.endpoint, request, record, None)

    async def close(self) -> None:
        await self.session.close()


async def closed_loop(client: Client, streams: int, stop: asyncio.Event) -> None:
    async def stream(index: int) -> None:
        seq = 0
        while not stop.is_set():
            await client.send(index, seq)
            seq += 1

    await asyncio.gather(*(stream(i) for i in range(streams)))


async def probes(client: Client, num: int, gap_s: float, records: list[RequestRecord], first_seq: int = 0) -> None:
    for seq in range(first_seq, first_seq + num):
        await client.send(0, seq, records)
        await asyncio.sleep(gap_s)
