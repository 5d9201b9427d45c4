"""A stack started with default hosts listens on 127.0.0.1 only: gateway, scheduler, worker and metrics ports are not
reachable from other machines unless a --*-host flag says so."""

from __future__ import annotations

from pathlib import Path

LISTEN = "0A"
LOOPBACK = {"0100007F",  # 127.0.0.1 as /proc/net/tcp writes it
            "0000000000000000FFFF00000100007F",  # ::ffff:127.0.0.1 in /proc/net/tcp6 (gRPC binds this way)
            "00000000000000000000000001000000"}  # ::1


def listening_addresses(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp{,6} write them) that listen on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if fields[3] == LISTEN and int(hex_port, 16) == port:
                found.add(address)
    return found


def test_every_port_of_a_default_stack_listens_on_loopback_only(gateway_stack):
    ports = {"gateway": gateway_stack.serve.port, "scheduler": gateway_stack.scheduler_port,
             "worker": gateway_stack.worker_port, "scheduler /metrics": gateway_stack.metrics_port}
    addresses = {name: listening_addresses(port) for name, port in ports.items()}
    assert all(addresses.values()), addresses  # each one listens
    assert {name: found - LOOPBACK for name, found in addresses.items()} == {name: set() for name in ports}, addresses
