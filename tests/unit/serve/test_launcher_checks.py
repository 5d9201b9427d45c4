"""Before `serve` starts anything: the model folder is checked (one line, exit 2), a taken gateway port is an error,
a taken default internal port moves to a free one, and a taken port chosen explicitly is an error naming its flag."""

from __future__ import annotations

import socket

import pytest

from pagedserve.services import launcher
from pagedserve.services.ports import PortInUseError, free_port
from pagedserve.services.serve_config import child_command, parse_serve_config

MODEL = "models/SmolLM2-135M-Instruct"


@pytest.fixture
def listening():
    """Listen on free ports of 127.0.0.1 as another process would; returns a function giving one more port."""
    sockets = []

    def take() -> int:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        sockets.append(sock)
        return sock.getsockname()[1]

    yield take
    for sock in sockets:
        sock.close()


def test_missing_model_folder_exits_2_with_one_line_before_starting_anything(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(launcher, "start_children", lambda config: pytest.fail("a service was started"))
    for model_dir, reason in ((tmp_path / "nope", "does not exist"), (tmp_path, "has no config.json")):
        assert launcher.main([str(model_dir), "--port", str(free_port())], prog="pagedserve serve") == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and reason in err and str(model_dir) in err, err
        assert err.startswith("pagedserve serve: error: model folder")


def test_taken_gateway_port_exits_2_naming_port_and_flag(monkeypatch, capsys, listening, smollm2_dir):
    monkeypatch.setattr(launcher, "start_children", lambda config: pytest.fail("a service was started"))
    port = listening()
    assert launcher.main([str(smollm2_dir), "--port", str(port)], prog="pagedserve serve") == 2
    err = capsys.readouterr().err
    assert f"port {port} on 127.0.0.1 is already in use" in err and "--port" in err


def test_taken_default_internal_ports_move_to_free_ones(listening):
    scheduler_port, worker_port = listening(), listening()
    config = parse_serve_config([MODEL, "--port", str(free_port())], environ={})
    config = launcher.with_ports(config, scheduler_port, worker_port)  # as if these were the defaults
    said: list[str] = []
    moved = launcher.resolve_ports(config, said.append)
    assert moved.scheduler.scheduler_port not in (scheduler_port, worker_port)
    assert moved.worker.worker_port not in (scheduler_port, worker_port, moved.scheduler.scheduler_port)
    assert moved.gateway.scheduler_address == f"127.0.0.1:{moved.scheduler.scheduler_port}"
    assert moved.scheduler.worker_address == f"127.0.0.1:{moved.worker.worker_port}"
    assert f"port {scheduler_port} for the scheduler's gRPC server is in use: using " \
           f"{moved.scheduler.scheduler_port} instead (choose one with --scheduler-port)" in said
    assert len(said) == 2


@pytest.mark.parametrize("source", ["flag", "environment"])
def test_taken_explicit_internal_port_is_an_error(listening, source):
    port = listening()
    argv, environ = [MODEL, "--port", str(free_port())], {}
    if source == "flag":
        argv += ["--worker-port", str(port)]
    else:
        environ["PAGEDSERVE_WORKER_PORT"] = str(port)
    config = parse_serve_config(argv, environ=environ)
    with pytest.raises(PortInUseError, match=f"port {port} on 127.0.0.1 is already in use.*--worker-port"):
        launcher.resolve_ports(config, print)


def test_free_ports_stay_and_one_port_is_not_given_twice():
    port = free_port()
    config = parse_serve_config([MODEL, "--port", str(port), "--scheduler-port", str(free_port()), "--worker-port",
                                 str(free_port())], environ={})
    kept = launcher.resolve_ports(config, pytest.fail)
    assert kept.scheduler.scheduler_port == config.scheduler.scheduler_port
    clash = parse_serve_config([MODEL, "--port", str(port), "--scheduler-port", str(port)], environ={})
    with pytest.raises(PortInUseError, match="--scheduler-port"):
        launcher.resolve_ports(clash, print)


def test_scheduler_metrics_port_defaults_to_8001_moves_when_taken_and_may_be_turned_off(monkeypatch, listening):
    config = parse_serve_config([MODEL, "--port", str(free_port())], environ={})
    taken = listening()
    monkeypatch.setattr(launcher, "SERVE_METRICS_PORT", taken)  # the default port, held by another process
    said: list[str] = []
    moved = launcher.resolve_ports(config, said.append)
    assert moved.scheduler.metrics_port not in (0, taken) and "--metrics-port" in said[-1]
    command = child_command(moved, "scheduler")  # the child is told where
    assert command[command.index("--metrics-port") + 1] == str(moved.scheduler.metrics_port)
    monkeypatch.setattr(launcher, "SERVE_METRICS_PORT", free_port())
    assert launcher.resolve_ports(config, said.append).scheduler.metrics_port == launcher.SERVE_METRICS_PORT
    off = parse_serve_config([MODEL, "--port", str(free_port()), "--metrics-port", "0"], environ={})
    assert launcher.resolve_ports(off, said.append).scheduler.metrics_port == 0
    explicit = parse_serve_config([MODEL, "--port", str(free_port()), "--metrics-port", str(taken)], environ={})
    with pytest.raises(PortInUseError, match="--metrics-port"):
        launcher.resolve_ports(explicit, said.append)


def test_the_ready_banner_does_not_print_the_api_key():
    config = parse_serve_config([MODEL, "--api-key", "hunter2-api-key"], "pagedserve serve")
    banner = launcher.ready_banner(config, "SmolLM2-135M-Instruct")
    assert "hunter2-api-key" not in banner and "Authorization: Bearer $PAGEDSERVE_API_KEY" in banner
