"""A streamed chunk's JSON with one varying string, built by splicing: the same bytes `json.dumps` gives the whole
chunk, for a fraction of its cost (one C string escape instead of encoding a nested dict every token)."""

from __future__ import annotations

import json
from json.encoder import encode_basestring  # what json.dumps(..., ensure_ascii=False) uses for a str

_MARKER = "\u0000pagedserve-text\u0000"  # escaped as \u0000 by json.dumps: never a chunk's own key or value


class TextChunkTemplate:
    """`render(text)` == json.dumps(chunk with `text` in place of the marker, ensure_ascii=False)."""

    def __init__(self, chunk_with_marker: dict) -> None:
        encoded = json.dumps(chunk_with_marker, ensure_ascii=False)
        marker = encode_basestring(_MARKER)
        if encoded.count(marker) != 1:
            raise ValueError("the chunk must hold the text marker exactly once")
        self._before, _, self._after = encoded.partition(marker)

    def render(self, text: str) -> str:
        return self._before + encode_basestring(text) + self._after


def text_marker() -> str:
    """The placeholder to put where the text goes in the chunk given to TextChunkTemplate."""
    return _MARKER
