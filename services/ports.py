"""Listening ports: is one free, find a free one, and bind a gRPC server to one that no other process holds.

gRPC turns on SO_REUSEPORT by default, so two processes can listen on one port and split its connections between
them: a second `pagedserve serve` would then serve through the first one's scheduler. Our gRPC servers turn the
option off (`grpc.so_reuseport` = 0) and refuse a port in use with a `PortInUseError` that names the flag to change.
"""

from __future__ import annotations

import socket
from typing import Protocol

import grpc

GRPC_SERVER_OPTIONS = [("grpc.so_reuseport", 0)]  # one listener per port: a port in use is an error, not shared


class PortInUseError(OSError):
    """A port another process listens on; the message names the port, what wanted it and the flag to change it."""

    def __init__(self, host: str, port: int, what: str, flag: str) -> None:
        super().__init__(f"port {port} on {host} is already in use, so {what} cannot listen there: stop the "
                         f"process holding it or pass another port with {flag}")
        self.port = port
        self.flag = flag


class _GrpcServer(Protocol):
    def add_insecure_port(self, address: str) -> int: ...

    def add_secure_port(self, address: str, server_credentials: grpc.ServerCredentials) -> int: ...


def port_is_free(host: str, port: int) -> bool:
    """True when a server could listen on host:port now (SO_REUSEADDR, as servers set it; no SO_REUSEPORT)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel says is free on host (another process may still take it before it is used)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def bind_grpc_port(server: _GrpcServer, host: str, port: int, what: str, flag: str,
                   credentials: grpc.ServerCredentials | None = None) -> None:
    """server.add_insecure_port (add_secure_port with credentials), raising PortInUseError when the port is taken
    (the server must have been built with GRPC_SERVER_OPTIONS, else it would share the port instead)."""
    try:
        address = f"{host}:{port}"
        bound = server.add_insecure_port(address) if credentials is None else \
            server.add_secure_port(address, credentials)
    except RuntimeError:  # grpcio >= 1.55 raises instead of returning 0
        bound = 0
    if bound == 0:
        if not port_is_free(host, port):
            raise PortInUseError(host, port, what, flag)
        raise OSError(f"{what} cannot listen on {host}:{port} (is {host} an address of this machine?); "
                      f"change it with {flag}")
