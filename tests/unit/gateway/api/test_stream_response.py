"""first_delta_or_error on its own: the pump behind a started stream stops however the response ends."""

from __future__ import annotations

import asyncio

import pytest

from pagedserve.services.gateway.api.generation import ChoiceDelta
from pagedserve.services.gateway.api.stream_response import first_delta_or_error
from pagedserve.services.gateway.http.admission import Admission
from pagedserve.services.gateway.http.errors import OpenAIError


class StayingClient:
    """A request whose client never leaves: its ASGI channel stays silent."""

    async def receive(self) -> dict:
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}


def _delta(i: int) -> ChoiceDelta:
    return ChoiceDelta(0, 0, f"t{i}", [], None, 3, 0, i + 1)


def test_close_stops_a_stream_whose_body_was_never_read() -> None:
    """The client left after the first delta but before the body started: close() (the response's background
    task) still closes the scheduler streams, which aborts their requests."""
    closed = asyncio.Event()

    async def endless():
        try:
            i = 0
            while True:
                yield _delta(i)
                i += 1
                await asyncio.sleep(0)
        finally:
            closed.set()

    async def main() -> None:
        stream = await first_delta_or_error(StayingClient(), endless(), Admission(8))
        await asyncio.sleep(0.01)  # the pump fills its buffer and waits
        assert not closed.is_set()
        await stream.close()
        assert closed.is_set() and stream.pump.done()

    asyncio.run(main())


def test_reading_the_stream_gives_every_delta_in_order_then_stops_the_pump() -> None:
    async def three():
        for i in range(3):
            yield _delta(i)

    async def main() -> list[str]:
        stream = await first_delta_or_error(StayingClient(), three(), Admission(8))
        texts = [d.text async for d in stream.deltas]
        assert stream.pump.done()
        return texts

    assert asyncio.run(main()) == ["t0", "t1", "t2"]


class LeavingClient:
    """A request whose client goes away after `after_s`: the channel carries http.disconnect then."""

    def __init__(self, after_s: float) -> None:
        self.after_s = after_s

    async def receive(self) -> dict:
        await asyncio.sleep(self.after_s)
        return {"type": "http.disconnect"}


def test_client_leaving_before_the_first_delta_is_a_499_that_closes_the_stream() -> None:
    closed = asyncio.Event()

    async def silent():
        try:
            await asyncio.Event().wait()  # the first token never comes
            yield _delta(0)
        finally:
            closed.set()

    async def main() -> None:
        with pytest.raises(OpenAIError) as caught:
            await asyncio.wait_for(first_delta_or_error(LeavingClient(0.05), silent(), Admission(8)), 2.0)
        assert caught.value.status == 499
        assert closed.is_set()

    asyncio.run(main())


def test_a_client_that_stays_gets_the_first_delta_and_its_watcher_is_gone() -> None:
    async def one():
        await asyncio.sleep(0.05)
        yield _delta(0)

    async def main() -> None:
        before = len(asyncio.all_tasks())
        stream = await first_delta_or_error(StayingClient(), one(), Admission(8))
        assert [d.text async for d in stream.deltas] == ["t0"]
        assert len(asyncio.all_tasks()) == before  # neither the pump nor the disconnect watcher is left

    asyncio.run(main())


async def _two_then_silence(closed: asyncio.Event):
    try:
        yield _delta(0)
        yield _delta(1)
        await asyncio.Event().wait()  # the scheduler has nothing more for now
    finally:
        closed.set()


def test_a_cut_ends_a_started_stream_that_waits_for_its_next_delta() -> None:
    """The drain deadline: the stream's reader gets the cut's error after what had come, and the request is
    aborted (its deltas closed), though no new delta arrives to notice it by."""
    async def main() -> None:
        admission, closed = Admission(8), asyncio.Event()
        stream = await first_delta_or_error(StayingClient(), _two_then_silence(closed), admission)
        texts = []
        with pytest.raises(OpenAIError) as caught:
            async for delta in stream.deltas:
                texts.append(delta.text)
                if len(texts) == 2:
                    assert admission.cut_all(OpenAIError(503, "shutting down")) == 1
        assert texts == ["t0", "t1"] and caught.value.status == 503
        assert closed.is_set()
        await stream.close()

    asyncio.run(main())


def test_a_cut_before_the_first_delta_is_the_requests_error() -> None:
    async def main() -> None:
        admission, closed = Admission(8), asyncio.Event()

        async def silent():
            try:
                await asyncio.Event().wait()
                yield _delta(0)
            finally:
                closed.set()

        asyncio.get_running_loop().call_later(0.05, admission.cut_all, OpenAIError(503, "shutting down"))
        with pytest.raises(OpenAIError) as caught:
            await asyncio.wait_for(first_delta_or_error(StayingClient(), silent(), admission), 5.0)
        assert caught.value.status == 503 and closed.is_set()
        assert admission.cut_all(OpenAIError(503, "again")) == 0  # released: nothing left to cut

    asyncio.run(main())
