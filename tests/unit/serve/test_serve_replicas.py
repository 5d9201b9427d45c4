"""`serve --replicas N`: distinct ports, instance ids and thread shares per replica, one gateway wired to every
scheduler, children that parse their commands into those configs, and which exits end `serve`."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pagedserve.services.gpu_worker.service_config import WorkerServiceConfig
from pagedserve.services.launcher import Child, fatal_exit, resolve_ports
from pagedserve.services.ports import free_port
from pagedserve.services.scheduler.service_config import SchedulerServiceConfig
from pagedserve.services.serve_config import SERVICES, child_environment, parse_serve_config
from pagedserve.services.serve_replicas import child_plans, replica_configs
from pagedserve.shared.cli_config import parse_config

MODEL = "models/SmolLM2-135M-Instruct"


def parse(*argv: str, environ: dict[str, str] | None = None):
    """A resolved config on free ports (other stacks may hold the defaults on this machine)."""
    argv = (MODEL, "--port", str(free_port()), "--scheduler-port", str(free_port()), "--worker-port",
            str(free_port()), "--metrics-port", str(free_port()), *argv)
    config = parse_serve_config(list(argv), prog="pagedserve serve", environ=environ or {})
    return resolve_ports(config, lambda text: None)


def test_one_replica_is_serve_as_before():
    config = parse()
    [only] = replica_configs(config, num_cpus=8)
    assert only is config
    assert [(p.name, p.service) for p in child_plans([only])] == [(s, s) for s in SERVICES]


def test_each_replica_has_its_own_ports_id_and_thread_share():
    config = parse("--replicas", "3", "--instance-id", "box", "--routing", "round-robin")
    replicas = replica_configs(config, num_cpus=8)
    ports = [(r.scheduler.scheduler_port, r.worker.worker_port, r.scheduler.metrics_port) for r in replicas]
    assert ports[0] == (config.scheduler.scheduler_port, config.worker.worker_port, config.scheduler.metrics_port)
    assert len({port for triple in ports for port in triple} | {config.gateway.port}) == 10
    assert [r.scheduler.instance_id for r in replicas] == ["box-0", "box-1", "box-2"]
    assert [r.worker.worker.num_threads for r in replicas] == [2, 2, 2]
    assert [r.scheduler.worker_address for r in replicas] == [f"127.0.0.1:{w}" for _, w, _ in ports]
    gateway = replicas[0].gateway
    assert gateway.scheduler_address == ",".join(f"127.0.0.1:{s}" for s, _, _ in ports)
    assert gateway.routing == "round-robin"
    names = [p.name for p in child_plans(replicas)]
    assert names == ["worker-0", "worker-1", "worker-2", "scheduler-0", "scheduler-1", "scheduler-2", "gateway"]


def test_replica_children_parse_their_commands_into_their_configs():
    config = parse("--replicas", "2", "--redis-url", "redis://r:1/0", "--num-threads", "3",
                   environ={"PAGEDSERVE_INSTANCE_ID": "from-env"})
    replicas = replica_configs(config, num_cpus=8)
    assert [r.scheduler.instance_id for r in replicas] == ["from-env-0", "from-env-1"]  # flags beat the variable
    assert [r.worker.worker.num_threads for r in replicas] == [3, 3]  # given explicitly: kept
    env = child_environment(config, {})
    expected = {f"{s}-{i}": r.services[s] for i, r in enumerate(replicas) for s in ("worker", "scheduler")}
    expected["gateway"] = replicas[0].gateway
    for plan in child_plans(replicas):
        cls = SERVICES[plan.service][0]
        positional = () if cls is SchedulerServiceConfig else ("model_dir",)
        with pytest.MonkeyPatch.context() as patch:
            for key, value in {**env, "PAGEDSERVE_INSTANCE_ID": "from-env"}.items():
                patch.setenv(key, value)
            assert parse_config(cls, plan.argv[3:], "", positional=positional) == expected[plan.name], plan.name
    assert isinstance(expected["worker-1"], WorkerServiceConfig)


def test_replicas_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        parse("--replicas", "0")
    assert "replicas must be at least 1" in capsys.readouterr().err


@dataclass
class FakeProcess:
    returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode


def children(*names: str) -> list[Child]:
    return [Child(name, FakeProcess(), name.partition("-")[0]) for name in names]


def test_serve_ends_on_the_gateway_or_the_last_whole_replica_only():
    single = children("worker", "scheduler", "gateway")
    single[0].process.returncode = -9
    assert fatal_exit(single) is single[0]  # without replicas, any exit (as before)
    group = children("worker-0", "worker-1", "scheduler-0", "scheduler-1", "gateway")
    assert fatal_exit(group) is None
    group[0].process.returncode = -9  # replica 0's worker
    group[2].process.returncode = 1  # and then its scheduler
    assert fatal_exit(group) is None  # replica 1 still serves
    group[3].process.returncode = 0
    assert fatal_exit(group) is group[3]
    group = children("worker-0", "worker-1", "scheduler-0", "scheduler-1", "gateway")
    group[4].process.returncode = 0
    assert fatal_exit(group) is group[4]
