"""`serve --replicas N`: N engine replicas (a scheduler and its worker each) on this machine behind one gateway.

Replica 0 keeps the ports `serve` resolved; replica i takes each of them + i when that is free, else a free port.
Each scheduler gets `--instance-id BASE-i` (BASE: --instance-id, else the host name), so the replicas have their
own Redis keys and labels; each worker gets cores // N torch threads unless --num-threads is given. The gateway
gets every scheduler's address and routes over them (--routing). With N = 1 nothing changes.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

from pagedserve.services.ports import free_port, port_is_free
from pagedserve.services.serve_config import INTERNAL_HOST, SERVICES, ServeConfig, child_command, with_ports

REPLICA_SERVICES = ("worker", "scheduler")


@dataclass(frozen=True)
class ChildPlan:
    name: str  # its log prefix: worker, scheduler, gateway; worker-1, scheduler-1, ... with replicas
    service: str  # worker, scheduler or gateway
    argv: list[str]


def replica_configs(config: ServeConfig, log: Callable[[str], None] = lambda text: None,
                    num_cpus: int | None = None) -> list[ServeConfig]:
    """One config per replica (index = replica), each with its own ports, instance id and thread share; the
    gateway of each is wired to every scheduler. `config` must have its ports resolved (replica 0's)."""
    num_replicas = config.launcher.replicas
    if num_replicas == 1:
        return [config]
    taken = {config.gateway.port, config.scheduler.scheduler_port, config.worker.worker_port,
             config.scheduler.metrics_port}
    base_id = config.scheduler.instance_id or socket.gethostname()
    threads = None if "num_threads" in config.explicit else max(1, (num_cpus or _num_cpus()) // num_replicas)
    replicas = []
    for i in range(num_replicas):
        ports = [config.scheduler.scheduler_port, config.worker.worker_port, config.scheduler.metrics_port]
        if i:
            ports = [_port_near(port + i, taken) if port else 0 for port in ports]
            taken.update(ports)
        replicas.append(_replica(config, *ports, f"{base_id}-{i}", threads))
    addresses = ",".join(f"{INTERNAL_HOST}:{r.scheduler.scheduler_port}" for r in replicas)
    log(f"{num_replicas} replicas: schedulers at {addresses}" + (f", {threads} threads a worker" if threads else ""))
    gateway = dataclasses.replace(config.gateway, scheduler_address=addresses)
    return [dataclasses.replace(r, services={**r.services, "gateway": gateway}) for r in replicas]


def _replica(config: ServeConfig, scheduler_port: int, worker_port: int, metrics_port: int, instance_id: str,
             threads: int | None) -> ServeConfig:
    config = with_ports(config, scheduler_port, worker_port)
    scheduler = dataclasses.replace(config.scheduler, metrics_port=metrics_port, instance_id=instance_id)
    worker = config.worker
    given = {**config.given, "instance_id": instance_id}
    if threads is not None:
        worker = dataclasses.replace(worker, worker=dataclasses.replace(worker.worker, num_threads=threads))
        given["num_threads"] = str(threads)
    return dataclasses.replace(config, services={**config.services, "scheduler": scheduler, "worker": worker},
                               given=given)


def _port_near(port: int, taken: set[int]) -> int:
    if port < 65536 and port not in taken and port_is_free(INTERNAL_HOST, port):
        return port
    while (other := free_port(INTERNAL_HOST)) in taken:
        pass
    return other


def _num_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def child_plans(replicas: list[ServeConfig]) -> list[ChildPlan]:
    """Every worker, then every scheduler, then the gateway (the order they start in; they stop in reverse)."""
    if len(replicas) == 1:
        return [ChildPlan(name, name, child_command(replicas[0], name)) for name in SERVICES]
    plans = [ChildPlan(f"{service}-{i}", service, child_command(replica, service))
             for service in REPLICA_SERVICES for i, replica in enumerate(replicas)]
    return [*plans, ChildPlan("gateway", "gateway", child_command(replicas[0], "gateway"))]
