"""Where the schedulers are: `--scheduler-address` as a comma list of host:port, each host a literal IP or a DNS
name that may resolve to several addresses (a Kubernetes headless Service gives one per ready pod)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    host: str
    port: int

    @property
    def is_literal(self) -> bool:
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            return False
        return True


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_targets(text: str) -> list[Target]:
    """'a:1, b:2, [::1]:3' -> targets, in order, without repeats; ValueError naming a malformed entry."""
    targets: list[Target] = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        host, sep, port = entry.rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"scheduler address {entry!r} is not host:port")
        target = Target(host, int(port))
        if target not in targets:
            targets.append(target)
    if not targets:
        raise ValueError("no scheduler address given")
    return targets


async def resolve(target: Target) -> list[str]:
    """The target's addresses as ip:port, IPv4 first-class: a name with IPv4 answers uses only those (localhost
    answers ::1 and 127.0.0.1, one scheduler that must not count twice). Raises OSError when the name fails."""
    if target.is_literal:
        return [join_host_port(target.host, target.port)]
    infos = await asyncio.get_running_loop().getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    v4 = [info for info in infos if info[0] == socket.AF_INET]
    addresses: list[str] = []
    for info in v4 or infos:
        address = join_host_port(info[4][0], target.port)
        if address not in addresses:
            addresses.append(address)
    return addresses
