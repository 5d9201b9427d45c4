"""The HTTP edge of a real gateway process, probed with raw sockets: huge or numerous headers get 431 at once
with RSS flat, slowloris and slow-body sockets are closed within their timeouts while /health and normal
requests answer, and one client's connections are capped."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

from tests.integration.gateway_processes import start_fake_scheduler, start_gateway
from tests.support.waiting import http_ok, wait_for

HEADER_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 2.0
MAX_OPEN_REQUESTS = 16
PER_CLIENT = 300
CHAT = {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    tmp_dir = tmp_path_factory.mktemp("edge")
    scheduler = start_fake_scheduler(tmp_dir)
    try:
        proc = start_gateway(tmp_dir, scheduler.port, "--header-timeout-s", str(HEADER_TIMEOUT_S),
                             "--body-timeout-s", str(BODY_TIMEOUT_S), "--max-open-requests", str(MAX_OPEN_REQUESTS),
                             "--max-connections-per-client", str(PER_CLIENT))
        try:
            yield proc
        finally:
            proc.stop()
    finally:
        scheduler.stop()


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def read_status(sock: socket.socket) -> int | None:
    """The status of the response on the socket; None when it was closed without one."""
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    except (ConnectionResetError, BrokenPipeError):
        pass
    return int(data.split(b" ")[1]) if data.startswith(b"HTTP/1.1 ") else None


def send_head_with(port: int, header: bytes) -> tuple[int | None, float]:
    sock = connect(port)
    start_s = time.monotonic()
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" + header + b"\r\n\r\n")
    except (ConnectionResetError, BrokenPipeError):
        pass  # the server answered and closed before the whole head was sent
    status = read_status(sock)
    sock.close()
    return status, time.monotonic() - start_s


def test_a_1mb_header_gets_431_at_once_with_rss_flat(gateway):
    rss_before = gateway.rss_bytes()
    status, elapsed_s = send_head_with(gateway.port, b"X-Big: " + b"a" * 1024 * 1024)
    assert status == 431 and elapsed_s < 1.0
    statuses = [send_head_with(gateway.port, b"X-Big: " + b"a" * 1024 * 1024)[0] for _ in range(8)]
    assert statuses == [431] * 8
    assert gateway.rss_bytes() - rss_before < 20 * 1024**2
    assert httpx.get(gateway.base_url + "/health", timeout=2).status_code == 200


def test_too_many_header_fields_get_431(gateway):
    status, _ = send_head_with(gateway.port, b"\r\n".join(b"X-H%d: v" % i for i in range(200)))
    assert status == 431
    ok, _ = send_head_with(gateway.port, b"\r\n".join(b"X-H%d: v" % i for i in range(50)))
    assert ok == 200


def test_slowloris_connections_are_closed_within_the_timeout_while_health_answers(gateway):
    sockets = [connect(gateway.port) for _ in range(200)]
    stop = threading.Event()

    def trickle() -> None:
        for sock in sockets:
            try:
                sock.sendall(b"GET /health HTTP/1.1\r\n")
            except OSError:
                pass
        while not stop.wait(0.5):
            for sock in sockets:
                try:
                    sock.sendall(b"X")  # a byte of a header that never ends
                except OSError:
                    pass

    start_s = time.monotonic()
    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        worst_s = 0.0
        while time.monotonic() - start_s < HEADER_TIMEOUT_S + 1.0:
            t0 = time.monotonic()
            assert httpx.get(gateway.base_url + "/health", timeout=5).status_code == 200
            assert httpx.post(gateway.base_url + "/v1/chat/completions", json=CHAT, timeout=5).status_code == 200
            worst_s = max(worst_s, time.monotonic() - t0)
            time.sleep(0.1)
        assert worst_s < 1.0
        closed = 0
        for sock in sockets:
            sock.settimeout(HEADER_TIMEOUT_S + 3)
            status = read_status(sock)
            closed += status in (408, None)
        assert closed == len(sockets)
        assert time.monotonic() - start_s < HEADER_TIMEOUT_S + 5
    finally:
        stop.set()
        thread.join()
        for sock in sockets:
            sock.close()


def test_slow_bodies_holding_every_slot_time_out_and_normal_requests_are_served(gateway):
    sockets = [connect(gateway.port) for _ in range(MAX_OPEN_REQUESTS + 4)]
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\n\r\n{")
    for sock in sockets:
        sock.sendall(head)
    start_s = time.monotonic()
    time.sleep(0.3)
    try:
        served = None
        while time.monotonic() - start_s < BODY_TIMEOUT_S + 3:
            response = httpx.post(gateway.base_url + "/v1/chat/completions", json=CHAT, timeout=5)
            if response.status_code == 200:
                served = time.monotonic() - start_s
                break
            assert response.status_code == 429  # the slots are held until the slow bodies time out
            time.sleep(0.2)
        assert served is not None and served < BODY_TIMEOUT_S + 3
        statuses = []
        for sock in sockets:
            sock.settimeout(5)
            statuses.append(read_status(sock))
        assert all(status in (408, 429, None) for status in statuses) and 408 in statuses
    finally:
        for sock in sockets:
            sock.close()


def test_one_clients_connections_are_capped(gateway):
    def extra_refused() -> bool:
        """One more connection's answer is a 429 (not yet, while the gateway is still accepting the others)."""
        with connect(gateway.port) as extra:
            extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            return read_status(extra) == 429

    sockets = [connect(gateway.port) for _ in range(PER_CLIENT)]
    try:
        wait_for(extra_refused, 30, interval_s=0.1, what=f"connection {PER_CLIENT + 1} of one client refused")
    finally:
        for sock in sockets:
            sock.close()
    wait_for(lambda: http_ok(gateway.base_url + "/health"), 30, what="the client served again once it closed them")


def test_eight_concurrent_100mb_headers_leave_rss_flat_and_normal_requests_served(gateway):
    rss_before = gateway.rss_bytes()
    statuses: list[int | None] = []
    chunk = b"a" * (1024 * 1024)

    def flood() -> None:
        sock = connect(gateway.port)
        try:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
            for _ in range(100):
                sock.sendall(chunk)
        except OSError:
            pass  # refused and closed long before the 100 MB were sent
        statuses.append(read_status(sock))
        sock.close()

    threads = [threading.Thread(target=flood) for _ in range(8)]
    for thread in threads:
        thread.start()
    normal = [httpx.post(gateway.base_url + "/v1/chat/completions", json=CHAT, timeout=5).status_code
              for _ in range(5)]
    for thread in threads:
        thread.join(30)
    assert normal == [200] * 5
    assert all(status in (431, None) for status in statuses) and 431 in statuses
    assert gateway.rss_bytes() - rss_before < 100 * 1024**2
