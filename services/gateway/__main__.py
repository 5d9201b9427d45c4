"""`python -m pagedserve.services.gateway MODEL_DIR [flags]`: the OpenAI-compatible HTTP gateway (FastAPI + uvicorn)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import uvicorn

from pagedserve.services.gateway.api.sampling import load_generation_defaults
from pagedserve.services.gateway.api.serving import Serving
from pagedserve.services.gateway.app import create_app
from pagedserve.services.gateway.config import GatewayConfig
from pagedserve.services.gateway.http.drain import DrainingServer
from pagedserve.services.gateway.http.edge import EdgeLimits, edge_protocol
from pagedserve.services.gateway.routing.prefix_mirror import PrefixMirror
from pagedserve.services.gateway.routing.replica_addresses import parse_targets
from pagedserve.services.gateway.routing.replicas import ReplicaSet
from pagedserve.services.gateway.routing.scheduler_client import SchedulerClient
from pagedserve.services.gateway.text.tokenizer import NO_TEMPLATE, PromptTokenizer
from pagedserve.services.ports import PortInUseError, port_is_free
from pagedserve.shared.cli_config import parse_config
from pagedserve.shared.drain_timing import CUT_GRACE_S
from pagedserve.shared.log_setup import setup_logging
from pagedserve.shared.model_dir import model_dir_problem
from pagedserve.shared.tracing import setup_tracing, shutdown_tracing


def uvicorn_edge_options(config: GatewayConfig) -> dict:
    """uvicorn's options for the HTTP edge: the bounded httptools protocol (or h11 with its head-size bound), the
    idle keep-alive timeout and the connection cap."""
    limits = EdgeLimits(config.max_header_bytes, config.max_headers, config.header_timeout_s, config.body_timeout_s,
                        config.max_connections_per_client)
    http = edge_protocol(limits) if config.http == "httptools" else config.http
    return {"http": http, "h11_max_incomplete_event_size": config.max_header_bytes,
            "timeout_keep_alive": config.keep_alive_timeout_s, "limit_concurrency": config.max_connections}


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    config = parse_config(GatewayConfig, argv, __doc__, prog=prog, positional=("model_dir",))
    problem = model_dir_problem(config.model_dir, weights=False)
    if problem is not None:
        print(f"{prog or 'gateway'}: error: {problem}", file=sys.stderr)
        return 2
    if not port_is_free(config.host, config.port):
        print(f"{prog or 'gateway'}: error: {PortInUseError(config.host, config.port, 'the gateway', '--port')}",
              file=sys.stderr)
        return 2
    setup_logging(config.log_level)
    tracing = setup_tracing("pagedserve-gateway")
    tokenizer = PromptTokenizer(config.model_dir, config.chat_template, config.tokenizer_threads)
    if not tokenizer.has_chat_template:
        logging.getLogger("pagedserve.gateway").warning("%s", NO_TEMPLATE)
    replicas = ReplicaSet(parse_targets(config.scheduler_address),
                          lambda address: SchedulerClient(address, config.scheduler_timeout_s, config.health_timeout_s,
                                                          config.internal_token, config.tls),
                          config.health_poll_interval_s, config.scheduler_resolve_interval_s,
                          health_timeout_s=config.health_timeout_s)
    mirror = PrefixMirror(config.redis_url) if config.redis_url and config.routing == "prefix" else None
    serving = Serving(config, tokenizer, replicas, load_generation_defaults(config.model_dir), mirror=mirror)
    app = create_app(serving, instrument=tracing)
    server = DrainingServer(uvicorn.Config(app, host=config.host, port=config.port, log_level=config.log_level,
                                           loop=config.loop, log_config=None, timeout_graceful_shutdown=CUT_GRACE_S,
                                           **uvicorn_edge_options(config)),
                            serving.admission, config.drain_timeout_s)
    try:
        server.run()
    finally:
        shutdown_tracing()
    return 0


if __name__ == "__main__":
    sys.exit(main())
