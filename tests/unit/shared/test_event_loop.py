import asyncio

import pytest
import uvloop

from pagedserve.services.gateway.config import GatewayConfig
from pagedserve.services.scheduler.service_config import SchedulerServiceConfig
from pagedserve.shared.cli_config import parse_config
from pagedserve.shared.event_loop import run


async def _loop_type() -> type:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop())


def test_run_uses_the_named_loop():
    assert issubclass(run(_loop_type(), "uvloop"), uvloop.Loop)
    assert not issubclass(run(_loop_type(), "asyncio"), uvloop.Loop)


def test_unknown_loop_is_refused_before_running():
    coro = _loop_type()
    with pytest.raises(ValueError, match="unknown event loop 'trio'.*uvloop, asyncio"):
        run(coro, "trio")
    coro.close()


def test_services_default_to_uvloop_and_httptools():
    gateway = parse_config(GatewayConfig, ["models/m"], "", positional=("model_dir",))
    assert (gateway.loop, gateway.http) == ("uvloop", "httptools")
    assert parse_config(SchedulerServiceConfig, [], "").loop == "uvloop"


@pytest.mark.parametrize("argv", [["m", "--loop", "trio"], ["m", "--http", "hyper"]])
def test_gateway_refuses_unknown_loop_or_parser(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        parse_config(GatewayConfig, argv, "", positional=("model_dir",))
    assert exited.value.code == 2
    assert "expected one of" in capsys.readouterr().err


def test_scheduler_refuses_unknown_loop(capsys):
    with pytest.raises(SystemExit):
        parse_config(SchedulerServiceConfig, ["--loop", "tokio"], "")
    assert "--loop: expected one of uvloop, asyncio, got 'tokio'" in capsys.readouterr().err


def test_the_standard_loop_and_h11_stay_selectable():
    gateway = parse_config(GatewayConfig, ["m", "--loop", "asyncio", "--http", "h11"], "", positional=("model_dir",))
    assert (gateway.loop, gateway.http) == ("asyncio", "h11")
