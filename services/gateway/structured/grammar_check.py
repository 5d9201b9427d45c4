"""Vet each new grammar before a request carries it: compiled once in a child process, within a time limit, so that
no grammar can stall the others.

- A pool of `num_children` children (grammar_child.py) compiles different grammars side by side. A compile past
  `timeout_s` is refused (400) and its child killed at that moment, freeing its slot; a spare child is started in
  the background so that the next grammar does not wait for a start.
- Each client (the caller's key) has at most `per_client` compiles in flight; its other grammars wait for its own
  slots, never for the pool, so one client's slow grammars occupy at most `per_client` children.
- Verdicts are cached by the grammar's key (refusals too: a slow grammar sent again is refused at once), and
  concurrent requests with one grammar share its one compile.

A grammar that compiles here compiles on the worker in about the same time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from dataclasses import replace

from pagedserve.services.gateway.http.errors import OpenAIError
from pagedserve.services.gateway.structured.grammar_child import GrammarChild, Verdict, child_command
from pagedserve.services.gateway.structured.structured_outputs import Constraint
from pagedserve.shared.structured_output import StructuredOutput

log = logging.getLogger(__name__)
MAX_CACHED = 4096


class GrammarChecker:
    def __init__(self, model_dir: str, vocab_size: int, stop_token_ids: tuple[int, ...], timeout_s: float,
                 num_children: int = 2, per_client: int = 1, command: list[str] | None = None) -> None:
        self.command = command or child_command(model_dir, vocab_size, stop_token_ids)
        self.timeout_s = timeout_s
        self.num_children = num_children
        self.per_client = per_client
        self._verdicts: OrderedDict[str, Verdict] = OrderedDict()
        self._in_flight: dict[str, asyncio.Future] = {}  # grammar key -> its compile's verdict
        self._idle: list[GrammarChild] = []
        self.children: list[GrammarChild] = []  # every live child, idle or compiling
        self._slots: asyncio.Semaphore | None = None  # made on the serving loop
        self._clients: dict[str, tuple[asyncio.Semaphore, int]] = {}  # client -> (its slots, requests using them)
        self._spares: set[asyncio.Task] = set()
        self.num_compiles = 0

    async def check(self, constraint: Constraint, client: str = "") -> StructuredOutput:
        """The constraint's grammar as the worker should compile it; a 400 naming its field when it is refused
        or takes longer than the time limit to compile."""
        structured = constraint.structured
        verdict = self._verdicts.get(structured.key)
        if verdict is None:
            verdict = await self._shared_compile(structured, client)
        else:
            self._verdicts.move_to_end(structured.key)
        if verdict.kind is None:
            raise OpenAIError(400, f"{constraint.param}: {verdict.error}", param=constraint.param,
                              code="invalid_grammar")
        return replace(structured, kind=verdict.kind)

    async def close(self) -> None:
        """Stop every child (they hold no state worth keeping) and wait until they are gone."""
        for task in list(self._spares):
            task.cancel()
        await asyncio.gather(*self._spares, return_exceptions=True)
        children, self.children, self._idle = self.children, [], []
        await asyncio.gather(*(child.close() for child in children))

    async def _shared_compile(self, structured: StructuredOutput, client: str) -> Verdict:
        """One compile per grammar key at a time: later callers await the first one's verdict."""
        future = self._in_flight.get(structured.key)
        if future is not None:
            return await asyncio.shield(future)
        future = asyncio.get_running_loop().create_future()
        self._in_flight[structured.key] = future
        try:
            verdict = await self._client_compile(structured, client)
            self._remember(structured.key, verdict)
            future.set_result(verdict)
            return verdict
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when nobody else waited
            raise
        finally:
            del self._in_flight[structured.key]

    async def _client_compile(self, structured: StructuredOutput, client: str) -> Verdict:
        slots, users = self._clients.get(client) or (asyncio.Semaphore(self.per_client), 0)
        self._clients[client] = (slots, users + 1)
        try:
            async with slots:
                self._slots = self._slots or asyncio.Semaphore(self.num_children)
                async with self._slots:
                    return await self._compile(structured)
        finally:
            slots, users = self._clients[client]
            if users == 1:
                del self._clients[client]
            else:
                self._clients[client] = (slots, users - 1)

    async def _compile(self, structured: StructuredOutput) -> Verdict:
        child = self._idle.pop() if self._idle else await self._new_child()
        self.num_compiles += 1
        verdict = await child.compile(structured, self.timeout_s)
        if child.alive:
            self._idle.append(child)
            return verdict
        self.children.remove(child)
        self._start_spare()
        log.warning("a %s grammar was refused and its child stopped: %s", structured.kind.value, verdict.error)
        return verdict

    async def _new_child(self) -> GrammarChild:
        """A started child; one retry when a start fails (seen once under heavy load)."""
        for attempt in (1, 2):
            child = GrammarChild(self.command)
            try:
                await child.start()
            except RuntimeError as exc:
                if attempt == 2:
                    raise
                log.warning("%s; retrying", exc)
                continue
            self.children.append(child)
            return child
        raise AssertionError("unreachable")

    def _start_spare(self) -> None:
        """Start a child in the background for the next grammar, unless the pool already holds enough."""
        if len(self.children) + len(self._spares) >= self.num_children:
            return

        async def spare() -> None:
            with contextlib.suppress(RuntimeError):
                self._idle.append(await self._new_child())

        task = asyncio.create_task(spare())
        self._spares.add(task)
        task.add_done_callback(self._spares.discard)

    def _remember(self, key: str, verdict: Verdict) -> None:
        self._verdicts[key] = verdict
        while len(self._verdicts) > MAX_CACHED:
            self._verdicts.popitem(last=False)
