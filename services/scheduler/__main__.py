"""`python -m pagedserve.services.scheduler [flags]`: the scheduler service (continuous batching, KV blocks, prefix
cache)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from pagedserve.services.ports import PortInUseError
from pagedserve.services.scheduler.server import serve
from pagedserve.services.scheduler.service_config import SchedulerServiceConfig
from pagedserve.shared.cli_config import parse_config
from pagedserve.shared.event_loop import run
from pagedserve.shared.log_setup import setup_logging
from pagedserve.shared.tracing import setup_tracing, shutdown_tracing


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    config = parse_config(SchedulerServiceConfig, argv, __doc__, prog=prog)
    setup_logging(config.log_level)
    setup_tracing("pagedserve-scheduler")
    try:
        run(serve(config), config.loop)
    except PortInUseError as exc:  # one line naming the port and its flag, not a traceback
        logging.getLogger("pagedserve.scheduler").error("%s", exc)
        return 2
    finally:
        shutdown_tracing()
    return 0


if __name__ == "__main__":
    sys.exit(main())
