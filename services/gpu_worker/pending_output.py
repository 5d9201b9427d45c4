"""A step's sampled ids on their way from the device to the host, without a sync inside the step.

The ids and the rows' finite-logits flags go to the host in one non-blocking copy (into pinned memory on CUDA)
followed by an event; `result()` waits for that event, which the caller does only after it enqueued the next step,
and then appends each token to its request's mirror. Until then each sampling request carries
`pending = (serial, row)`, and a next step that computes that token takes it from `token_ids[row]` on the device.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from pagedserve.services.gpu_worker.request_state import RequestState
from pagedserve.shared.step_protocol import FailedRequest, StepOutput

log = logging.getLogger(__name__)


@dataclass
class PendingOutput:
    serial: int
    output: StepOutput  # timings set at launch; the samples are filled in by result()
    requests: list[RequestState] = field(default_factory=list)  # the sampling rows, in row order
    token_ids: torch.Tensor | None = None  # [S] on the device (None: the output was complete at launch)
    host: torch.Tensor | None = None  # [2, S]: ids, finite flags
    event: torch.cuda.Event | None = None
    resolved: bool = False

    @classmethod
    def done(cls, serial: int, output: StepOutput) -> PendingOutput:
        return cls(serial, output, resolved=True)

    @classmethod
    def start(cls, serial: int, output: StepOutput, requests: list[RequestState], token_ids: torch.Tensor,
              finite: torch.Tensor) -> PendingOutput:
        """Queue the copy to the host and mark each request's token as pending at its row."""
        packed = torch.stack([token_ids, finite.to(token_ids.dtype)])
        cuda = packed.device.type == "cuda"
        host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=cuda)
        host.copy_(packed, non_blocking=cuda)
        event = None
        if cuda:
            event = torch.cuda.Event()
            event.record()
        for row, request in enumerate(requests):
            request.pending = (serial, row)
        return cls(serial, output, list(requests), token_ids, host, event)

    def result(self) -> StepOutput:
        """The step's output, the samples appended to their mirrors (once; later calls return the same)."""
        if self.resolved:
            return self.output
        self.resolved = True
        if self.event is not None:
            self.event.synchronize()
        ids, finite = self.host.tolist()
        out = self.output
        for request, token_id, ok in zip(self.requests, ids, finite, strict=True):
            if request.pending is not None and request.pending[0] == self.serial:
                request.pending = None
            if request.dropped:
                continue
            if not ok:
                log.error("request %s failed in the worker: non-finite logits", request.req_id)
                request.dropped = True
                out.failed.append(FailedRequest(request.req_id, "non-finite logits", invalid_argument=False))
                continue
            request.token_ids.append(token_id)
            out.req_ids.append(request.req_id)
            out.sampled_token_ids.append(token_id)
            out.logprobs.append(None)
        return out
