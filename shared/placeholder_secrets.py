"""Secrets left at an example's placeholder are refused: a deployment copied from deploy/k8s/base/secrets.env.example
without editing it would otherwise run with a token every reader of this repository knows."""

from __future__ import annotations

# the values of deploy/k8s/base/secrets.env.example (tests/unit/shared/test_placeholder_secrets.py keeps them equal)
EXAMPLE_VALUES = frozenset({"replace-me-with-a-client-api-key", "replace-me-with-a-random-internal-token"})
PLACEHOLDER_PREFIXES = ("replace-me", "change-me", "changeme", "placeholder")


def is_placeholder(value: str) -> bool:
    text = value.strip().lower()
    return text in EXAMPLE_VALUES or text.startswith(PLACEHOLDER_PREFIXES)


def check_not_placeholder(flag: str, value: str | None) -> None:
    """A ValueError naming the flag (never the value's use) when `value` is an example placeholder."""
    if value and is_placeholder(value):
        raise ValueError(f"{flag} is an example placeholder ({value.strip()!r}): set a real secret, e.g. "
                         "`openssl rand -hex 32`")
