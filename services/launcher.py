"""`pagedserve serve MODEL_DIR`: start worker, scheduler and gateway as subprocesses, wait for health, stop cleanly.

Each child runs in its own session (a terminal's Ctrl-C reaches only this launcher, which then stops the gateway
first and the worker last) and receives SIGTERM if the launcher dies. Child output is prefixed by service name.
`serve` takes every flag of the three services (serve_config.py); the model folder and the ports are checked
before any child starts: a bad folder or a taken gateway port stops it with exit code 2, and a taken internal
port moves to a free one unless it was chosen explicitly. With `--replicas N` it starts N worker + scheduler pairs
behind the one gateway (serve_replicas.py); once serving, a replica whose process dies is left out (the gateway
routes around it) while the gateway and another whole replica still run.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from pagedserve.services.healthcheck import grpc_serving
from pagedserve.services.ports import PortInUseError, free_port, port_is_free
from pagedserve.services.serve_config import (
    INTERNAL_HOST,
    ServeConfig,
    child_environment,
    parse_serve_config,
    with_ports,
)
from pagedserve.services.serve_replicas import child_plans, replica_configs
from pagedserve.shared.cli_config import flag_name
from pagedserve.shared.drain_timing import CUT_GRACE_S
from pagedserve.shared.gguf_folder import served_folder
from pagedserve.shared.model_dir import model_dir_problem

_PR_SET_PDEATHSIG = 1
SCHEDULER_SERVICE = "pagedserve.v1.SchedulerService"  # its gRPC health name for readiness
SERVE_METRICS_PORT = 8001  # the scheduler's /metrics under `serve` unless --metrics-port says otherwise


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    service: str = ""  # worker, scheduler or gateway (the name, without replicas)

    def __post_init__(self) -> None:
        self.service = self.service or self.name

    @property
    def replica(self) -> str | None:
        """The replica's index as text ("0", "1", ...) for a replica's child under --replicas; else None."""
        return self.name.rpartition("-")[2] if "-" in self.name else None


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM when the launcher dies (Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def resolve_ports(config: ServeConfig, log: Callable[[str], None]) -> ServeConfig:
    """The config with internal ports that are free: a taken default moves to a free port (said through `log`); a
    taken port given by flag or PAGEDSERVE_* variable, or a taken gateway port, raises PortInUseError."""
    gateway = config.gateway
    if not port_is_free(gateway.host, gateway.port):
        raise PortInUseError(gateway.host, gateway.port, "the gateway (HTTP)", "--port")
    taken = {gateway.port}
    ports = {}
    for name, what in (("scheduler_port", "the scheduler's gRPC server"), ("worker_port", "the worker's gRPC server")):
        port = getattr(config.scheduler if name == "scheduler_port" else config.worker, name)
        if port not in taken and port_is_free(INTERNAL_HOST, port):
            ports[name] = port
        elif name in config.explicit:
            raise PortInUseError(INTERNAL_HOST, port, what, flag_name(name))
        else:
            ports[name] = _another_free_port(taken)
            log(f"port {port} for {what} is in use: using {ports[name]} instead (choose one with {flag_name(name)})")
        taken.add(ports[name])
    return _with_metrics_port(with_ports(config, ports["scheduler_port"], ports["worker_port"]), taken, log)


def _with_metrics_port(config: ServeConfig, taken: set[int], log: Callable[[str], None]) -> ServeConfig:
    """The scheduler's Prometheus /metrics: --metrics-port when given (0: none), else SERVE_METRICS_PORT, or a free
    port when that one is taken (said through `log`)."""
    port = config.scheduler.metrics_port
    if "metrics_port" in config.explicit:
        if port and (port in taken or not port_is_free(INTERNAL_HOST, port)):
            raise PortInUseError(INTERNAL_HOST, port, "the scheduler's /metrics", "--metrics-port")
    elif SERVE_METRICS_PORT in taken or not port_is_free(INTERNAL_HOST, SERVE_METRICS_PORT):
        port = _another_free_port(taken)
        log(f"port {SERVE_METRICS_PORT} for the scheduler's /metrics is in use: using {port} instead (choose one "
            "with --metrics-port)")
    else:
        port = SERVE_METRICS_PORT
    scheduler = dataclasses.replace(config.scheduler, metrics_port=port)
    return dataclasses.replace(config, services={**config.services, "scheduler": scheduler})


def _another_free_port(taken: set[int]) -> int:
    while (port := free_port(INTERNAL_HOST)) in taken:
        pass
    return port


def _pump(name: str, stream: IO[str]) -> None:
    for line in stream:
        sys.stdout.write(f"{name:<11}| {line}")
        sys.stdout.flush()


def start_children(config: ServeConfig, replicas: list[ServeConfig] | None = None) -> list[Child]:
    env = child_environment(config, os.environ)  # secrets there, not on the command line where `ps` shows them
    children = []
    for plan in child_plans(replicas or [config]):  # all started before any pump thread exists (preexec_fn rule)
        process = subprocess.Popen(plan.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                   start_new_session=True, preexec_fn=_die_with_parent)
        children.append(Child(plan.name, process, plan.service))
    for child in children:
        threading.Thread(target=_pump, args=(child.name, child.process.stdout), daemon=True).start()
    return children


def stop_timeouts(config: ServeConfig) -> dict[str, float]:
    """How long each child may take to stop before SIGKILL: its drain timeout (the requests in flight finish
    first; the gateway's plus the time to answer what its drain cut) and a margin, never less than --stop-timeout-s."""
    timeouts = {name: max(config.launcher.stop_timeout_s, getattr(service, "drain_timeout_s", 0.0) + 10.0)
                for name, service in config.services.items()}
    timeouts["gateway"] = max(timeouts["gateway"], config.gateway.drain_timeout_s + CUT_GRACE_S + 5.0)
    return timeouts


def stop_children(children: list[Child], timeouts_s: dict[str, float]) -> None:
    """SIGTERM gateway, then scheduler, then worker (each drains what it has in flight before it exits: the gateway
    while its streams are still served, the scheduler before its worker); SIGKILL whoever outlives its timeout."""
    for child in reversed(children):
        if child.process.poll() is None:
            child.process.terminate()
            timeout_s = timeouts_s[child.service]
            try:
                child.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                print(f"launcher | {child.name} did not stop in {timeout_s:.0f}s: killing it", flush=True)
                child.process.kill()
                child.process.wait()


def _exited(children: list[Child]) -> Child | None:
    return next((c for c in children if c.process.poll() is not None), None)


def fatal_exit(children: list[Child]) -> Child | None:
    """The exited child that ends `serve`: any, without replicas; with them, the gateway, or the one whose exit
    leaves no replica with both processes running (a dead replica's others are left to the gateway's routing)."""
    dead = [c for c in children if c.process.poll() is not None]
    if not dead or all(c.replica is None for c in children):
        return dead[0] if dead else None
    broken = {c.replica for c in dead}
    whole = {c.replica for c in children if c.replica is not None} - broken
    return next((c for c in dead if c.replica is None), None) or (dead[-1] if not whole else None)


def _base_url(config: ServeConfig) -> str:
    host = config.gateway.host
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '::', '') else host}:{config.gateway.port}"


def wait_until_healthy(config: ServeConfig, children: list[Child], stop: threading.Event) -> str | None:
    """The served model's name once the gateway's /health is 200; None when a child died or we were stopped.

    Waits for every scheduler's gRPC readiness first, so that the gateway is not asked (and does not log and count
    503s) while the model loads; the gateway's /health then checks the schedulers itself and answers 200 at once.
    """
    deadline_s = time.monotonic() + config.launcher.startup_timeout_s
    schedulers = config.gateway.scheduler_address.split(",")

    def waiting() -> bool:
        return not stop.is_set() and _exited(children) is None and time.monotonic() < deadline_s

    for scheduler in schedulers:
        while waiting() and not grpc_serving(scheduler, 2.0, SCHEDULER_SERVICE, config.gateway.tls):
            stop.wait(0.25)
    with httpx.Client(base_url=_base_url(config), timeout=5.0, trust_env=False) as client:
        while waiting():
            try:
                if client.get("/health").status_code == 200:
                    return served_model_name(config, client)
            except httpx.HTTPError:
                pass
            stop.wait(0.25)
    return None


def served_model_name(config: ServeConfig, client: httpx.Client) -> str:
    """The name clients send as `model`: the gateway's /v1/models, or, when a keys file guards it and no --api-key
    gives the launcher a key, the name the worker serves under (its --served-model-name, else the folder's)."""
    response = client.get("/v1/models", headers=_auth(config))
    if response.status_code == 401 and config.gateway.api_keys_file and not config.gateway.api_key:
        return config.worker.worker.model_name or Path(config.launcher.model_dir).name
    return response.json()["data"][0]["id"]


def _auth(config: ServeConfig) -> dict[str, str]:
    """The header the launcher's own call to the gateway needs: --api-key's (it never reads a tenant's key)."""
    key = config.gateway.api_key
    return {"Authorization": f"Bearer {key}"} if key else {}


def ready_banner(config: ServeConfig, model_name: str, replicas: list[ServeConfig] | None = None) -> str:
    base = _base_url(config)
    keyed = config.gateway.api_key or config.gateway.api_keys_file
    auth = " -H \"Authorization: Bearer $PAGEDSERVE_API_KEY\"" if keyed else ""  # not the key
    body = (f'{{"model": "{model_name}", "messages": [{{"role": "user", "content": "What is the capital of '
            f'France?"}}], "max_tokens": 32, "temperature": 0}}')
    return "\n".join([
        f"pagedserve is ready: {model_name}",
        f"  OpenAI API: {base}/v1   health: {base}/health   HTTP metrics: {base}/metrics",
        *[f"  engine metrics (Prometheus){_replica_label(r)}: http://{INTERNAL_HOST}:{r.scheduler.metrics_port}"
          "/metrics" for r in replicas or [config] if r.scheduler.metrics_port],
        "  try:",
        f"    curl {base}/v1/chat/completions -H 'Content-Type: application/json'{auth} \\",
        f"      -d '{body}'",
        "  Ctrl-C stops all three services." if not replicas or len(replicas) == 1 else
        f"  {len(replicas)} replicas routed by {config.gateway.routing}; Ctrl-C stops every service.",
    ])


def _replica_label(config: ServeConfig) -> str:
    return f" of {config.scheduler.instance_id}" if config.launcher.replicas > 1 else ""


def _say(text: str) -> None:
    print(f"launcher | {text}", flush=True)


def checked_config(argv: Sequence[str] | None, prog: str | None) -> ServeConfig | str:
    """The config to start, or the one-line reason not to start anything (model folder, ports). A GGUF file (or a
    folder holding one alone) is served through the folder of its config and tokenizer (shared/gguf_folder.py)."""
    config = parse_serve_config(argv, prog)
    try:
        folder = served_folder(config.launcher.model_dir)
    except (ValueError, OSError) as exc:
        return f"cannot serve {config.launcher.model_dir!r}: {exc}"
    config = dataclasses.replace(config, launcher=dataclasses.replace(config.launcher, model_dir=folder))
    problem = model_dir_problem(config.launcher.model_dir, weights=config.worker.worker.load_format != "dummy")
    if problem is not None:
        return problem
    try:
        return resolve_ports(config, _say)
    except PortInUseError as exc:
        return str(exc)


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    config = checked_config(argv, prog)
    if isinstance(config, str):
        print(f"{prog or 'pagedserve serve'}: error: {config}", file=sys.stderr)
        return 2
    replicas = replica_configs(config, _say)
    config = replicas[0]  # the gateway's wiring covers every replica
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda s, f: stop.set())
    children = start_children(config, replicas)
    try:
        model_name = wait_until_healthy(config, children, stop)
        if model_name is None and not stop.is_set():
            dead = _exited(children)
            print(f"launcher | {dead.name + ' exited' if dead else 'startup timed out'}: stopping", flush=True)
            return 1
        if model_name is not None:
            print(ready_banner(config, model_name, replicas), flush=True)
        reported: set[str] = set()
        while not stop.wait(0.5):
            dead = fatal_exit(children)
            if dead is not None:
                print(f"launcher | {dead.name} exited with code {dead.process.returncode}: stopping", flush=True)
                return 1
            for child in children:
                if child.process.poll() is not None and child.name not in reported:
                    reported.add(child.name)
                    _say(f"{child.name} exited with code {child.process.returncode}: replica {child.replica} is "
                         "out; the gateway routes around it")
        return 0
    finally:
        print("launcher | stopping gateway, scheduler, worker", flush=True)
        stop_children(children, stop_timeouts(config))
        print("launcher | stopped", flush=True)
