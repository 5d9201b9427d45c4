"""The gateway app over a fake scheduler, as the unit tests drive it: a `Serving`, a test client, a passing checker.

`app_client` yields a client only once the app's health poll has seen the fake scheduler serving (unless told not
to wait), so no test races the first poll.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

from fastapi.testclient import TestClient

from pagedserve.services.gateway.api.serving import Serving
from pagedserve.services.gateway.app import create_app
from pagedserve.services.gateway.config import GatewayConfig
from pagedserve.services.gateway.structured.grammar_check import GrammarChecker
from pagedserve.services.gateway.structured.structured_outputs import Constraint
from pagedserve.shared.structured_output import StructuredOutput
from tests.support.waiting import wait_for
from tests.unit.gateway.conftest import MODEL_DIR
from tests.unit.gateway.fake_scheduler import FakeSchedulerClient, fake_replicas


class PassingChecker:
    """Stands in for the grammar check (tested on its own): every grammar compiles."""

    def __init__(self) -> None:
        self.checked: list[Constraint] = []

    async def check(self, constraint: Constraint, client: str = "") -> StructuredOutput:
        self.checked.append(constraint)
        return constraint.structured

    async def close(self) -> None:
        pass


def serving(tokenizer, fake: FakeSchedulerClient, model_dir: Path | str = MODEL_DIR, **config) -> Serving:
    """The app's state over one fake scheduler; config overrides GatewayConfig's defaults."""
    gateway_config = GatewayConfig(model_dir=str(model_dir), health_poll_interval_s=0.02, **config)
    return Serving(gateway_config, tokenizer, fake_replicas(fake), generation_defaults={})


@contextmanager
def app_client(state: Serving, wait_ready: bool = True) -> Iterator[TestClient]:
    with TestClient(create_app(state)) as client:
        if wait_ready:
            wait_for(lambda: state.ready, 10, 0.01, "the gateway's first health poll")
        yield client


@contextmanager
def checked_gateway(tokenizer, fake: FakeSchedulerClient,
                    **config) -> Iterator[tuple[TestClient, Serving, PassingChecker]]:
    """(client, state, checker) with a grammar checker that passes every grammar."""
    state = serving(tokenizer, fake, **config)
    checker = PassingChecker()
    state.grammar_checker = cast(GrammarChecker, checker)  # it answers `check` and `close` like the real one
    with app_client(state) as client:
        yield client, state, checker
