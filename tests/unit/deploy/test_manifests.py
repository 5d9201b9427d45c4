"""docker-compose.yml, deploy/compose.cpu.yml and deploy/k8s/ agree with the services they start: every container
command parses with its service's own flags, and every address, port and probe points at a container that listens
there. (No Docker engine or cluster here: the images are not built in CI.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from services.gateway.config import GatewayConfig
from services.gpu_worker.service_config import WorkerServiceConfig
from services.scheduler.service_config import SchedulerServiceConfig
from shared.cli_config import parse_config
from tests.conftest import REPO_ROOT

SERVICES = {  # module -> (its config, its positional arguments)
    "services.gpu_worker": (WorkerServiceConfig, ("model_dir",)),
    "services.scheduler": (SchedulerServiceConfig, ()),
    "services.gateway": (GatewayConfig, ("model_dir",)),
}
DEFAULT_MODEL = "/models/SmolLM2-135M-Instruct"


class _ComposeLoader(yaml.SafeLoader):
    """YAML with compose's `!reset` tag (it clears a value inherited from an earlier file)."""


_ComposeLoader.add_constructor("!reset", lambda loader, node: None)


def _load(path: Path) -> list[dict]:
    return [doc for doc in yaml.load_all(path.read_text(), Loader=_ComposeLoader) if doc]


def _config(command: list[str]):
    """The service config a `python -m services.X ...` command builds (compose's ${VAR:-default} substituted)."""
    assert command[:2] == ["python", "-m"], command
    cls, positional = SERVICES[command[2]]
    argv = [re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", arg) for arg in command[3:]]
    return parse_config(cls, argv, "", positional=positional)


@pytest.fixture(scope="module")
def compose() -> dict:
    (doc,) = _load(REPO_ROOT / "docker-compose.yml")
    return doc["services"]


def test_compose_commands_parse_and_connect(compose) -> None:
    worker, scheduler, gateway = (_config(compose[name]["command"]) for name in ("gpu-worker", "scheduler", "gateway"))
    assert worker.worker_host == scheduler.scheduler_host == gateway.host == "0.0.0.0"
    assert scheduler.worker_address == f"gpu-worker:{worker.worker_port}"
    assert gateway.scheduler_address == f"scheduler:{scheduler.scheduler_port}"
    assert scheduler.state.redis_url == "redis://redis:6379/0" and "redis" in compose
    assert worker.worker.model_dir == gateway.model_dir == DEFAULT_MODEL
    assert compose["model"]["command"][-1] == DEFAULT_MODEL  # the converter fills the folder they serve
    assert compose["gateway"]["ports"] == [f"{gateway.port}:{gateway.port}"]


def test_compose_health_checks_probe_each_service_own_port(compose) -> None:
    ports = {"gpu-worker": _config(compose["gpu-worker"]["command"]).worker_port,
             "scheduler": _config(compose["scheduler"]["command"]).scheduler_port}
    for name, port in ports.items():
        assert compose[name]["healthcheck"]["test"][-2:] == ["grpc", f"127.0.0.1:{port}"]
    gateway = _config(compose["gateway"]["command"])
    assert compose["gateway"]["healthcheck"]["test"][-1] == f"http://127.0.0.1:{gateway.port}/health"
    assert compose["gpu-worker"]["depends_on"]["model"]["condition"] == "service_completed_successfully"


def test_compose_traces_go_to_jaeger_over_otlp(compose) -> None:
    for name in ("gpu-worker", "scheduler", "gateway"):
        assert compose[name]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4317"


def test_cpu_override_drops_the_gpu_and_takes_cpu_torch(compose) -> None:
    (override,) = _load(REPO_ROOT / "deploy" / "compose.cpu.yml")
    assert "devices" in str(compose["gpu-worker"]["deploy"])
    assert override["services"]["gpu-worker"]["deploy"] is None  # !reset
    for name in ("model", "gpu-worker", "scheduler", "gateway"):
        assert override["services"][name]["build"]["args"]["TORCH_INDEX_URL"].endswith("/whl/cpu")


def test_dockerfile_copies_every_package(compose) -> None:
    dockerfile = (REPO_ROOT / "deploy" / "docker" / "Dockerfile").read_text()
    for package in ("services", "shared", "kernels", "proto"):
        assert f"COPY {package} {package}" in dockerfile
    assert compose["gateway"]["build"]["dockerfile"] == "deploy/docker/Dockerfile"
    assert "torch==2.13.0" in dockerfile and 'torch==2.13.0",' in (REPO_ROOT / "pyproject.toml").read_text()


@pytest.fixture(scope="module")
def k8s() -> dict[tuple[str, str], dict]:
    folder = REPO_ROOT / "deploy" / "k8s"
    (kustomization,) = _load(folder / "kustomization.yaml")
    listed = set(kustomization["resources"])
    assert listed == {p.name for p in folder.glob("*.yaml")} - {"kustomization.yaml"}
    return {(doc["kind"], doc["metadata"]["name"]): doc for name in listed for doc in _load(folder / name)}


def _container(k8s, name: str) -> dict:
    (container,) = k8s["Deployment", name]["spec"]["template"]["spec"]["containers"]
    return container


def _serves(k8s, name: str, port: int) -> None:
    """Deployment `name` listens on `port`, and its Service sends `port` there."""
    assert _container(k8s, name)["ports"] == [{"containerPort": port}]
    service = k8s["Service", name]["spec"]
    assert service["selector"] == k8s["Deployment", name]["spec"]["selector"]["matchLabels"]
    assert [(p["port"], p["targetPort"]) for p in service["ports"]] == [(port, port)]


def test_k8s_commands_parse_and_connect(k8s) -> None:
    worker, scheduler, gateway = (_config(_container(k8s, n)["command"]) for n in ("gpu-worker", "scheduler",
                                                                                      "gateway"))
    _serves(k8s, "gpu-worker", worker.worker_port)
    _serves(k8s, "scheduler", scheduler.scheduler_port)
    _serves(k8s, "gateway", gateway.port)
    _serves(k8s, "redis", 6379)
    assert scheduler.worker_address == f"gpu-worker:{worker.worker_port}"
    assert gateway.scheduler_address == f"scheduler:{scheduler.scheduler_port}"
    assert scheduler.state.redis_url == "redis://redis:6379/0"
    job = k8s["Job", "pagedserve-default-model"]["spec"]["template"]["spec"]["containers"][0]
    assert job["command"][-1] == worker.worker.model_dir == gateway.model_dir


def test_k8s_probes_and_replicas(k8s) -> None:
    worker, scheduler = _container(k8s, "gpu-worker"), _container(k8s, "scheduler")
    assert worker["startupProbe"]["grpc"]["port"] == worker["ports"][0]["containerPort"]
    assert scheduler["readinessProbe"]["grpc"]["port"] == scheduler["ports"][0]["containerPort"]
    assert _container(k8s, "gateway")["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 1
    for name in ("gpu-worker", "scheduler"):  # one worker per scheduler, never two during an update
        spec = k8s["Deployment", name]["spec"]
        assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}


def test_k8s_pods_mount_the_model_volume(k8s) -> None:
    claim = k8s["PersistentVolumeClaim", "pagedserve-models"]["metadata"]["name"]
    for name in ("gpu-worker", "gateway"):
        pod = k8s["Deployment", name]["spec"]["template"]["spec"]
        assert pod["volumes"] == [{"name": "models", "persistentVolumeClaim": {"claimName": claim}}]
        assert _container(k8s, name)["volumeMounts"] == [{"name": "models", "mountPath": "/models",
                                                           "readOnly": True}]
        assert _container(k8s, name)["envFrom"] == [{"configMapRef": {"name": "pagedserve-env"}}]
