"""Every service refuses an unknown name for a field with named choices at start-up: exit 2 naming the choices."""

from __future__ import annotations

import pytest

from pagedserve.services.gateway.config import GatewayConfig
from pagedserve.services.gpu_worker.service_config import WorkerServiceConfig
from pagedserve.services.scheduler.service_config import SchedulerServiceConfig
from pagedserve.shared.cli_config import parse_config

CASES = [
    (GatewayConfig, ["m", "--log-level", "verbose"], "--log-level: expected one of debug, info, warning, error"),
    (GatewayConfig, ["m", "--http", "hyper"], "--http: expected one of httptools, h11"),
    (SchedulerServiceConfig, ["--log-level", "trace"], "--log-level: expected one of debug, info, warning, error"),
    (WorkerServiceConfig, ["m", "--dtype", "float8"], "--dtype: expected one of auto, float32, bfloat16, float16"),
    (WorkerServiceConfig, ["m", "--kv-cache-dtype", "int8"], "--kv-cache-dtype: expected one of auto, float32"),
    (WorkerServiceConfig, ["m", "--kv-cache-dtype", "fp8_e5m2"],
     "--kv-cache-dtype: expected one of auto, float32, bfloat16, float16, fp8, fp8_e4m3"),
    (WorkerServiceConfig, ["m", "--attention-backend", "flash"], "--attention-backend: expected one of auto, torch"),
]


@pytest.mark.parametrize(("config", "argv", "message"), CASES)
def test_unknown_names_exit_2_with_the_choices(config, argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        parse_config(config, argv, "", positional=("model_dir",))
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_the_defaults_and_every_listed_name_are_accepted():
    worker = parse_config(WorkerServiceConfig, ["m"], "", positional=("model_dir",)).worker
    assert (worker.dtype, worker.kv_cache_dtype, worker.attention_backend) == ("auto", "auto", "auto")
    for name in ("float32", "bfloat16", "float16"):
        argv = ["m", "--dtype", name, "--kv-cache-dtype", name]
        assert parse_config(WorkerServiceConfig, argv, "", positional=("model_dir",)).worker.dtype == name
    for name in ("fp8", "fp8_e4m3"):  # vLLM's names for an e4m3 cache (the platform decides where it runs)
        argv = ["m", "--kv-cache-dtype", name]
        assert parse_config(WorkerServiceConfig, argv, "", positional=("model_dir",)).worker.kv_cache_dtype == name
    for level in ("debug", "info", "warning", "error"):
        assert parse_config(SchedulerServiceConfig, ["--log-level", level], "").log_level == level
