"""The example secrets are refused at start by every service, with one line naming the flag and exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pagedserve.services.gateway.config import GatewayConfig
from pagedserve.services.gpu_worker.service_config import WorkerServiceConfig
from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from pagedserve.services.scheduler.admission import AdmissionConfig
from pagedserve.services.scheduler.redis_state import RedisStateConfig
from pagedserve.services.scheduler.scheduler_config import SchedulerConfig
from pagedserve.services.scheduler.service_config import SchedulerServiceConfig
from pagedserve.shared.placeholder_secrets import EXAMPLE_VALUES, is_placeholder
from tests.integration.processes import MODEL_DIR, REPO

EXAMPLE = REPO / "deploy/k8s/base/secrets.env.example"


def example_values() -> set[str]:
    lines = [line for line in EXAMPLE.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return {line.split("=", 1)[1].strip() for line in lines}


def test_every_example_value_is_known_as_a_placeholder():
    assert example_values() == set(EXAMPLE_VALUES)


@pytest.mark.parametrize("value", ["replace-me-with-a-random-internal-token", " CHANGE-ME ", "changeme", "placeholder"])
def test_placeholders_are_recognised(value):
    assert is_placeholder(value)


@pytest.mark.parametrize("value", ["3f5e0c9d2b7a41e8a6c4d1f0b9e8a7c6", "not-a-placeholder", "my-change-me-token"])
def test_real_looking_values_pass(value):
    assert not is_placeholder(value)


def test_configs_refuse_placeholders_and_take_real_values():
    token, key = sorted(EXAMPLE_VALUES, key=lambda v: "api" in v)  # internal token, then api key
    with pytest.raises(ValueError, match="--internal-token is an example placeholder"):
        GatewayConfig(model_dir=str(MODEL_DIR), internal_token=token)
    with pytest.raises(ValueError, match="--api-key is an example placeholder"):
        GatewayConfig(model_dir=str(MODEL_DIR), api_key=key)
    with pytest.raises(ValueError, match="--internal-token"):
        SchedulerServiceConfig(SchedulerConfig(), RedisStateConfig(), AdmissionConfig(), internal_token=token)
    with pytest.raises(ValueError, match="--internal-token"):
        WorkerServiceConfig(WorkerConfig(model_dir=str(MODEL_DIR)), internal_token=token)
    assert GatewayConfig(model_dir=str(MODEL_DIR), internal_token="a" * 32, api_key="b" * 32).api_key == "b" * 32


@pytest.mark.parametrize("module, args", [
    ("pagedserve.services.gateway", [str(MODEL_DIR)]),
    ("pagedserve.services.scheduler", []),
    ("pagedserve.services.gpu_worker", [str(MODEL_DIR)]),
])
def test_each_service_refuses_to_start_with_the_example_token(module, args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAGEDSERVE_")}
    env["PAGEDSERVE_INTERNAL_TOKEN"] = "replace-me-with-a-random-internal-token"
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    errors = [line for line in done.stderr.splitlines() if "placeholder" in line]
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert len(errors) == 1 and "--internal-token is an example placeholder" in errors[0], done.stderr[-2000:]
