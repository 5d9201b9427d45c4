"""`pagedserve serve MODEL_DIR`: start worker, scheduler and gateway as subprocesses, wait for health, stop cleanly.

Each child runs in its own session (a terminal's Ctrl-C reaches only this launcher, which then stops the gateway
first and the worker last) and receives SIGTERM if the launcher dies. Child output is prefixed by service name.
Every other service flag can be set through its PAGEDSERVE_* variable, which the children inherit.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO

import httpx

from shared.cli_config import check_choices, parse_config
from shared.log_setup import LogLevel

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ServeConfig:
    model_dir: str  # Hugging Face model folder to serve
    host: str = "127.0.0.1"  # interface of the gateway's HTTP server (0.0.0.0 for all)
    port: int = 8000  # the gateway's HTTP port: where clients send requests
    scheduler_port: int = 50051  # the scheduler's gRPC port (on 127.0.0.1)
    worker_port: int = 50061  # the worker's gRPC port (on 127.0.0.1)
    redis_url: str = ""  # the scheduler's Redis state copy, e.g. redis://127.0.0.1:6379/0; empty: none
    api_key: str | None = None  # require `Authorization: Bearer KEY` on /v1/*
    kv_cache_memory_bytes: int = 4 * 1024**3  # the worker's KV pool on CPU (on GPU a memory fraction applies)
    startup_timeout_s: float = 600.0  # give up when the gateway is not healthy by then
    stop_timeout_s: float = 15.0  # per service, before SIGKILL
    log_level: LogLevel = "info"  # debug, info, warning, error

    def __post_init__(self) -> None:
        check_choices(self)


@dataclass
class Child:
    name: str
    process: subprocess.Popen


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM when the launcher dies (Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def child_commands(config: ServeConfig) -> list[tuple[str, list[str]]]:
    python, level = sys.executable, ["--log-level", config.log_level]
    return [
        ("worker", [python, "-m", "services.gpu_worker", config.model_dir, "--worker-host", "127.0.0.1",
                    "--worker-port", str(config.worker_port),
                    "--kv-cache-memory-bytes", str(config.kv_cache_memory_bytes), *level]),
        ("scheduler", [python, "-m", "services.scheduler", "--scheduler-host", "127.0.0.1",
                       "--scheduler-port", str(config.scheduler_port),
                       "--worker-address", f"127.0.0.1:{config.worker_port}", "--redis-url", config.redis_url,
                       *level]),
        ("gateway", [python, "-m", "services.gateway", config.model_dir, "--host", config.host,
                     "--port", str(config.port), "--scheduler-address", f"127.0.0.1:{config.scheduler_port}",
                     *level]),
    ]


def _pump(name: str, stream: IO[str]) -> None:
    for line in stream:
        sys.stdout.write(f"{name:<9}| {line}")
        sys.stdout.flush()


def start_children(config: ServeConfig) -> list[Child]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if config.api_key:
        env["PAGEDSERVE_API_KEY"] = config.api_key  # not on the command line, where `ps` shows it
    children = []
    for name, argv in child_commands(config):  # all started before any pump thread exists (preexec_fn rule)
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                   start_new_session=True, preexec_fn=_die_with_parent)
        children.append(Child(name, process))
    for child in children:
        threading.Thread(target=_pump, args=(child.name, child.process.stdout), daemon=True).start()
    return children


def stop_children(children: list[Child], timeout_s: float) -> None:
    """SIGTERM gateway, then scheduler, then worker; SIGKILL whoever outlives the timeout."""
    for child in reversed(children):
        if child.process.poll() is None:
            child.process.terminate()
            try:
                child.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                print(f"launcher | {child.name} did not stop in {timeout_s:.0f}s: killing it", flush=True)
                child.process.kill()
                child.process.wait()


def _exited(children: list[Child]) -> Child | None:
    return next((c for c in children if c.process.poll() is not None), None)


def wait_until_healthy(config: ServeConfig, children: list[Child], stop: threading.Event) -> str | None:
    """The served model's name once the gateway's /health is 200; None when a child died or we were stopped."""
    base = f"http://{'127.0.0.1' if config.host == '0.0.0.0' else config.host}:{config.port}"
    deadline_s = time.monotonic() + config.startup_timeout_s
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while not stop.is_set() and _exited(children) is None and time.monotonic() < deadline_s:
            try:
                if client.get(base + "/health").status_code == 200:
                    return client.get(base + "/v1/models", headers=_auth(config)).json()["data"][0]["id"]
            except httpx.HTTPError:
                pass
            stop.wait(0.5)
    return None


def _auth(config: ServeConfig) -> dict[str, str]:
    return {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}


def ready_banner(config: ServeConfig, model_name: str) -> str:
    base = f"http://{'127.0.0.1' if config.host == '0.0.0.0' else config.host}:{config.port}"
    auth = f" -H 'Authorization: Bearer {config.api_key}'" if config.api_key else ""
    body = (f'{{"model": "{model_name}", "messages": [{{"role": "user", "content": "What is the capital of '
            f'France?"}}], "max_tokens": 32, "temperature": 0}}')
    return "\n".join([
        f"pagedserve is ready: {model_name}",
        f"  OpenAI API: {base}/v1   health: {base}/health   metrics: {base}/metrics",
        "  try:",
        f"    curl {base}/v1/chat/completions -H 'Content-Type: application/json'{auth} \\",
        f"      -d '{body}'",
        "  Ctrl-C stops all three services.",
    ])


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    config = parse_config(ServeConfig, argv, __doc__.splitlines()[0], prog=prog, positional=("model_dir",))
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda s, f: stop.set())
    children = start_children(config)
    try:
        model_name = wait_until_healthy(config, children, stop)
        if model_name is None and not stop.is_set():
            dead = _exited(children)
            print(f"launcher | {dead.name + ' exited' if dead else 'startup timed out'}: stopping", flush=True)
            return 1
        if model_name is not None:
            print(ready_banner(config, model_name), flush=True)
        while not stop.wait(0.5):
            dead = _exited(children)
            if dead is not None:
                print(f"launcher | {dead.name} exited with code {dead.process.returncode}: stopping", flush=True)
                return 1
        return 0
    finally:
        print("launcher | stopping gateway, scheduler, worker", flush=True)
        stop_children(children, config.stop_timeout_s)
        print("launcher | stopped", flush=True)
