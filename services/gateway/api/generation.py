"""Run the choices of one API request: one scheduler stream per choice, detokenized, stop strings applied.

A choice whose replica fails or drains is resumed on another (resumption.py) below this module: the detokenizer and
the stop-string state here carry on across the resume, so the client sees one stream.
A choice that hits a stop string closes its stream, which cancels the gRPC call and aborts the request in the
scheduler. Closing the merged iterator (the client went away) closes every choice the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from pagedserve.services.gateway.routing.resumption import generate_resuming
from pagedserve.services.gateway.routing.router import Router
from pagedserve.services.gateway.text.detokenizer import IncrementalDetokenizer
from pagedserve.services.gateway.text.stop_strings import StopStringMatcher
from pagedserve.services.gateway.text.tokenizer import PromptTokenizer
from pagedserve.shared.request_io import GenerateRequest
from pagedserve.shared.step_protocol import TokenLogprobs


@dataclass(frozen=True)
class ChoiceJob:
    index: int  # the choice's index in the response
    prompt_index: int  # which prompt it continues (completions may send several)
    request: GenerateRequest
    stop: list[str]
    include_stop: bool = False  # the stop string that ended the choice stays in its text


@dataclass
class ChoiceDelta:
    index: int
    prompt_index: int
    text: str
    logprobs: list[TokenLogprobs]  # of the tokens consumed since the previous delta, when asked
    finish_reason: str | None  # stop / length / abort on the last delta of the choice
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int  # up to the token that ended the choice (a stop string's included)
    prompt_logprobs: list[TokenLogprobs] | None = None  # on the choice's first delta, when asked


@dataclass
class ChoiceResult:
    """A whole choice, for non-streaming responses."""

    index: int
    prompt_index: int
    text: str = ""
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_output_tokens: int = 0
    prompt_logprobs: list[TokenLogprobs] | None = None  # one per prompt token after the first, when asked

    def add(self, delta: ChoiceDelta) -> None:
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs
        self.text += delta.text
        self.logprobs.extend(delta.logprobs)
        self.finish_reason = delta.finish_reason or self.finish_reason
        self.num_prompt_tokens, self.num_cached_tokens = delta.num_prompt_tokens, delta.num_cached_tokens
        self.num_output_tokens = delta.num_output_tokens


async def stream_choice(router: Router, tokenizer: PromptTokenizer, job: ChoiceJob, served_by: list[str]
                        ) -> AsyncIterator[ChoiceDelta]:
    """The choice's deltas; the name of the replica that serves it is appended to `served_by` at its first output."""
    detokenizer = IncrementalDetokenizer(tokenizer, job.request.prompt_token_ids)
    stops = StopStringMatcher(job.stop, job.include_stop)
    pending_logprobs: list[TokenLogprobs] = []
    prompt_logprobs, prompt_seen = None, False  # the first copy only (a resumed choice's replica sends its own)
    async with contextlib.aclosing(generate_resuming(router, job.request, served_by)) as outputs:
        async for out in outputs:
            if out.prompt_logprobs is not None and not prompt_seen:
                prompt_logprobs, prompt_seen = out.prompt_logprobs, True
            pending_logprobs.extend(lp for lp in out.new_logprobs if lp is not None)
            text = detokenizer.add(out.new_token_ids) + (detokenizer.flush() if out.finished else "")
            text = stops.feed(text, final=out.finished)
            finish = "stop" if stops.stopped else (out.finish_reason.value if out.finished else None)
            if text or finish:
                yield ChoiceDelta(job.index, job.prompt_index, text, pending_logprobs, finish, out.num_prompt_tokens,
                                  out.num_cached_tokens, out.num_output_tokens, prompt_logprobs)
                pending_logprobs, prompt_logprobs = [], None
            if finish:
                return


_DONE = object()


async def merge_choices(streams: list[AsyncIterator[ChoiceDelta]]) -> AsyncIterator[ChoiceDelta]:
    """Deltas of all choices as they come; an error in one choice ends them all."""
    if len(streams) == 1:
        async with contextlib.aclosing(streams[0]) as only:
            async for delta in only:
                yield delta
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(stream: AsyncIterator[ChoiceDelta]) -> None:
        try:
            async with contextlib.aclosing(stream) as deltas:
                async for delta in deltas:
                    queue.put_nowait(delta)
        except Exception as exc:
            queue.put_nowait(exc)
        finally:
            queue.put_nowait(_DONE)

    tasks = [asyncio.create_task(pump(stream)) for stream in streams]
    try:
        num_running = len(tasks)
        while num_running:
            item = await queue.get()
            if item is _DONE:
                num_running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def collect_choices(deltas: AsyncIterator[ChoiceDelta], jobs: list[ChoiceJob]) -> list[ChoiceResult]:
    results = [ChoiceResult(job.index, job.prompt_index) for job in jobs]
    async with contextlib.aclosing(deltas) as stream:
        async for delta in stream:
            results[delta.index].add(delta)
    return results
