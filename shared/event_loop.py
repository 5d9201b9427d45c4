"""The asyncio event loop a service runs on: uvloop (libuv; less CPU per request and per stream chunk) or the
standard library's."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar, get_args

Loop = Literal["uvloop", "asyncio"]
LOOPS = get_args(Loop)
T = TypeVar("T")


def check_loop(name: str) -> str:
    """`name` if it is one of LOOPS; a ValueError naming them otherwise."""
    if name not in LOOPS:
        raise ValueError(f"unknown event loop {name!r}: expected one of {', '.join(LOOPS)}")
    return name


def run(main: Coroutine[Any, Any, T], loop: str) -> T:
    """asyncio.run on the named loop."""
    if check_loop(loop) == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)
