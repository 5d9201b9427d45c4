"""Tool-call formats per model family (`--tool-call-parser`), one file each, and the default for a chat template."""

from __future__ import annotations

from pagedserve.services.gateway.structured.tool_parsers.base import ToolCallFormat
from pagedserve.services.gateway.structured.tool_parsers.hermes import HermesFormat
from pagedserve.services.gateway.structured.tool_parsers.llama3_json import Llama3JsonFormat
from pagedserve.services.gateway.structured.tool_parsers.mistral import MistralFormat
from pagedserve.services.gateway.structured.tool_parsers.qwen3_coder import Qwen3CoderFormat

TOOL_CALL_FORMATS: dict[str, type[ToolCallFormat]] = {
    cls.name: cls for cls in (HermesFormat, Llama3JsonFormat, MistralFormat, Qwen3CoderFormat)}


def default_tool_call_parser(chat_template: str | None) -> str:
    """The family a chat template's tool-call markup names; hermes (the gateway's own rendering of tools for a
    template that knows none) when it names none or several."""
    template = chat_template or ""
    found = [name for name, markers in (("qwen3_coder", ("<function=", "<parameter=")), ("mistral", ("[TOOL_CALLS]",)),
                                        ("llama3_json", ("<|python_tag|>",)))
             if all(marker in template for marker in markers)]
    return found[0] if len(found) == 1 else "hermes"
