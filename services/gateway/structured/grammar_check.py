"""Vet each new grammar before a request carries it: compiled once in a child process, within a time limit.

The grammar engine compiles in native code that cannot be interrupted, and some schemas take minutes or hours
(deeply nested objects grow the grammar exponentially). A child process (`python -m
services.gateway.structured.grammar_check`, JSON lines on its stdin and stdout) can be killed: a grammar that does not
compile within `timeout_s` is a 400, the child is replaced, and the worker never sees that grammar. A grammar that
compiles here compiles on the worker in about the same time. Results are cached by the grammar's key, so each
distinct grammar is compiled here once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
from collections import OrderedDict
from dataclasses import dataclass, replace

from services.gateway.http.errors import OpenAIError
from services.gateway.structured.structured_outputs import Constraint
from shared.structured_output import StructuredOutput, StructuredOutputKind

log = logging.getLogger(__name__)
MAX_CACHED = 4096
START_TIMEOUT_S = 300.0  # importing xgrammar and loading the tokenizer, on a busy machine


@dataclass(frozen=True)
class Verdict:
    kind: StructuredOutputKind | None  # the kind that compiled (a grammar may turn out to be Lark); None: refused
    error: str = ""


class GrammarChecker:
    def __init__(self, model_dir: str, vocab_size: int, stop_token_ids: tuple[int, ...], timeout_s: float) -> None:
        self.model_dir = model_dir
        self.vocab_size = vocab_size
        self.stop_token_ids = stop_token_ids
        self.timeout_s = timeout_s
        self._verdicts: OrderedDict[str, Verdict] = OrderedDict()
        self._lock: asyncio.Lock | None = None  # one compile at a time in the one child (made on the serving loop)
        self._child: asyncio.subprocess.Process | None = None
        self.num_compiles = 0

    async def check(self, constraint: Constraint) -> StructuredOutput:
        """The constraint's grammar as the worker should compile it; a 400 naming its field when it is refused
        or takes longer than the time limit to compile."""
        structured = constraint.structured
        verdict = self._verdicts.get(structured.key)
        if verdict is None:
            self._lock = self._lock or asyncio.Lock()
            async with self._lock:
                verdict = self._verdicts.get(structured.key) or await self._compile(structured)
            self._remember(structured.key, verdict)
        else:
            self._verdicts.move_to_end(structured.key)
        if verdict.kind is None:
            raise OpenAIError(400, f"{constraint.param}: {verdict.error}", param=constraint.param,
                              code="invalid_grammar")
        return replace(structured, kind=verdict.kind)

    async def close(self) -> None:
        """Stop the child (it holds no state worth keeping) and wait until it is gone."""
        child, self._child = self._child, None
        if child is None:
            return
        if child.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
        await child.wait()

    async def _compile(self, structured: StructuredOutput) -> Verdict:
        child = await self._started_child()
        self.num_compiles += 1
        request = {"kind": structured.kind.value, "spec": structured.spec, "any_whitespace": structured.any_whitespace}
        child.stdin.write((json.dumps(request) + "\n").encode())
        try:
            await child.stdin.drain()
            line = await asyncio.wait_for(child.stdout.readline(), self.timeout_s)
        except TimeoutError:  # too slow: only killing the child stops the compile
            await self.close()
            log.warning("a %s grammar did not compile within %g s; refused", structured.kind.value, self.timeout_s)
            return Verdict(None, f"the grammar did not compile within {self.timeout_s:g} s; simplify it "
                                 f"(deeply nested or very long bounded structures compile slowly)")
        except (ConnectionError, BrokenPipeError):
            line = b""
        if not line:  # the engine crashed on this grammar: refuse it (a fresh child takes the next one)
            await self.close()
            log.warning("the grammar checker died compiling a %s grammar; refused", structured.kind.value)
            return Verdict(None, "the grammar engine failed on this grammar")
        answer = json.loads(line)
        return Verdict(StructuredOutputKind(answer["kind"]) if answer["kind"] else None, answer["error"])

    async def _started_child(self) -> asyncio.subprocess.Process:
        """The running child, or a new one; one retry when a new one fails to start (seen once under heavy load)."""
        if self._child is not None and self._child.returncode is None:
            return self._child
        for attempt in (1, 2):
            self._child = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "services.gateway.structured.grammar_check", self.model_dir, str(self.vocab_size),
                ",".join(map(str, self.stop_token_ids)), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, limit=1024**2)
            try:
                ready = await asyncio.wait_for(self._child.stdout.readline(), START_TIMEOUT_S)
            except TimeoutError:
                ready = b""
            if ready.strip() == b"ready":
                return self._child
            child = self._child
            await self.close()
            log.warning("the grammar checker did not start (attempt %d, exit code %s, said %r)", attempt,
                        child.returncode, ready[:200])
        raise RuntimeError("the grammar checker did not start")

    def _remember(self, key: str, verdict: Verdict) -> None:
        self._verdicts[key] = verdict
        while len(self._verdicts) > MAX_CACHED:
            self._verdicts.popitem(last=False)


def _serve(model_dir: str, vocab_size: int, stop_token_ids: tuple[int, ...]) -> None:
    """The child: compile each grammar it is sent (one JSON line each) and answer {"kind": kind that compiled or
    "", "error": message} on its own line. Native code's prints go to stderr, away from the answers."""
    _die_with_parent()
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    from shared.grammar_cache import GrammarCache, GrammarError

    cache = GrammarCache(model_dir, vocab_size, stop_token_ids, max_cached_bytes=0, num_threads=1)
    cache.get(StructuredOutput(StructuredOutputKind.JSON_OBJECT, ""))  # loads the tokenizer before answering
    answers.write("ready\n")
    for line in sys.stdin:
        request = json.loads(line)
        structured = StructuredOutput(StructuredOutputKind(request["kind"]), request["spec"], request["any_whitespace"])
        try:
            answer = {"kind": _compiled_kind(cache, structured).value, "error": ""}
        except GrammarError as exc:
            answer = {"kind": "", "error": str(exc)}
        answers.write(json.dumps(answer) + "\n")


def _die_with_parent() -> None:
    """Have the kernel kill this child when the gateway dies, so that no orphan compiles on (Linux only)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _compiled_kind(cache, structured: StructuredOutput) -> StructuredOutputKind:
    """A `grammar` that is not EBNF may be Lark (vLLM takes both under one name)."""
    from shared.grammar_cache import GrammarError

    try:
        cache.get(structured)
        return structured.kind
    except GrammarError as exc:
        if structured.kind is not StructuredOutputKind.GRAMMAR:
            raise
        ebnf_error = exc
    try:
        cache.get(replace(structured, kind=StructuredOutputKind.LARK))
    except GrammarError:
        raise ebnf_error from None
    return StructuredOutputKind.LARK


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]), tuple(int(t) for t in sys.argv[3].split(",") if t))
