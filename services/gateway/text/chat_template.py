"""--chat-template: a file holding a Jinja chat template, or the template itself (as vLLM takes it)."""

from __future__ import annotations

from pathlib import Path


def load_chat_template(value: str) -> str:
    """--chat-template: the contents of a file when `value` names one, else `value` itself as a Jinja template."""
    path = Path(value)
    try:
        if path.is_file():
            return path.read_text()
    except OSError:  # e.g. a name too long to be a path: then it is a template
        pass
    if not any(char in value for char in "{}\n"):
        raise ValueError(f"--chat-template {value!r}: no such file, and it does not look like a Jinja template")
    return value
