"""`pagedserve serve` takes every flag of the services it starts (vLLM's names where they exist), passes each child
the flags given for it, keeps secrets off command lines, and shows its help grouped by service."""

from __future__ import annotations

import dataclasses

import pytest

from pagedserve.services.gateway.config import GatewayConfig
from pagedserve.services.gpu_worker.service_config import WorkerServiceConfig
from pagedserve.services.scheduler.service_config import SchedulerServiceConfig
from pagedserve.services.serve_config import (
    SERVICES,
    WIRING,
    build_parser,
    child_command,
    child_environment,
    parse_serve_config,
)
from pagedserve.shared.cli_config import flag_name, leaf_fields

MODEL = "models/SmolLM2-135M-Instruct"
# vLLM's `vllm serve` flags that pagedserve has under the same name (or as an alias)
VLLM_FLAGS = ["--served-model-name", "x", "--max-model-len", "1024", "--max-num-seqs", "8",
              "--max-num-batched-tokens", "256", "--block-size", "32", "--enable-prefix-caching", "--dtype", "float32",
              "--kv-cache-memory-bytes", "1GiB", "--gpu-memory-utilization", "0.5", "--api-key", "secret",
              "--host", "0.0.0.0", "--port", "9000", "--enable-chunked-prefill", "--kv-cache-dtype", "float16"]


def parse(*argv: str, environ: dict[str, str] | None = None):
    return parse_serve_config([*argv], prog="pagedserve serve", environ=environ or {})


def test_every_service_field_is_a_serve_flag():
    dests = {action.dest for action in build_parser()._actions}
    for cls, _, _ in SERVICES.values():
        missing = {f.name for f, _ in leaf_fields(cls)} - set(WIRING) - dests
        assert not missing, f"{cls.__name__} fields without a serve flag: {missing}"


def test_a_new_service_field_shows_up_in_serve_without_editing_it(monkeypatch):
    @dataclasses.dataclass(frozen=True)
    class Extended(SchedulerServiceConfig):
        async_scheduling: bool = False  # a field some later change adds to the scheduler

    monkeypatch.setitem(SERVICES, "scheduler", (Extended, *SERVICES["scheduler"][1:]))
    config = parse(MODEL, "--async-scheduling")
    assert config.scheduler.async_scheduling is True
    assert "--async-scheduling" in child_command(config, "scheduler")
    assert "--async-scheduling" not in child_command(config, "worker")


def test_vllm_names_reach_the_right_services():
    config = parse(MODEL, *VLLM_FLAGS)
    worker, scheduler, gateway = config.worker.worker, config.scheduler.scheduler, config.gateway
    assert (worker.model_name, worker.max_model_len, worker.block_size, worker.dtype) == ("x", 1024, 32, "float32")
    assert (worker.kv_cache_memory_bytes, worker.gpu_memory_utilization) == (1024**3, 0.5)
    assert (scheduler.max_num_seqs, scheduler.max_num_batched_tokens, scheduler.enable_prefix_caching) == (8, 256, True)
    assert (gateway.host, gateway.port, gateway.api_key) == ("0.0.0.0", 9000, "secret")
    scheduler_argv = child_command(config, "scheduler")
    assert scheduler_argv[scheduler_argv.index("--max-num-seqs") + 1] == "8"
    worker_argv = child_command(config, "worker")  # the worker captures no decode graph past the batch limit
    assert worker_argv[worker_argv.index("--max-num-seqs") + 1] == "8"
    assert "--max-num-seqs" not in child_command(config, "gateway")
    worker_argv = child_command(config, "worker")
    assert worker_argv[3] == MODEL and worker_argv[worker_argv.index("--model-name") + 1] == "x"


def test_one_speculative_config_reaches_the_scheduler_and_the_worker():
    """The scheduler plans draft positions from it, the worker loads the draft model it names."""
    text = '{"method": "draft_model", "model": "models/draft", "num_speculative_tokens": 3}'
    config = parse(MODEL, "--speculative-config", text)
    assert config.scheduler.scheduler.speculative_config == config.worker.worker.speculative_config == text
    assert config.worker.worker.draft_model_dir == "models/draft"
    for name in ("scheduler", "worker"):
        argv = child_command(config, name)
        assert argv[argv.index("--speculative-config") + 1] == text
    assert "--speculative-config" not in child_command(config, "gateway")


def test_children_parse_their_commands_into_the_same_configs():
    config = parse(MODEL, *VLLM_FLAGS, "--log-level", "debug", "--no-torch-compile", "--redis-url", "redis://r:1/0")
    env = child_environment(config, {})
    for name, (cls, _, _) in SERVICES.items():
        argv = child_command(config, name)[3:]
        from pagedserve.shared.cli_config import parse_config

        positional = ("model_dir",) if cls is not SchedulerServiceConfig else ()
        with pytest.MonkeyPatch.context() as patch:
            for key, value in env.items():
                patch.setenv(key, value)
            assert parse_config(cls, argv, "", positional=positional) == config.services[name], name


def test_secrets_go_through_the_environment_not_the_command_line():
    config = parse(MODEL, "--api-key", "secret")
    assert all("secret" not in child_command(config, name) for name in SERVICES)
    env = child_environment(config, {"PATH": "/bin"})
    assert env.pop("PAGEDSERVE_INTERNAL_TOKEN") == config.scheduler.internal_token  # random, see test_internal_auth
    assert env == {"PATH": "/bin", "PYTHONUNBUFFERED": "1", "PAGEDSERVE_API_KEY": "secret"}


@pytest.mark.parametrize(("argv", "expected"), [
    ([MODEL, "--enable-prefix-caching"], True),
    (["--enable-prefix-caching", MODEL], True),  # a bare bool flag does not swallow the model folder
    ([MODEL, "--enable-prefix-caching", "false"], False),
    ([MODEL, "--enable-prefix-caching=no"], False),
    ([MODEL, "--no-enable-prefix-caching"], False),
    (["--no-enable-prefix-caching", MODEL], False),
])
def test_bool_flags_work_bare_with_a_value_and_negated(argv, expected):
    config = parse(*argv)
    assert config.launcher.model_dir == MODEL
    assert config.scheduler.scheduler.enable_prefix_caching is expected


def test_environment_reaches_serve_and_flags_beat_it():
    config = parse(MODEL, environ={"PAGEDSERVE_MAX_NUM_SEQS": "8", "PAGEDSERVE_BLOCK_SIZE": "32"})
    assert (config.scheduler.scheduler.max_num_seqs, config.worker.worker.block_size) == (8, 32)
    assert "--max-num-seqs" not in child_command(config, "scheduler")  # inherited with the environment
    assert {"max_num_seqs", "block_size"} <= config.explicit
    assert parse(MODEL, "--max-num-seqs", "4", environ={"PAGEDSERVE_MAX_NUM_SEQS": "8"}).scheduler.scheduler \
        .max_num_seqs == 4


@pytest.mark.parametrize(("argv", "message"), [
    ([MODEL, "--max-num-seqs", "lots"], "--max-num-seqs"),
    ([MODEL, "--max-num-seqs", "0"], "max_num_seqs must be positive"),
    ([MODEL, "--log-level", "loud"], "--log-level: expected one of debug, info, warning, error"),
    ([MODEL, "--dtype", "float8"], "--dtype: expected one of auto, float32, bfloat16, float16"),
    ([MODEL, "--pipeline-parallel-size", "2"], "unrecognized arguments: --pipeline-parallel-size"),
    ([MODEL, "--no-enable-prefix-caching=true"], "--no-enable-prefix-caching takes no value"),
    ([], "model_dir is required"),
])
def test_bad_values_exit_2_naming_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        parse(*argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_the_internal_wiring_is_the_launchers():
    config = parse(MODEL, "--scheduler-port", "7001", "--worker-port", "7002")
    assert config.scheduler.worker_address == "127.0.0.1:7002"
    assert config.gateway.scheduler_address == "127.0.0.1:7001"
    for flag in ("--scheduler-address", "--worker-address", "--worker-host", "--scheduler-host"):
        with pytest.raises(SystemExit):
            parse(MODEL, flag, "10.0.0.1:1")


def test_help_is_grouped_by_service_with_defaults_and_variables():
    text = " ".join(build_parser("pagedserve serve").format_help().split())
    sections = ["serve:", "shared: passed to every service that has it:", "worker: model, KV cache, device:",
                "scheduler: batching, KV blocks, prefix cache, Redis:",
                "gateway: HTTP, OpenAI API, tokenizer, chat template:"]
    positions = [text.index(section) for section in sections]
    assert positions == sorted(positions)
    assert ("--max-num-seqs INT running requests at most (the scheduler's limit; no decode graph past it) "
            "(worker, scheduler) [env PAGEDSERVE_MAX_NUM_SEQS; default 64]") in text
    assert "--enable-prefix-caching [BOOL], --no-enable-prefix-caching" in text
    assert "--model-name STR, --served-model-name STR" in text
    assert "[env PAGEDSERVE_KV_CACHE_MEMORY_BYTES; default 4GiB]" in text
    assert "(worker, scheduler, gateway) [env PAGEDSERVE_LOG_LEVEL; default 'info']" in text
    for cls in (GatewayConfig, SchedulerServiceConfig, WorkerServiceConfig):
        for f, _ in leaf_fields(cls):
            if f.name not in WIRING and f.name != "model_dir":
                assert flag_name(f.name) in text, f.name


def test_a_redis_url_goes_through_the_environment_too():
    """It may hold the Redis password: never on a command line, where `ps` shows it."""
    url = "redis://:hunter2@cache:6379/0"
    config = parse(MODEL, "--redis-url", url)
    assert all(url not in child_command(config, name) for name in SERVICES)
    assert child_environment(config, {})["PAGEDSERVE_REDIS_URL"] == url
