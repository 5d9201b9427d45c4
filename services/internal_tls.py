"""Optional mutual TLS on the internal gRPC links, beside the shared token: gateways -> schedulers, and with
`--worker-tls` (on both ends) scheduler -> worker, where the scheduler dials with the same files as a client.

Contract (flags, each also a PAGEDSERVE_* variable; every path a PEM file, e.g. a cert-manager Secret mounted as
files `tls.crt`, `tls.key`, `ca.crt`):
- server (scheduler; worker with `--worker-tls`): `--internal-tls-cert` and `--internal-tls-key` turn TLS on for
  its gRPC port; with `--internal-tls-ca` too, every client must present a certificate chaining to that CA (mutual
  TLS). The files are read again whenever one of them changes (checked at each new connection), so a renewed
  certificate takes effect without a restart.
- client (gateway; scheduler with `--worker-tls`): `--internal-tls-ca` turns TLS on and verifies the server's
  certificate against it; with `--internal-tls-cert` and `--internal-tls-key` the client presents its own.
  `--internal-tls-server-name` overrides the name checked in the server's certificate (default: the host of the
  address dialled). A client's files are read when it connects.
All empty (the default): plaintext. A cert without its key (or the reverse) is a configuration error; a file
that cannot be read fails the service at start, naming the path.
gRPC health on a TLS port needs TLS too: kubelet probes cannot, so the scheduler's `--health-port` and the
worker's `--worker-health-port` serve health alone in plaintext (services/scheduler/server.py,
services/gpu_worker/server.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio


@dataclass(frozen=True)
class InternalTLSConfig:
    internal_tls_cert: str = ""  # PEM certificate this service presents on internal gRPC; empty: plaintext
    internal_tls_key: str = ""  # PEM private key of --internal-tls-cert
    # PEM CA bundle: a server requires client certificates signed by it (mutual TLS); a client verifies the server
    internal_tls_ca: str = ""
    internal_tls_server_name: str = ""  # client: the name the scheduler's certificate must carry; empty: its host

    def __post_init__(self) -> None:
        if bool(self.internal_tls_cert) != bool(self.internal_tls_key):
            raise ValueError("--internal-tls-cert and --internal-tls-key go together: set both or neither")
        if self.internal_tls_server_name and not self.internal_tls_ca:
            raise ValueError("--internal-tls-server-name needs --internal-tls-ca (it names the server TLS verifies)")

    @property
    def serves_tls(self) -> bool:
        return bool(self.internal_tls_cert)

    @property
    def dials_tls(self) -> bool:
        return bool(self.internal_tls_ca)


def _read(path: str) -> bytes:
    return Path(path).read_bytes()


def _server_files(config: InternalTLSConfig) -> tuple[str, ...]:
    return tuple(p for p in (config.internal_tls_cert, config.internal_tls_key, config.internal_tls_ca) if p)


def _stamp(paths: tuple[str, ...]) -> tuple[tuple[int, int], ...]:
    stamps = []
    for path in paths:
        try:
            status = os.stat(path)
        except OSError:  # mid-rotation (a Secret volume swaps a symlink): keep the last good files
            return ()
        stamps.append((status.st_mtime_ns, status.st_ino))
    return tuple(stamps)


def _certificate_configuration(config: InternalTLSConfig) -> grpc.ServerCertificateConfiguration:
    ca = _read(config.internal_tls_ca) if config.internal_tls_ca else None
    return grpc.ssl_server_certificate_configuration(
        [(_read(config.internal_tls_key), _read(config.internal_tls_cert))], root_certificates=ca)


def server_credentials(config: InternalTLSConfig) -> grpc.ServerCredentials | None:
    """TLS credentials for a gRPC server (client certificates required when a CA is set); None: plaintext.
    The files are read again when their modification stamps change."""
    if not config.serves_tls:
        return None
    paths = _server_files(config)
    seen = [_stamp(paths)]

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        stamp = _stamp(paths)
        if not stamp or stamp == seen[0]:
            return None  # unchanged: gRPC keeps the current configuration
        try:
            fresh = _certificate_configuration(config)
        except OSError:
            return None
        seen[0] = stamp
        return fresh

    return grpc.dynamic_ssl_server_credentials(_certificate_configuration(config), fetch,
                                               require_client_authentication=bool(config.internal_tls_ca))


def channel_credentials(config: InternalTLSConfig) -> grpc.ChannelCredentials | None:
    """TLS credentials for a client channel (with this service's certificate when set); None: plaintext."""
    if not config.dials_tls:
        return None
    key = _read(config.internal_tls_key) if config.internal_tls_key else None
    cert = _read(config.internal_tls_cert) if config.internal_tls_cert else None
    return grpc.ssl_channel_credentials(_read(config.internal_tls_ca), private_key=key, certificate_chain=cert)


def channel_options(config: InternalTLSConfig) -> list[tuple[str, str]]:
    """The server-name override, when one is set."""
    if config.dials_tls and config.internal_tls_server_name:
        return [("grpc.ssl_target_name_override", config.internal_tls_server_name)]
    return []


def sync_channel(address: str, config: InternalTLSConfig | None) -> grpc.Channel:
    """A blocking channel to `address` (health checks): TLS when the config dials TLS, plaintext otherwise."""
    credentials = None if config is None else channel_credentials(config)
    if config is None or credentials is None:
        return grpc.insecure_channel(address)
    return grpc.secure_channel(address, credentials, options=channel_options(config))


def aio_channel(address: str, config: InternalTLSConfig, options: list) -> grpc.aio.Channel:
    """An asyncio channel to `address`: TLS when the config dials TLS, plaintext otherwise."""
    credentials = channel_credentials(config)
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(address, credentials, options=[*options, *channel_options(config)])
