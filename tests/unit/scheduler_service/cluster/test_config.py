"""The deletion cost updater is off unless asked for (plain `pagedserve serve` included), takes its settings from
flags or PAGEDSERVE_* variables like every scheduler field, and refuses to run without Redis."""

from __future__ import annotations

import argparse

import pytest

from pagedserve.services.scheduler.cluster.config import SERVICE_ACCOUNT_DIR, PodDeletionCostConfig
from pagedserve.services.scheduler.service_config import SchedulerServiceConfig
from pagedserve.services.serve_config import child_command, parse_serve_config
from pagedserve.shared.cli_config import add_config_arguments, config_from_args


def scheduler_config(argv: list[str], environ: dict[str, str] | None = None) -> SchedulerServiceConfig:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, SchedulerServiceConfig)
    return config_from_args(SchedulerServiceConfig, parser.parse_args(argv), environ or {})


def test_off_by_default_in_plain_serve_and_in_the_scheduler():
    serve = parse_serve_config(["models/SmolLM2-135M-Instruct"], prog="pagedserve serve", environ={})
    assert serve.scheduler.scale_down == PodDeletionCostConfig()
    assert serve.scheduler.scale_down.pod_deletion_cost is False
    assert not any("deletion-cost" in arg or "kubernetes" in arg for arg in child_command(serve, "scheduler"))
    assert scheduler_config([]).scale_down.pod_deletion_cost is False


def test_flags_and_environment_fill_it_as_the_manifests_do():
    config = scheduler_config(["--redis-url", "redis://redis:6379/0", "--pod-deletion-cost-interval-s", "15"],
                              {"PAGEDSERVE_POD_DELETION_COST": "true", "PAGEDSERVE_POD_NAME": "engine-abc",
                               "PAGEDSERVE_POD_NAMESPACE": "pagedserve"})
    assert config.scale_down == PodDeletionCostConfig(True, 15.0, "https://kubernetes.default.svc",
                                                      SERVICE_ACCOUNT_DIR, "engine-abc", "pagedserve")


def test_refused_without_redis():
    with pytest.raises(ValueError, match="--pod-deletion-cost needs --redis-url"):
        scheduler_config(["--pod-deletion-cost"])
