"""The gateway's grammar vetting: compiled once per grammar in a child process that is killed when too slow."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pagedserve.services.gateway.http.errors import OpenAIError
from pagedserve.services.gateway.structured.grammar_check import GrammarChecker
from pagedserve.services.gateway.structured.structured_outputs import Constraint
from pagedserve.shared.structured_output import StructuredOutput, StructuredOutputKind
from tests.unit.gateway.conftest import MODEL_DIR


def slow_schema(length: int = 20_000) -> dict:
    """A long bounded repetition in a pattern: 3000 compile in about 1 s, 10000 in 20 s (xgrammar 0.2.9)."""
    return {"type": "string", "pattern": f"^[a-z]{{{length}}}$"}


def constraint(kind: StructuredOutputKind, spec: str, param: str = "structured_outputs.x") -> Constraint:
    return Constraint(StructuredOutput(kind, spec), param)


def test_verdicts_are_cached_and_refusals_name_the_field():
    async def scenario() -> None:
        checker = GrammarChecker(str(MODEL_DIR), 49152, (2,), timeout_s=60)
        try:
            good = constraint(StructuredOutputKind.REGEX, "[0-9]+")
            assert await checker.check(good) == good.structured
            assert await checker.check(good) == good.structured and checker.num_compiles == 1
            with pytest.raises(OpenAIError) as info:
                await checker.check(constraint(StructuredOutputKind.REGEX, "a(b", "guided_regex"))
            assert info.value.status == 400 and info.value.param == "guided_regex"
            assert "not closed" in info.value.message
            lark = await checker.check(constraint(StructuredOutputKind.GRAMMAR, 'start: "yes" | "no"'))
            assert lark.kind is StructuredOutputKind.LARK  # not EBNF, but Lark: vLLM takes both as `grammar`
        finally:
            await checker.close()

    asyncio.run(scenario())


def test_a_grammar_that_compiles_too_long_is_refused_and_the_checker_recovers():
    async def scenario() -> None:
        checker = GrammarChecker(str(MODEL_DIR), 49152, (2,), timeout_s=2)
        try:
            await checker.check(constraint(StructuredOutputKind.REGEX, "x"))  # child started
            start_s = time.monotonic()
            with pytest.raises(OpenAIError) as info:
                await checker.check(constraint(StructuredOutputKind.JSON_SCHEMA, json.dumps(slow_schema()),
                                               "response_format.json_schema"))
            assert time.monotonic() - start_s < 30
            assert info.value.param == "response_format.json_schema" and "did not compile within 2 s" in \
                info.value.message
            assert await checker.check(constraint(StructuredOutputKind.REGEX, "y"))  # a fresh child answers
        finally:
            await checker.close()

    asyncio.run(scenario())


def test_the_child_dies_with_its_gateway():
    """A gateway that dies mid-compile leaves no orphan compiling on (and holding memory)."""
    script = f"""
import asyncio, os
from pagedserve.services.gateway.structured.grammar_check import GrammarChecker
from pagedserve.services.gateway.structured.structured_outputs import Constraint
from pagedserve.shared.structured_output import StructuredOutput, StructuredOutputKind

async def main():
    checker = GrammarChecker({str(MODEL_DIR)!r}, 49152, (2,), timeout_s=600)
    await checker.check(Constraint(StructuredOutput(StructuredOutputKind.REGEX, "x"), "x"))
    print(checker.children[0].process.pid, flush=True)
    slow = Constraint(StructuredOutput(StructuredOutputKind.JSON_SCHEMA, {json.dumps(json.dumps(slow_schema()))}), "x")
    task = asyncio.create_task(checker.check(slow))
    await asyncio.sleep(1)
    os._exit(0)  # dies mid-compile, without closing the checker

asyncio.run(main())
"""
    gateway = subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True, timeout=300, cwd=Path(__file__).resolve().parents[4])  # the child keeps
    # a captured stderr open
    child_pid = int(gateway.stdout.split()[0])
    deadline_s = time.monotonic() + 30
    while Path(f"/proc/{child_pid}").exists() and _state(child_pid) != "Z" and time.monotonic() < deadline_s:
        time.sleep(0.1)
    assert not Path(f"/proc/{child_pid}").exists() or _state(child_pid) == "Z"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_a_grammar_the_engine_dies_on_is_refused_and_the_checker_recovers():
    async def scenario() -> None:
        checker = GrammarChecker(str(MODEL_DIR), 49152, (2,), timeout_s=600)
        try:
            await checker.check(constraint(StructuredOutputKind.REGEX, "x"))  # child started
            child = checker.children[0].process
            fatal = asyncio.create_task(checker.check(constraint(
                StructuredOutputKind.JSON_SCHEMA, json.dumps(slow_schema()), "response_format.json_schema")))
            await asyncio.sleep(1)
            child.kill()  # as a crash in the native compiler would
            with pytest.raises(OpenAIError) as info:
                await fatal
            assert info.value.status == 400 and info.value.param == "response_format.json_schema"
            assert "failed on this grammar" in info.value.message
            assert await checker.check(constraint(StructuredOutputKind.REGEX, "y"))  # a fresh child answers
        finally:
            await checker.close()

    asyncio.run(scenario())


def test_a_grammar_that_matches_nothing_is_refused():
    """Issue 40: `root ::= root` and `[^\\s\\S]` were dropped by the worker and answered with free text."""
    async def scenario() -> None:
        checker = GrammarChecker(str(MODEL_DIR), 49152, (2,), timeout_s=60)
        try:
            for c in (constraint(StructuredOutputKind.GRAMMAR, "root ::= root", "structured_outputs.grammar"),
                      constraint(StructuredOutputKind.REGEX, r"[^\s\S]", "guided_regex")):
                with pytest.raises(OpenAIError) as info:
                    await checker.check(c)
                assert info.value.param == c.param and "matches no text" in info.value.message
            assert await checker.check(constraint(StructuredOutputKind.GRAMMAR, 'root ::= "a" | ""'))
        finally:
            await checker.close()

    asyncio.run(scenario())


FAKE_CHILD = [sys.executable, "-m", "tests.unit.gateway.structured.fake_grammar_child"]


def test_slow_grammars_cannot_stall_another_clients_benign_one():
    """Three grammars that never finish compiling, sent in a row by one client, are each refused at the limit;
    meanwhile another client's benign grammar compiles within 2 s. The fake child sleeps on specs holding "slow",
    so this holds on any machine."""
    async def scenario() -> None:
        checker = GrammarChecker("", 0, (), timeout_s=3, num_children=2, per_client=1, command=FAKE_CHILD)
        try:
            await checker.check(constraint(StructuredOutputKind.REGEX, "warm"), client="b")  # one child started

            async def attacker() -> list[float]:
                times = []
                for i in range(3):
                    start_s = time.monotonic()
                    with pytest.raises(OpenAIError) as info:
                        await checker.check(constraint(StructuredOutputKind.REGEX, f"slow {i}"), client="a")
                    assert "did not compile within 3 s" in info.value.message
                    times.append(time.monotonic() - start_s)
                return times

            attack = asyncio.create_task(attacker())
            await asyncio.sleep(0.5)
            benign_times = []
            for i in range(3):
                start_s = time.monotonic()
                assert await checker.check(constraint(StructuredOutputKind.REGEX, f"benign {i}"), client="b")
                benign_times.append(time.monotonic() - start_s)
                await asyncio.sleep(1)
            slow_times = await attack
            assert max(benign_times) < 2, benign_times
            assert all(3 <= t < 3 + 2.5 for t in slow_times), slow_times  # cut at the limit, slot freed at once
            repeat_s = time.monotonic()
            with pytest.raises(OpenAIError):  # a refused grammar sent again: refused from the cache
                await checker.check(constraint(StructuredOutputKind.REGEX, "slow 0"), client="a")
            assert time.monotonic() - repeat_s < 0.5
            assert len(checker.children) <= 2
        finally:
            await checker.close()

    asyncio.run(scenario())


def test_one_grammar_asked_for_at_once_is_compiled_once():
    async def scenario() -> None:
        checker = GrammarChecker("", 0, (), timeout_s=10, command=FAKE_CHILD)
        try:
            same = constraint(StructuredOutputKind.REGEX, "pause 0.5")
            results = await asyncio.gather(*(checker.check(same, client=str(i)) for i in range(4)))
            assert all(r == same.structured for r in results) and checker.num_compiles == 1
        finally:
            await checker.close()

    asyncio.run(scenario())
