"""The scheduler's leak check: plain code that still catches a leak under `python -O`, the request states it
accepts, and the engine loop running it at every idle in debug mode."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pagedserve.services.scheduler.engine_loop import EngineLoop
from pagedserve.services.scheduler.in_flight import InFlight, StepsInFlight
from pagedserve.services.scheduler.integrity import check_integrity
from pagedserve.services.scheduler.invariants import InvariantViolated
from pagedserve.services.scheduler.live_request import LiveRequest, LiveRequests
from pagedserve.services.scheduler.redis_state import NullStateWriter
from pagedserve.services.scheduler.scheduler import Scheduler, SchedulerOutput
from pagedserve.services.scheduler.scheduler_config import SchedulerConfig
from pagedserve.shared.request_io import GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams
from pagedserve.shared.step_protocol import StepInput
from pagedserve.shared.structured_output import StructuredOutput, StructuredOutputKind
from tests.support.fake_worker_client import DESCRIPTION, FakeWorkerClient
from tests.unit.scheduler_service.engine_harness import outputs_of
from tests.unit.scheduler_service.test_engine_loop import request

REPO = Path(__file__).resolve().parents[3]

LEAK_UNDER_O = textwrap.dedent("""
    from pagedserve.services.scheduler.integrity import check_integrity
    from pagedserve.services.scheduler.scheduler import Scheduler
    from pagedserve.services.scheduler.scheduler_config import SchedulerConfig
    from pagedserve.shared.request_io import GenerateRequest
    from pagedserve.shared.sampling_params import SamplingParams
    from tests.support.fake_worker_client import DESCRIPTION

    if __debug__:
        raise SystemExit("not running under python -O")
    scheduler = Scheduler(SchedulerConfig(), DESCRIPTION)
    scheduler.add_request(GenerateRequest("r", list(range(10, 19)), SamplingParams(max_tokens=2)))
    scheduler.schedule()
    sound = check_integrity(scheduler, {"r"})
    scheduler.running.remove(scheduler.requests.pop("r"))  # finished without freeing its blocks: a leak
    leaked = check_integrity(scheduler, set())
    print(sound.ok, sound.num_used_blocks, "|", leaked.ok, leaked.num_used_blocks, "|", leaked.problem)
""")


def test_the_check_catches_a_leak_under_python_dash_o():
    result = subprocess.run([sys.executable, "-O", "-c", LEAK_UNDER_O], cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    sound, leaked, problem = result.stdout.strip().split(" | ")
    assert sound == "True 3" and leaked == "False 3"
    assert problem == "finished requests hold blocks: {'r'}"


def test_a_request_compiling_its_grammar_is_in_a_state_of_its_own():
    scheduler = Scheduler(SchedulerConfig(), DESCRIPTION)
    structured = StructuredOutput(StructuredOutputKind.REGEX, "[ab]+")
    scheduler.add_request(GenerateRequest("g", [10, 11], SamplingParams(max_tokens=2, structured_output=structured)))
    scheduler.add_request(GenerateRequest("w", [10, 11], SamplingParams(max_tokens=2)))
    assert check_integrity(scheduler, {"g", "w"}).ok
    scheduler.waiting.append(scheduler.preparing["g"])  # admitted while still compiling: in two states
    report = check_integrity(scheduler, {"g", "w"})
    assert not report.ok and "in two" in report.problem


@pytest.mark.asyncio
async def test_a_request_is_live_once_and_steps_in_flight_stay_bounded():
    live = LiveRequests()
    live.add(LiveRequest("r", asyncio.Queue()))
    with pytest.raises(InvariantViolated, match="live twice"):
        live.add(LiveRequest("r", asyncio.Queue()))
    steps = StepsInFlight(max_in_flight=1)
    step = InFlight(SchedulerOutput(StepInput()), asyncio.get_running_loop().create_future(), 0.0, False, None)
    steps.append(step)
    with pytest.raises(InvariantViolated, match="more than 1 steps in flight"):
        steps.append(step)


@pytest.mark.asyncio
async def test_debug_mode_checks_at_every_idle_and_stops_the_loop_on_a_leak():
    loop = EngineLoop(Scheduler(SchedulerConfig(), DESCRIPTION), FakeWorkerClient(), NullStateWriter(),
                      async_scheduling=True, check_integrity_when_idle=True)
    run = asyncio.create_task(loop.run())
    try:
        await outputs_of(loop.add_request(request("a")))  # idles after it: the check passes
        assert not run.done()
        loop.scheduler.kv.blocks_of["gone"] = []  # a finished request still listed as a block holder
        await outputs_of(loop.add_request(request("b")))
        with pytest.raises(InvariantViolated, match="finished requests hold blocks: {'gone'}"):
            await asyncio.wait_for(run, 5)
    finally:
        run.cancel()
