"""Mutual TLS on the internal gRPC link (services/internal_tls.py) against real gRPC servers, with certificate
authorities made in the test: the gateway's scheduler client reaches a TLS scheduler port only with a certificate
from the CA the server trusts, verifies the server's name, and a renewed certificate is served without a restart;
the plaintext health port answers probes beside a TLS port; --worker-tls needs the files each end uses."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from pagedserve.services.gateway.routing.replicas import Health
from pagedserve.services.gateway.routing.scheduler_client import SCHEDULER_SERVICE, SchedulerClient
from pagedserve.services.healthcheck import grpc_serving
from pagedserve.services.internal_tls import InternalTLSConfig, server_credentials
from pagedserve.services.ports import GRPC_SERVER_OPTIONS, bind_grpc_port, free_port
from pagedserve.services.scheduler.admission import AdmissionConfig
from pagedserve.services.scheduler.redis_state import RedisStateConfig
from pagedserve.services.scheduler.scheduler_config import SchedulerConfig
from pagedserve.services.scheduler.server import health_only_server
from pagedserve.services.scheduler.service_config import SchedulerServiceConfig
from pagedserve.shared.cli_config import add_config_arguments, config_from_args

SERVER_NAME = "engine-0.engine.pagedserve.svc"  # the scheduler certificate's only name (not 127.0.0.1)


@dataclass
class Authority:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    folder: Path

    @classmethod
    def create(cls, folder: Path, name: str) -> Authority:
        folder.mkdir(parents=True)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (_builder(subject, subject, key.public_key())
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .sign(key, hashes.SHA256()))
        authority = cls(key, cert, folder)
        (folder / "ca.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return authority

    def issue(self, name: str, dns: str | None, usage: x509.ObjectIdentifier, into: Path | None = None) -> Path:
        """tls.crt / tls.key of a leaf certificate (and this CA's ca.crt), as a cert-manager Secret holds them."""
        folder = into or self.folder / name
        folder.mkdir(exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        builder = _builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]), self.cert.subject,
                           key.public_key()).add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if dns:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(dns)]), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        (folder / "tls.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                           serialization.PrivateFormat.PKCS8,
                                                           serialization.NoEncryption()))
        (folder / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (folder / "ca.crt").write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        return folder


def _builder(subject: x509.Name, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1)))


def tls(folder: Path, cert: bool = True, server_name: str = SERVER_NAME) -> InternalTLSConfig:
    return InternalTLSConfig(str(folder / "tls.crt") if cert else "", str(folder / "tls.key") if cert else "",
                             str(folder / "ca.crt"), server_name)


@pytest.fixture
def pki(tmp_path):
    """A CA with a scheduler (server) and a gateway (client) certificate, and a rogue CA with its own client."""
    ca = Authority.create(tmp_path / "ca", "pagedserve-internal-ca")
    rogue = Authority.create(tmp_path / "rogue", "someone-else")
    return {"ca": ca, "server": ca.issue("scheduler", SERVER_NAME, ExtendedKeyUsageOID.SERVER_AUTH),
            "client": ca.issue("gateway", None, ExtendedKeyUsageOID.CLIENT_AUTH),
            "rogue": rogue.issue("gateway", None, ExtendedKeyUsageOID.CLIENT_AUTH)}


@contextlib.asynccontextmanager
async def tls_scheduler(server_tls: InternalTLSConfig):
    """A gRPC server like the scheduler's: health, on a TLS port; yields its address."""
    server = grpc.aio.server(options=GRPC_SERVER_OPTIONS)
    servicer = health.aio.HealthServicer()
    await servicer.set(SCHEDULER_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = free_port()
    bind_grpc_port(server, "127.0.0.1", port, "test scheduler", "--scheduler-port", server_credentials(server_tls))
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


async def client_health(address: str, client_tls: InternalTLSConfig | None) -> Health:
    client = SchedulerClient(address, timeout_s=5, health_timeout_s=3, tls=client_tls)
    client.connect()
    try:
        return await client.check_health()
    finally:
        await client.close()


def serving(address: str, client_tls: InternalTLSConfig | None) -> bool:
    return grpc_serving(address, 3.0, SCHEDULER_SERVICE, client_tls)


@pytest.mark.asyncio
async def test_the_scheduler_port_answers_only_clients_with_a_certificate_from_its_ca(pki):
    async with tls_scheduler(tls(pki["server"])) as address:
        assert await client_health(address, tls(pki["client"])) is Health.SERVING
        assert await asyncio.to_thread(serving, address, tls(pki["client"]))
        assert await client_health(address, None) is Health.NO_ANSWER  # plaintext
        assert await client_health(address, tls(pki["client"], cert=False)) is Health.NO_ANSWER  # no client cert
        rogue_client = InternalTLSConfig(str(pki["rogue"] / "tls.crt"), str(pki["rogue"] / "tls.key"),
                                         str(pki["client"] / "ca.crt"), SERVER_NAME)
        assert await client_health(address, rogue_client) is Health.NO_ANSWER  # a certificate from another CA
        assert not await asyncio.to_thread(serving, address, rogue_client)


@pytest.mark.asyncio
async def test_the_client_verifies_the_schedulers_name_and_ca(pki):
    async with tls_scheduler(tls(pki["server"])) as address:
        # the certificate names SERVER_NAME, not the 127.0.0.1 dialled: without the override, verification fails
        assert await client_health(address, tls(pki["client"], server_name="")) is Health.NO_ANSWER
        wrong_ca = InternalTLSConfig(str(pki["client"] / "tls.crt"), str(pki["client"] / "tls.key"),
                                     str(pki["rogue"] / "ca.crt"), SERVER_NAME)
        assert await client_health(address, wrong_ca) is Health.NO_ANSWER


@pytest.mark.asyncio
async def test_without_a_ca_the_server_takes_any_tls_client(pki):
    """Server-side TLS alone (no --internal-tls-ca on the server): encrypted, clients not authenticated."""
    server_only = InternalTLSConfig(str(pki["server"] / "tls.crt"), str(pki["server"] / "tls.key"))
    async with tls_scheduler(server_only) as address:
        assert await client_health(address, tls(pki["client"], cert=False)) is Health.SERVING
        assert await client_health(address, None) is Health.NO_ANSWER


@pytest.mark.asyncio
async def test_a_renewed_certificate_is_served_without_a_restart(pki, tmp_path):
    """cert-manager rewrites the Secret's files: the server reads them again for new connections."""
    served = pki["ca"].issue("served", SERVER_NAME, ExtendedKeyUsageOID.SERVER_AUTH, into=tmp_path / "served")
    async with tls_scheduler(tls(served)) as address:
        assert await client_health(address, tls(pki["client"])) is Health.SERVING
        new_ca = Authority.create(tmp_path / "new-ca", "pagedserve-internal-ca-2")
        new_client = new_ca.issue("gateway", None, ExtendedKeyUsageOID.CLIENT_AUTH)
        assert await client_health(address, tls(new_client)) is Health.NO_ANSWER
        new_ca.issue("served", SERVER_NAME, ExtendedKeyUsageOID.SERVER_AUTH, into=served)  # rotate in place
        assert await client_health(address, tls(new_client)) is Health.SERVING
        assert await client_health(address, tls(pki["client"])) is Health.NO_ANSWER  # the old CA is gone


@pytest.mark.asyncio
async def test_the_health_port_serves_probes_in_plaintext_beside_the_tls_port(pki):
    config = SchedulerServiceConfig(SchedulerConfig(), RedisStateConfig(), AdmissionConfig(),
                                    tls=tls(pki["server"]), health_port=free_port())
    servicer = health.aio.HealthServicer()
    await servicer.set(SCHEDULER_SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)
    server = health_only_server(config, servicer)
    assert server is not None
    await server.start()
    try:
        address = f"127.0.0.1:{config.health_port}"
        assert await client_health(address, None) is Health.NOT_SERVING
        await servicer.set(SCHEDULER_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        assert await client_health(address, None) is Health.SERVING
        channel = grpc.aio.insecure_channel(address)  # health only: the scheduler's own service is not there
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await channel.unary_unary(f"/{SCHEDULER_SERVICE}/GetStats")(b"", timeout=3)
        assert raised.value.code() is grpc.StatusCode.UNIMPLEMENTED
        await channel.close()
    finally:
        await server.stop(0)
    assert health_only_server(SchedulerServiceConfig(SchedulerConfig(), RedisStateConfig(), AdmissionConfig()),
                              servicer) is None


def test_flags_and_environment_fill_the_tls_config(tmp_path):
    import argparse

    parser = argparse.ArgumentParser()
    add_config_arguments(parser, SchedulerServiceConfig)
    args = parser.parse_args(["--internal-tls-cert", "/tls/tls.crt", "--internal-tls-key", "/tls/tls.key",
                              "--health-port", "50052"])
    config = config_from_args(SchedulerServiceConfig, args, {"PAGEDSERVE_INTERNAL_TLS_CA": "/tls/ca.crt"})
    assert config.tls == InternalTLSConfig("/tls/tls.crt", "/tls/tls.key", "/tls/ca.crt")
    assert config.health_port == 50052 and config.tls.serves_tls and config.tls.dials_tls


@pytest.mark.parametrize(("fields", "message"), [
    ({"internal_tls_cert": "/tls/tls.crt"}, "--internal-tls-key"),
    ({"internal_tls_key": "/tls/tls.key"}, "--internal-tls-cert"),
    ({"internal_tls_server_name": "engine"}, "--internal-tls-ca"),
])
def test_incomplete_tls_settings_are_refused_naming_the_flag(fields, message):
    with pytest.raises(ValueError, match=message):
        InternalTLSConfig(**fields)


def test_worker_tls_needs_the_files_each_end_uses():
    """--worker-tls: the worker serves with its cert and key, the scheduler verifies with the CA."""
    from pagedserve.services.gpu_worker.service_config import WorkerServiceConfig
    from pagedserve.services.gpu_worker.worker_config import WorkerConfig

    with pytest.raises(ValueError, match="--internal-tls-cert"):
        WorkerServiceConfig(WorkerConfig("/models/m"), tls=InternalTLSConfig(internal_tls_ca="/tls/ca.crt"),
                            worker_tls=True)
    with pytest.raises(ValueError, match="--internal-tls-ca"):
        SchedulerServiceConfig(SchedulerConfig(), RedisStateConfig(), AdmissionConfig(), worker_tls=True,
                               tls=InternalTLSConfig("/tls/tls.crt", "/tls/tls.key"))
    assert WorkerServiceConfig(WorkerConfig("/models/m"), tls=InternalTLSConfig("/tls/tls.crt", "/tls/tls.key"),
                               worker_tls=True).worker_tls
