"""The scheduler's invariant checks: plain code, so that they hold under `python -O` (which strips `assert`)."""

from __future__ import annotations


class InvariantViolated(AssertionError):
    """An invariant of the scheduler's state broke: a bug (a leaked block, a request in two states), never bad input.

    An AssertionError, so that callers and tests that treat a failed check as one keep doing so."""


def require(condition: object, message: str) -> None:
    """Raise InvariantViolated(message) unless `condition` holds; runs under `python -O` too."""
    if not condition:
        raise InvariantViolated(message)
