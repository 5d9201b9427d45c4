"""The compose mTLS setup without Docker: deploy/scripts/internal_certs.py makes the certificates as the
internal-certs container does, then worker, scheduler and gateway run as real processes with them, configured by
the same PAGEDSERVE_* variables deploy/compose.mtls.yml sets. A request is answered end to end through both
mutual-TLS hops; the scheduler's and the worker's gRPC ports refuse plaintext clients, TLS clients without a
certificate and clients whose certificate comes from another CA, while their plaintext health-only ports answer.

Slow (about 2 minutes on a loaded 2-core machine: three processes and the default model), the only test of the
compose mTLS wiring with real services. Processes listen on 127.0.0.1, not on the compose names the certificates
carry, so the clients name the server they expect with --internal-tls-server-name (which also shows the name is
checked)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pagedserve.services.gpu_worker.server import SERVICE_NAME as WORKER_SERVICE
from pagedserve.services.healthcheck import grpc_serving
from pagedserve.services.internal_tls import InternalTLSConfig
from pagedserve.services.ports import free_port
from pagedserve.services.scheduler.server import SERVICE_NAME as SCHEDULER_SERVICE
from tests.conftest import REPO_ROOT
from tests.integration.processes import MODEL_DIR
from tests.support.fault_stack import STARTUP_TIMEOUT_S, FaultStack

pytestmark = pytest.mark.slow
CERTS_SCRIPT = REPO_ROOT / "deploy/scripts/internal_certs.py"
COMPOSE_LEAVES = ("gateway:client", "scheduler:server+client", "gpu-worker:server")
README_REQUEST = {"max_tokens": 32, "temperature": 0,
                  "messages": [{"role": "user", "content": "What is the capital of France?"}]}


def make_certs(root: Path) -> Path:
    done = subprocess.run([sys.executable, str(CERTS_SCRIPT), "--ca-dir", str(root / "ca"), "--out",
                           str(root / "tls"), *COMPOSE_LEAVES], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return root / "tls"


def tls_env(folder: Path, server_name: str = "") -> dict[str, str]:
    """The variables deploy/compose.mtls.yml sets (its mount point replaced by `folder`)."""
    env = {"PAGEDSERVE_INTERNAL_TLS_CERT": str(folder / "tls.crt"), "PAGEDSERVE_INTERNAL_TLS_KEY":
           str(folder / "tls.key"), "PAGEDSERVE_INTERNAL_TLS_CA": str(folder / "ca.crt")}
    return env | ({"PAGEDSERVE_INTERNAL_TLS_SERVER_NAME": server_name} if server_name else {})


def client(folder: Path, server_name: str, cert: bool = True, ca_from: Path | None = None) -> InternalTLSConfig:
    return InternalTLSConfig(str(folder / "tls.crt") if cert else "", str(folder / "tls.key") if cert else "",
                             str((ca_from or folder) / "ca.crt"), server_name)


@pytest.fixture(scope="module")
def mtls_stack(tmp_path_factory):
    if not (MODEL_DIR / "model.safetensors").is_file():
        raise RuntimeError(f"{MODEL_DIR} is missing: run `make model`")
    root = tmp_path_factory.mktemp("mtls")
    tls = make_certs(root)
    stack = FaultStack(root)
    health_ports = {"worker": free_port(), "scheduler": free_port()}
    stack.worker.env = {**stack.env, **tls_env(tls / "gpu-worker"), "PAGEDSERVE_WORKER_TLS": "true",
                        "PAGEDSERVE_WORKER_HEALTH_PORT": str(health_ports["worker"])}
    stack.scheduler.env = {**stack.env, **tls_env(tls / "scheduler", "gpu-worker"), "PAGEDSERVE_WORKER_TLS": "true",
                           "PAGEDSERVE_HEALTH_PORT": str(health_ports["scheduler"])}
    stack.gateway.env = {**stack.env, **tls_env(tls / "gateway", "scheduler")}
    try:
        stack.start(STARTUP_TIMEOUT_S)
        yield stack, tls, health_ports
    finally:
        stack.close()


def test_a_request_is_answered_through_both_mutual_tls_hops(mtls_stack):
    stack, _, _ = mtls_stack
    reply = stack.http.post("/v1/chat/completions", json=README_REQUEST)
    assert reply.status_code == 200, reply.text
    assert "Paris" in reply.json()["choices"][0]["message"]["content"]
    assert "(TLS)" in stack.worker.log() and f"worker at 127.0.0.1:{stack.worker_port} (TLS)" in stack.scheduler.log()


@pytest.mark.parametrize("port_of", ["scheduler", "worker"])
def test_the_grpc_ports_take_only_clients_with_a_certificate_from_the_ca(mtls_stack, tmp_path, port_of):
    stack, tls, health_ports = mtls_stack
    address = f"127.0.0.1:{stack.scheduler_port if port_of == 'scheduler' else stack.worker_port}"
    service, name = (SCHEDULER_SERVICE, "scheduler") if port_of == "scheduler" else (WORKER_SERVICE, "gpu-worker")
    its_client = tls / ("gateway" if port_of == "scheduler" else "scheduler")  # the compose client of that port
    rogue = make_certs(tmp_path / "rogue")  # the same names and usages, another CA

    def answers(config: InternalTLSConfig | None) -> bool:
        return grpc_serving(address, 5.0, service, config)

    assert answers(client(its_client, name))
    assert not answers(None)  # plaintext
    assert not answers(client(its_client, name, cert=False))  # TLS without a client certificate
    assert not answers(client(rogue / its_client.name, name, ca_from=its_client))  # a certificate of another CA
    assert not answers(client(its_client, "not-" + name))  # the server's name is checked
    assert grpc_serving(f"127.0.0.1:{health_ports[port_of]}", 5.0, service)  # probes: plaintext health port
