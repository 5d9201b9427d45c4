"""The gateway's grammar vetting: compiled once per grammar in a child process that is killed when too slow."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from services.gateway.errors import OpenAIError
from services.gateway.grammar_check import GrammarChecker
from services.gateway.structured_outputs import Constraint
from shared.structured_output import StructuredOutput, StructuredOutputKind
from tests.unit.gateway.conftest import MODEL_DIR


def slow_schema(num_fields: int = 100) -> dict:
    """Strings of each their own length limit: 10 fields compile in about 1 s, 30 in 17 s, 100 in minutes."""
    return {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": i + 3}
                                             for i in range(num_fields)}}


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
