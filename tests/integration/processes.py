"""Real processes for the integration tests: redis-server, an OTLP trace collector, and the pagedserve stack."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import threading
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import redis
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from pagedserve.services.ports import free_port
from tests.support.waiting import http_ok, wait_for

REPO = Path(__file__).resolve().parents[2]
MODEL_DIR = REPO / "models" / "SmolLM2-135M-Instruct"


def port_is_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def process_alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, dead and awaiting its parent's wait, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class RedisServer:
    """A throw-away redis-server on a free port; can be killed and restarted on the same port. With a password, it
    refuses clients without it (auth failures then come from a real server)."""

    def __init__(self, log_path: Path, password: str = "") -> None:
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not installed: run `make redis-server` (apt-get install redis-server)")
        self.port = free_port()
        self.log_path = log_path
        self.password = password
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                                             "--save", "", "--appendonly", "no",
                                             *(["--requirepass", self.password] if self.password else [])],
                                            stdout=log, stderr=log)
        wait_for(self._pings, 10, what="redis-server answering PING")

    def _pings(self) -> bool:
        try:
            return self.client().ping()
        except redis.RedisError:
            return False

    def kill(self) -> None:
        """SIGKILL: Redis vanishes mid-run, as in a crash."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, password=self.password or None, socket_timeout=2, decode_responses=True)


@dataclass
class CollectedSpan:
    service: str
    trace_id: str
    name: str
    attributes: dict
    span_id: str = ""
    parent_span_id: str = ""  # "" for a root span
    events: list[tuple[str, dict]] = field(default_factory=list)  # (name, attributes) in time order
    status_code: int = 0  # OTLP Status.StatusCode: 0 unset, 1 ok, 2 error


class TraceCollector(trace_service_pb2_grpc.TraceServiceServicer):
    """A minimal OTLP/gRPC trace receiver that keeps every span it is sent."""

    def __init__(self) -> None:
        self.port = free_port()
        self.spans: list[CollectedSpan] = []
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"127.0.0.1:{self.port}")

    def Export(self, request, context):  # noqa: N802 - gRPC method name
        with self._lock:
            for resource_spans in request.resource_spans:
                resource = {kv.key: kv.value.string_value for kv in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append(CollectedSpan(
                            resource.get("service.name", ""), span.trace_id.hex(), span.name, _attributes(span),
                            span.span_id.hex(), span.parent_span_id.hex(),
                            [(e.name, _attributes(e)) for e in sorted(span.events, key=lambda e: e.time_unix_nano)],
                            span.status.code))
        return trace_service_pb2.ExportTraceServiceResponse()

    def snapshot(self) -> list[CollectedSpan]:
        with self._lock:
            return list(self.spans)


def _attributes(item) -> dict:
    return {kv.key: _value(kv.value) for kv in item.attributes}


def _value(value) -> object:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


@dataclass
class Stack:
    """`pagedserve serve` running the three services, with Redis and a trace collector beside it."""

    process: subprocess.Popen
    log_path: Path
    port: int
    scheduler_port: int
    worker_port: int
    redis: RedisServer
    collector: TraceCollector
    instance_id: str
    scheduler_metrics_port: int
    env: dict = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def scheduler_metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.scheduler_metrics_port}/metrics"

    def log_tail(self, num_lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-num_lines:])

    def redis_key(self, suffix: str) -> str:
        return f"pagedserve:{self.instance_id}:{suffix}"

    def wait_healthy(self, timeout_s: float) -> None:
        def healthy() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"pagedserve serve exited with {self.process.returncode}:\n{self.log_tail()}")
            return http_ok(self.base_url + "/health", timeout_s=1)

        wait_for(healthy, timeout_s, interval_s=0.25, what="the stack's /health 200", detail=self.log_tail)


def start_stack(tmp_dir: Path, redis_server: RedisServer, collector: TraceCollector, env: dict,
                model_dir: Path = MODEL_DIR, extra_args: tuple[str, ...] = ()) -> Stack:
    port, scheduler_port, worker_port, metrics_port = free_port(), free_port(), free_port(), free_port()
    log_path = tmp_dir / "pagedserve.log"
    instance_id = "itest"
    env = {**env, "PAGEDSERVE_INSTANCE_ID": instance_id, "PAGEDSERVE_REDIS_STATS_INTERVAL_S": "0.05",
           "PAGEDSERVE_REDIS_PREFIX_SYNC_INTERVAL_S": "0.2", "PAGEDSERVE_HEALTH_POLL_INTERVAL_S": "0.2",
           "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.port}", "OTEL_BSP_SCHEDULE_DELAY": "200"}
    argv = [sys.executable, "-m", "pagedserve.services.cli", "serve", str(model_dir), "--port", str(port),
            "--scheduler-port", str(scheduler_port), "--worker-port", str(worker_port),
            "--metrics-port", str(metrics_port), "--redis-url", redis_server.url,
            "--kv-cache-memory-bytes", "256MiB", *extra_args]
    with open(log_path, "w") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    return Stack(process, log_path, port, scheduler_port, worker_port, redis_server, collector, instance_id,
                 metrics_port, env)
