"""first_delta_or_error on its own: the pump behind a started stream stops however the response ends."""

from __future__ import annotations

import asyncio

from services.gateway.generation import ChoiceDelta
from services.gateway.streaming import first_delta_or_error


class StayingClient:
    async def is_disconnected(self) -> bool:
        return False


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
        stream = await first_delta_or_error(StayingClient(), endless())
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
        stream = await first_delta_or_error(StayingClient(), three())
        texts = [d.text async for d in stream.deltas]
        assert stream.pump.done()
        return texts

    assert asyncio.run(main()) == ["t0", "t1", "t2"]
