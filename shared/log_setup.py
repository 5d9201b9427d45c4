"""Logging set-up for the service processes: one line per record on stderr, level from the config."""

from __future__ import annotations

import logging
from typing import Literal

LogLevel = Literal["debug", "info", "warning", "error"]
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format=FORMAT)
    for noisy in ("httpx", "httpcore", "urllib3"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
