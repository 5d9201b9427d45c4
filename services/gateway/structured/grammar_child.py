"""One grammar-compiling child process (`python -m pagedserve.services.gateway.structured.grammar_child MODEL VOCAB
STOP_IDS`):
JSON lines in on stdin, one answer line out per grammar.

The grammar engine compiles in native code that cannot be interrupted; a child can be killed. A grammar that
compiles but admits no token at its start (`root ::= root`, the regex `[^\\s\\S]`) matches no text: refused too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from dataclasses import dataclass, replace

from pagedserve.shared.structured_output import StructuredOutput, StructuredOutputKind

START_TIMEOUT_S = 300.0  # importing xgrammar and loading the tokenizer, on a busy machine


@dataclass(frozen=True)
class Verdict:
    kind: StructuredOutputKind | None  # the kind that compiled (a grammar may turn out to be Lark); None: refused
    error: str = ""


class GrammarChild:
    """The gateway's handle on one child: start it, send it one grammar at a time, kill it."""

    def __init__(self, command: list[str]) -> None:
        self.command = command
        self.process: asyncio.subprocess.Process | None = None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def start(self) -> None:
        """Start the child and wait for its `ready`; RuntimeError when it does not come."""
        self.process = await asyncio.create_subprocess_exec(*self.command, stdin=asyncio.subprocess.PIPE,
                                                            stdout=asyncio.subprocess.PIPE, limit=1024**2)
        try:
            ready = await asyncio.wait_for(self.process.stdout.readline(), START_TIMEOUT_S)
        except TimeoutError:
            ready = b""
        if ready.strip() != b"ready":
            code = self.process.returncode
            await self.close()
            raise RuntimeError(f"the grammar checker did not start (exit code {code}, said {ready[:200]!r})")

    async def compile(self, structured: StructuredOutput, timeout_s: float) -> Verdict:
        """The child's verdict; a refusal when it does not answer within `timeout_s` (then it is killed: only that
        stops a native compile) or dies on the grammar. `alive` tells whether the child can take another."""
        request = {"kind": structured.kind.value, "spec": structured.spec, "any_whitespace": structured.any_whitespace}
        self.process.stdin.write((json.dumps(request) + "\n").encode())
        try:
            await self.process.stdin.drain()
            line = await asyncio.wait_for(self.process.stdout.readline(), timeout_s)
        except TimeoutError:
            await self.close()
            return Verdict(None, f"the grammar did not compile within {timeout_s:g} s; simplify it (deeply nested "
                                 f"or very long bounded structures compile slowly)")
        except (ConnectionError, BrokenPipeError):
            line = b""
        if not line:
            await self.close()
            return Verdict(None, "the grammar engine failed on this grammar")
        answer = json.loads(line)
        return Verdict(StructuredOutputKind(answer["kind"]) if answer["kind"] else None, answer["error"])

    async def close(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        await process.wait()


def child_command(model_dir: str, vocab_size: int, stop_token_ids: tuple[int, ...]) -> list[str]:
    return [sys.executable, "-m", "pagedserve.services.gateway.structured.grammar_child", model_dir, str(vocab_size),
            ",".join(map(str, stop_token_ids))]


def _serve(model_dir: str, vocab_size: int, stop_token_ids: tuple[int, ...]) -> None:
    """The child: compile each grammar it is sent (one JSON line each) and answer {"kind": kind that compiled or
    "", "error": message} on its own line. Native code's prints go to stderr, away from the answers."""
    _die_with_parent()
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    from pagedserve.shared.grammar_cache import GrammarCache, GrammarError

    cache = GrammarCache(model_dir, vocab_size, stop_token_ids, max_cached_bytes=0, num_threads=1)
    cache.get(StructuredOutput(StructuredOutputKind.JSON_OBJECT, ""))  # loads the tokenizer before answering
    answers.write("ready\n")
    for line in sys.stdin:
        request = json.loads(line)
        structured = StructuredOutput(StructuredOutputKind(request["kind"]), request["spec"], request["any_whitespace"])
        try:
            answer = {"kind": _compiled_kind(cache, structured, vocab_size).value, "error": ""}
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


def _compiled_kind(cache, structured: StructuredOutput, vocab_size: int) -> StructuredOutputKind:
    """The kind that compiled: a `grammar` that is not EBNF may be Lark (vLLM takes both under one name)."""
    from pagedserve.shared.grammar_cache import GrammarError

    try:
        _check_matches_something(cache.get(structured), vocab_size)
        return structured.kind
    except GrammarError as exc:
        if structured.kind is not StructuredOutputKind.GRAMMAR:
            raise
        ebnf_error = exc
    try:
        _check_matches_something(cache.get(replace(structured, kind=StructuredOutputKind.LARK)), vocab_size)
    except GrammarError:
        raise ebnf_error from None
    return StructuredOutputKind.LARK


def _check_matches_something(compiled, vocab_size: int) -> None:
    """GrammarError when no token (EOS included) may start the text: the grammar matches nothing, and the worker
    would otherwise drop it and generate free text."""
    import xgrammar as xgr

    from pagedserve.shared.grammar_cache import GrammarError

    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    matcher.fill_next_token_bitmask(bitmask)
    if not bitmask.any():
        raise GrammarError("the grammar matches no text (no token can start it)")


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]), tuple(int(t) for t in sys.argv[3].split(",") if t))
