"""TextChunkTemplate: the spliced chunk is byte for byte what json.dumps gives the whole chunk."""

from __future__ import annotations

import json

import pytest

from pagedserve.services.gateway.api.sse_template import TextChunkTemplate, text_marker

TEXTS = ["", " world", 'say "hi"\n', "back\\slash\ttab", "é ü 中文 🙂", "\u2028\u2029", "\x00\x1f", "}{\"]["]


def _chat_chunk(index: int, text: str, usage: bool) -> dict:
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000, "model": "m \"q\" é",
             "choices": [{"index": index, "delta": {"content": text}, "logprobs": None, "finish_reason": None}]}
    return {**chunk, "usage": None} if usage else chunk


@pytest.mark.parametrize("usage", [False, True])
@pytest.mark.parametrize("text", TEXTS)
def test_render_equals_json_dumps_of_the_whole_chunk(text: str, usage: bool) -> None:
    template = TextChunkTemplate(_chat_chunk(3, text_marker(), usage))
    assert template.render(text) == json.dumps(_chat_chunk(3, text, usage), ensure_ascii=False)
    assert json.loads(template.render(text))["choices"][0]["delta"]["content"] == text


def test_a_chunk_without_exactly_one_marker_is_refused() -> None:
    with pytest.raises(ValueError, match="exactly once"):
        TextChunkTemplate({"a": "b"})
    with pytest.raises(ValueError, match="exactly once"):
        TextChunkTemplate({"a": text_marker(), "b": text_marker()})
