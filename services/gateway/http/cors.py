"""CORS for browser clients, off unless --allowed-origins names some (vLLM's flags; vLLM allows every origin)."""

from __future__ import annotations

import json

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware


def parse_list(text: str, flag: str) -> list[str]:
    """A JSON list (`["https://a.example"]`, as vLLM takes it) or a comma-separated one; empty text: []."""
    text = text.strip()
    if text.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{flag}: not a JSON list: {exc}") from None
        if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
            raise ValueError(f"{flag}: expected a JSON list of strings, got {text!r}")
        return [item.strip() for item in items if item.strip()]
    return [item.strip() for item in text.split(",") if item.strip()]


def add_cors(app: FastAPI, origins: str, methods: str, headers: str, credentials: bool) -> None:
    """The outermost middleware (add it last): preflights are answered before the API key is checked."""
    allowed = parse_list(origins, "--allowed-origins")
    if not allowed:
        return
    app.add_middleware(CORSMiddleware, allow_origins=allowed, allow_methods=parse_list(methods, "--allowed-methods"),
                       allow_headers=parse_list(headers, "--allowed-headers"), allow_credentials=credentials,
                       expose_headers=["X-Request-Id", "Retry-After"])
