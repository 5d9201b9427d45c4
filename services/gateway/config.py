"""The gateway's configuration: one frozen dataclass, filled once in `__main__` from flags / environment."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from services.gateway.http.cors import parse_list
from services.gateway.routing.policy import RoutingPolicy
from services.gateway.routing.replica_addresses import parse_targets
from services.gateway.text.chat_template import load_chat_template
from shared.cli_config import check_choices, flag_name
from shared.event_loop import Loop
from shared.log_setup import LogLevel
from shared.placeholder_secrets import check_not_placeholder
from shared.redis_url import check_redis_url

HttpParser = Literal["httptools", "h11"]


@dataclass(frozen=True)
class GatewayConfig:
    model_dir: str  # Hugging Face model folder: tokenizer, chat template, generation_config.json
    host: str = "127.0.0.1"  # interface the HTTP server binds (0.0.0.0 for all)
    port: int = 8000  # the OpenAI-compatible HTTP port
    # Engine replicas: a comma list of host:port; a DNS name resolving to several addresses (a Kubernetes headless
    # Service) gives one replica per address, re-resolved every scheduler_resolve_interval_s.
    scheduler_address: str = "127.0.0.1:50051"  # the schedulers' gRPC servers: host:port[,host:port...]
    scheduler_resolve_interval_s: float = 5.0  # how often DNS names in --scheduler-address are resolved again
    routing: RoutingPolicy = "prefix"  # how a request picks its replica: prefix, least-load or round-robin
    redis_url: str = ""  # the Redis the schedulers publish prefix indexes and load to; empty: prefix routing hashes
    routing_load_cost_tokens: int = 128  # prefix routing: prompt tokens one request queued on a replica is worth
    routing_pending_ttl_s: float = 10.0  # prefix routing: a prompt sent to a replica counts as cached there this long
    internal_token: str = ""  # shared secret between the services, sent as gRPC metadata (empty: no check)
    api_key: str | None = None  # when set, /v1/*, /tokenize and /detokenize need `Authorization: Bearer KEY`
    max_num_choices: int = 16  # upper bound on `n`, and on prompts x n (each choice is one scheduler request)
    chat_template: str | None = None  # a Jinja chat template, or a file holding one; default: the model folder's
    trust_request_chat_template: bool = False  # let requests bring their own `chat_template` (vLLM's flag)
    max_body_bytes: int = 4 * 1024**2  # larger request bodies get 413 (checked as they arrive, never buffered)
    tokenizer_threads: int = 2  # threads that tokenize and template prompts, off the event loop
    allowed_origins: str = ""  # CORS: origins browsers may call from (comma list or JSON list; "*": any); empty: off
    allowed_methods: str = "*"  # CORS: methods allowed from those origins
    allowed_headers: str = "*"  # CORS: request headers allowed from those origins
    allow_credentials: bool = False  # CORS: let browsers send cookies / auth with cross-origin requests
    max_open_requests: int = 512  # work requests in flight at most (generation, tokenize); 429 + Retry-After above
    drain_timeout_s: float = 300.0  # on SIGTERM: how long requests in flight may take to finish before they are cut
    stream_stall_timeout_s: float = 60.0  # a stream whose client takes no data for this long is aborted
    health_poll_interval_s: float = 1.0  # how often the gateway checks each scheduler's health
    health_timeout_s: float = 2.0  # a health check slower than this counts as down (a hung replica leaves routing)
    scheduler_timeout_s: float = 5.0  # deadline of the small unary calls (stats, describe, health)
    grammar_compile_timeout_s: float = 10.0  # a response_format / tools grammar compiling longer is refused (400)
    loop: Loop = "uvloop"  # the event loop: uvloop or asyncio (the standard library's)
    http: HttpParser = "httptools"  # uvicorn's HTTP/1.1 parser: httptools (C) or h11 (pure Python; more CPU a token)
    log_level: LogLevel = "info"  # debug, info, warning, error

    def __post_init__(self) -> None:
        check_choices(self)
        check_not_placeholder("--internal-token", self.internal_token)
        check_not_placeholder("--api-key", self.api_key)
        for name in ("allowed_origins", "allowed_methods", "allowed_headers"):
            parse_list(getattr(self, name), flag_name(name))  # a ValueError naming the flag on a bad JSON list
        if self.chat_template:
            load_chat_template(self.chat_template)  # a ValueError when it is neither a file nor a template
        for name in ("max_num_choices", "max_body_bytes", "tokenizer_threads", "max_open_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.drain_timeout_s < 0:
            raise ValueError(f"drain_timeout_s must not be negative, got {self.drain_timeout_s}")
        if self.stream_stall_timeout_s <= 0:
            raise ValueError(f"stream_stall_timeout_s must be positive, got {self.stream_stall_timeout_s}")
        parse_targets(self.scheduler_address)  # a ValueError naming the bad entry
        if self.redis_url:
            try:
                check_redis_url(self.redis_url)
            except ValueError as exc:
                raise ValueError(f"--redis-url {exc}") from None  # never the URL: it may hold the password
        if self.routing_load_cost_tokens < 0 or self.routing_pending_ttl_s < 0:
            raise ValueError("routing_load_cost_tokens and routing_pending_ttl_s must be >= 0")
