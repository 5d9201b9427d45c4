"""Slow and vanished readers, through a real HTTP server and socket: a stream whose client stops reading is aborted
after --stream-stall-timeout-s (its scheduler request cancelled, so its KV blocks are freed); one whose client
goes away is aborted at once. A client that keeps reading is never cut."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from pagedserve.services.gateway.api.serving import Serving
from pagedserve.services.gateway.app import create_app
from pagedserve.services.gateway.config import GatewayConfig
from pagedserve.services.ports import free_port
from pagedserve.shared.request_io import RequestOutput
from tests.integration.processes import wait_for
from tests.unit.gateway.conftest import MODEL_DIR
from tests.unit.gateway.fake_scheduler import FakeSchedulerClient, fake_replicas

TOKENS_PER_OUTPUT = 500  # big SSE events: the socket buffers fill within a few hundred of them


class EndlessScheduler(FakeSchedulerClient):
    """Generates until cancelled (or its test ends), TOKENS_PER_OUTPUT tokens an output; `paced` outputs wait `pace_s`
    each."""

    pace_s = 0.0
    stopped = False  # set when the test ends: a fake never outlives its test, whatever the gateway did

    async def generate(self, request):
        self.requests.append(request)
        num_outputs = 0
        try:
            while not self.stopped:
                num_outputs += 1
                ids = (self.reply_ids[:-1] * TOKENS_PER_OUTPUT)[:TOKENS_PER_OUTPUT]
                yield RequestOutput(request.req_id, ids, [None] * len(ids), None, 3, 0, num_outputs * len(ids))
                await asyncio.sleep(self.pace_s)
        finally:
            self.cancelled.append(request.req_id)


@contextmanager
def http_gateway(tokenizer, stall_timeout_s: float) -> Iterator[tuple[int, EndlessScheduler, Serving]]:
    port = free_port()
    config = GatewayConfig(model_dir=str(MODEL_DIR), port=port, stream_stall_timeout_s=stall_timeout_s,
                           health_poll_interval_s=0.05)
    fake = EndlessScheduler(tokenizer)
    serving = Serving(config, tokenizer, fake_replicas(fake), generation_defaults={})
    server = uvicorn.Server(uvicorn.Config(create_app(serving), port=port, loop="asyncio", log_config=None))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        # lifespan startup (serving.ready) runs before uvicorn binds its socket: wait for both
        wait_for(lambda: serving.ready and server.started, 30, what="the gateway ready and listening")
        yield port, fake, serving
    finally:
        server.should_exit = True
        thread.join(30)
        fake.stopped = True
    assert not thread.is_alive(), "the gateway did not stop within 30 s: a request of it is still open"


def open_stream(port: int, receive_buffer_bytes: int | None = None) -> socket.socket:
    """A raw client that sends a streaming completion and reads only the status line."""
    body = json.dumps({"prompt": "Paris is", "max_tokens": 100, "stream": True}).encode()
    client = socket.socket()
    if receive_buffer_bytes:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer_bytes)
    client.connect(("127.0.0.1", port))
    client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    assert client.recv(15) == b"HTTP/1.1 200 OK"
    return client


def test_a_client_that_stops_reading_is_cut_after_the_stall_timeout(tokenizer):
    with http_gateway(tokenizer, stall_timeout_s=1.0) as (port, fake, serving):
        client = open_stream(port, receive_buffer_bytes=4096)  # then reads nothing more
        try:
            wait_for(lambda: fake.cancelled, 60, interval_s=0.1, what="the stalled stream aborted")
            wait_for(lambda: serving.admission.num_open == 0, 10, what="the request closed")
            client.settimeout(10)
            while client.recv(1 << 16):  # what the buffers held, then the end: the server closed the connection
                pass
        finally:
            client.close()
    assert fake.cancelled == [fake.requests[0].req_id]


def test_a_client_that_goes_away_is_aborted_at_once(tokenizer):
    with http_gateway(tokenizer, stall_timeout_s=60.0) as (port, fake, serving):
        fake.pace_s = 0.01
        client = open_stream(port)
        client.recv(1 << 16)
        client.close()
        wait_for(lambda: fake.cancelled, 10, interval_s=0.05, what="the vanished reader's stream aborted")
        wait_for(lambda: serving.admission.num_open == 0, 10, what="the request closed")


def test_a_reader_slower_than_the_server_is_not_cut_while_it_reads(tokenizer):
    """Reading 64 KiB every 0.1 s, slower than the server writes, for longer than the stall timeout: the buffers
    stay full, yet every write proceeds within the timeout (the kernel frees a third of the largest send buffer,
    4 MiB, in about 2 s; the margin is for a loaded machine), so the stream runs on. When that reader then goes
    away with the buffers full, its stream is aborted at once (on a loaded machine its task could miss the
    cancellation and stream on into the lost connection)."""
    with http_gateway(tokenizer, stall_timeout_s=8.0) as (port, fake, serving):
        client = open_stream(port)
        try:
            deadline_s = time.monotonic() + 10.0
            while time.monotonic() < deadline_s:
                assert client.recv(1 << 16)
                time.sleep(0.1)
            assert fake.cancelled == [] and serving.admission.num_open == 1
        finally:
            client.close()
        wait_for(lambda: fake.cancelled, 10, interval_s=0.05, what="the vanished slow reader's stream aborted")
        wait_for(lambda: serving.admission.num_open == 0, 10, what="the request closed")
