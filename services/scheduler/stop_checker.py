"""Stop conditions, checked after each sampled token."""

from __future__ import annotations

from pagedserve.services.scheduler.request import Request
from pagedserve.shared.request_io import FinishReason


def check_stop(request: Request, token_id: int, eos_token_ids: tuple[int, ...], max_model_len: int
               ) -> FinishReason | None:
    params = request.sampling
    if request.num_output_tokens >= params.min_tokens:
        if token_id in params.stop_token_ids or (not params.ignore_eos and token_id in eos_token_ids):
            return FinishReason.STOP
    if request.num_output_tokens >= params.max_tokens or request.num_tokens >= max_model_len:
        return FinishReason.LENGTH
    return None
