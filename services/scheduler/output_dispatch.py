"""Fan a step's outputs out to the streams of their requests, and end the requests that finished or failed.

The outputs of a step are held until `deliver`, which the loop calls once the next step is sent: each woken stream
then writes its chunk to the gateway while the worker computes, instead of all of them running before the step goes
out. An output for a request that is no longer live (aborted meanwhile) is dropped.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from pagedserve.services.grpc_errors import RequestFailed
from pagedserve.services.scheduler.live_request import Item, LiveRequests
from pagedserve.services.scheduler.request_observer import RequestObserver
from pagedserve.services.scheduler.scheduler import RequestRejected
from pagedserve.shared.request_io import RequestOutput
from pagedserve.shared.step_protocol import FailedRequest


class StateWriter(Protocol):
    def request_arrived(self, req_id: str, num_prompt_tokens: int, arrival_time_s: float) -> None: ...
    def request_first_token(self, req_id: str, num_cached_tokens: int) -> None: ...
    def request_finished(self, req_id: str, finish_reason: str, num_output_tokens: int,
                         num_cached_tokens: int) -> None: ...


def request_error(failure: FailedRequest) -> Exception:
    """A worker-reported failure as the error its stream ends with (a 400 for the client's own parameters)."""
    if failure.invalid_argument:
        return RequestRejected(failure.message)
    return RequestFailed(f"the worker failed on the request: {failure.message}")


class OutputDispatcher:
    def __init__(self, live: LiveRequests, state: StateWriter, observer: RequestObserver) -> None:
        self.live = live
        self.state = state
        self.observer = observer
        self._undelivered: list[tuple[asyncio.Queue[Item], Item]] = []  # the last step's outputs, not yet queued

    def dispatch(self, outputs: list[RequestOutput]) -> int:
        """Hold each output for its stream; a finished or failed request stops being live. Returns how many
        requests finished."""
        for out in outputs:
            live = self.live.get(out.req_id)
            if live is None:
                continue
            if out.error is not None:
                self._undelivered.append((live.queue, request_error(out.error)))
                self._end(out, "error")
                continue
            self._undelivered.append((live.queue, out))
            self.observer.produced(out)
            if out.num_output_tokens == len(out.new_token_ids):
                self.state.request_first_token(out.req_id, out.num_cached_tokens)
            if out.finished:
                self._end(out, out.finish_reason.value)
        return sum(1 for out in outputs if out.finished)

    def deliver(self) -> None:
        """Put the held outputs on their streams' queues."""
        for queue, item in self._undelivered:
            queue.put_nowait(item)
        self._undelivered.clear()

    def _end(self, out: RequestOutput, reason: str) -> None:
        self.live.pop(out.req_id)
        self.state.request_finished(out.req_id, reason, out.num_output_tokens, out.num_cached_tokens)
        self.observer.finished(out.req_id, reason, out.num_prompt_tokens, out.num_output_tokens)
