"""The gateway's configuration: one frozen dataclass, filled once in `__main__` from flags / environment."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pagedserve.services.gateway.http.cors import parse_list
from pagedserve.services.gateway.routing.policy import RoutingPolicy
from pagedserve.services.gateway.routing.replica_addresses import parse_targets
from pagedserve.services.gateway.structured.reasoning_parsers import REASONING_FORMATS
from pagedserve.services.gateway.structured.tool_parsers import TOOL_CALL_FORMATS
from pagedserve.services.gateway.tenants.keys_file import load_keys_file
from pagedserve.services.gateway.text.chat_template import load_chat_template
from pagedserve.services.internal_tls import InternalTLSConfig
from pagedserve.shared.cli_config import check_choices, flag_name
from pagedserve.shared.event_loop import Loop
from pagedserve.shared.log_setup import LogLevel
from pagedserve.shared.placeholder_secrets import check_not_placeholder
from pagedserve.shared.redis_url import check_redis_url

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
    # A request whose replica fails mid-way is resumed on another as a continuation at most this many times (then
    # the client gets the error); hand-offs from a draining replica do not count (docs/replicas.md).
    max_resumes: int = 2
    internal_token: str = ""  # shared secret between the services, sent as gRPC metadata (empty: no check)
    tls: InternalTLSConfig = field(default_factory=InternalTLSConfig)  # to the schedulers: services/internal_tls.py
    api_key: str | None = None  # when set, /v1/*, /tokenize and /detokenize need `Authorization: Bearer KEY`
    # Tenants: a YAML or JSON file mapping API keys to tenants and their limits (docs/tenants.md); reloaded when it
    # changes. With --api-key too, that key is one more tenant ("default"). Rate limits are shared through
    # --redis-url when set (per gateway otherwise, and while Redis is down).
    api_keys_file: str = ""
    api_keys_poll_interval_s: float = 1.0  # how often the keys file's modification time is checked
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
    responses_store_ttl_s: float = 3600.0  # how long a stored response (`store`, previous_response_id) is kept
    responses_store_max_bytes: int = 64 * 1024**2  # without --redis-url: this gateway's store holds this much JSON
    tool_call_parser: str = ""  # the tool-call format: hermes, llama3_json, mistral, qwen3_coder; "": the template's
    reasoning_parser: str = ""  # split reasoning out: qwen3, deepseek_r1, none; "": the template's family if clear
    grammar_compile_timeout_s: float = 10.0  # a response_format / tools grammar compiling longer is refused (400)
    grammar_check_workers: int = 2  # child processes compiling new grammars side by side
    grammar_compiles_per_client: int = 1  # new grammars one client (address) may have compiling at once
    max_header_bytes: int = 64 * 1024  # a request head (request line + headers) larger than this gets 431 at once
    max_headers: int = 100  # a request with more header fields gets 431
    header_timeout_s: float = 10.0  # a request head not complete this long after its first byte: 408, closed
    body_timeout_s: float = 30.0  # a request body not complete this long after its head: 408, closed
    keep_alive_timeout_s: float = 5.0  # an idle keep-alive connection is closed after this long
    max_connections: int = 4096  # open connections at most; beyond, new requests get 503 (uvicorn's limit)
    max_connections_per_client: int = 256  # open connections from one client address at most; beyond, closed
    loop: Loop = "uvloop"  # the event loop: uvloop or asyncio (the standard library's)
    http: HttpParser = "httptools"  # uvicorn's HTTP/1.1 parser: httptools (C) or h11 (pure Python; more CPU a token)
    log_level: LogLevel = "info"  # debug, info, warning, error

    def __post_init__(self) -> None:
        check_choices(self)
        check_not_placeholder("--internal-token", self.internal_token)
        check_not_placeholder("--api-key", self.api_key)
        for name in ("allowed_origins", "allowed_methods", "allowed_headers"):
            parse_list(getattr(self, name), flag_name(name))  # a ValueError naming the flag on a bad JSON list
        if self.tool_call_parser and self.tool_call_parser not in TOOL_CALL_FORMATS:
            raise ValueError(f"--tool-call-parser must be one of {', '.join(TOOL_CALL_FORMATS)}, got "
                             f"{self.tool_call_parser!r}")
        if self.reasoning_parser not in ("", "none", *REASONING_FORMATS):
            raise ValueError(f"--reasoning-parser must be one of none, {', '.join(REASONING_FORMATS)}, got "
                             f"{self.reasoning_parser!r}")
        if self.chat_template:
            load_chat_template(self.chat_template)  # a ValueError when it is neither a file nor a template
        if self.api_keys_file:
            load_keys_file(self.api_keys_file)  # a KeysFileError (a ValueError) naming the fault, never a key
        for name in ("max_num_choices", "max_body_bytes", "tokenizer_threads", "max_open_requests",
                     "responses_store_max_bytes", "grammar_check_workers", "grammar_compiles_per_client",
                     "max_header_bytes", "max_headers", "max_connections", "max_connections_per_client"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.drain_timeout_s < 0:
            raise ValueError(f"drain_timeout_s must not be negative, got {self.drain_timeout_s}")
        for name in ("responses_store_ttl_s", "header_timeout_s", "body_timeout_s", "keep_alive_timeout_s",
                     "api_keys_poll_interval_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.stream_stall_timeout_s <= 0:
            raise ValueError(f"stream_stall_timeout_s must be positive, got {self.stream_stall_timeout_s}")
        parse_targets(self.scheduler_address)  # a ValueError naming the bad entry
        if self.redis_url:
            try:
                check_redis_url(self.redis_url)
            except ValueError as exc:
                raise ValueError(f"--redis-url {exc}") from None  # never the URL: it may hold the password
        if self.max_resumes < 0:
            raise ValueError(f"max_resumes must be >= 0, got {self.max_resumes}")
        if self.routing_load_cost_tokens < 0 or self.routing_pending_ttl_s < 0:
            raise ValueError("routing_load_cost_tokens and routing_pending_ttl_s must be >= 0")
