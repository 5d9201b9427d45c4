"""Every server binds 127.0.0.1 unless told otherwise: a fresh start exposes nothing beyond the machine."""

from __future__ import annotations

import dataclasses

import pytest

from pagedserve.services.gateway.config import GatewayConfig
from pagedserve.services.gpu_worker.service_config import WorkerServiceConfig
from pagedserve.services.scheduler.service_config import SchedulerServiceConfig
from pagedserve.shared.cli_config import leaf_fields


@pytest.mark.parametrize("cls", [GatewayConfig, SchedulerServiceConfig, WorkerServiceConfig])
def test_every_listening_host_and_peer_address_defaults_to_loopback(cls):
    fields = {f.name: f.default for f, _ in leaf_fields(cls) if f.default is not dataclasses.MISSING}
    hosts = {name: value for name, value in fields.items() if name == "host" or name.endswith("_host")}
    addresses = {name: value for name, value in fields.items() if name.endswith("_address")}
    assert hosts, f"{cls.__name__} has no host field"
    assert set(hosts.values()) == {"127.0.0.1"}, hosts
    assert all(value.startswith("127.0.0.1:") for value in addresses.values()), addresses
