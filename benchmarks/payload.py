"""What one benchmark request looks like on the wire, for the chat and completions endpoints."""

import math
from dataclasses import dataclass, field, replace

from pagedserve.benchmarks.datasets import BenchRequest

DEFAULT_ENDPOINTS = {"openai-chat": "/v1/chat/completions", "openai-completions": "/v1/completions"}
# vllm bench's --backend names that mean the same thing as ours.
BACKEND_ALIASES = {"openai": "openai-completions", "vllm": "openai-completions"}
EOS_SUPPRESSIONS = ("auto", "ignore-eos", "logit-bias")
EOS_NOT_SUPPRESSED = "none"  # what auto resolves to when the server accepts neither method
# OpenAI clamps logit_bias to [-100, 100]; -100 effectively bans the token. A float, because some servers
# (transformers serve) reject integer biases.
EOS_LOGIT_BIAS = -100.0


@dataclass(frozen=True)
class EndpointConfig:
    base_url: str  # server root, e.g. http://127.0.0.1:8000 (no /v1)
    model: str
    endpoint_type: str = "openai-chat"
    endpoint: str | None = None  # path; None means the default for endpoint_type
    api_key: str | None = None
    ignore_eos: bool = False  # force every answer to max_tokens
    eos_suppression: str = "auto"  # how ignore_eos is asked for; "auto" is resolved by a probe before the run
    eos_token_ids: tuple[int, ...] = ()  # for the logit-bias method
    temperature: float = 0.0
    request_timeout_s: float = 600.0
    extra_body: dict = field(default_factory=dict)  # merged into every payload
    constrained_body: dict = field(default_factory=dict)  # merged into the constrained requests' payloads
    constrained_fraction: float = 0.0  # of the requests, spread evenly (see mark_constrained)

    def __post_init__(self):
        if self.endpoint_type not in DEFAULT_ENDPOINTS:
            raise ValueError(f"--endpoint-type must be one of {tuple(DEFAULT_ENDPOINTS)}, got {self.endpoint_type!r}")
        if self.eos_suppression not in (*EOS_SUPPRESSIONS, EOS_NOT_SUPPRESSED):
            raise ValueError(f"--eos-suppression must be one of {EOS_SUPPRESSIONS}")
        if not 0.0 <= self.constrained_fraction <= 1.0:
            raise ValueError(f"--constrained-fraction must be in [0, 1], got {self.constrained_fraction}")

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + (self.endpoint or DEFAULT_ENDPOINTS[self.endpoint_type])

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def check_eos_suppression(cfg: EndpointConfig) -> None:
    """Once the tokenizer is known (it may come from the server): logit-bias suppression needs its EOS ids."""
    if cfg.ignore_eos and cfg.eos_suppression == "logit-bias" and not cfg.eos_token_ids:
        raise ValueError("--eos-suppression logit-bias needs a tokenizer (--tokenizer) to know the EOS token ids")


def build_payload(cfg: EndpointConfig, request: BenchRequest) -> dict:
    payload = {
        "model": cfg.model,
        "max_tokens": request.num_output_tokens,
        "temperature": cfg.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if cfg.endpoint_type == "openai-chat":
        payload["messages"] = _messages(request)
    else:
        payload["prompt"] = request.completion_text()
    if cfg.ignore_eos:
        payload.update(eos_fields(cfg.eos_suppression, cfg.eos_token_ids))
    return {**payload, **cfg.extra_body, **(cfg.constrained_body if request.constrained else {})}


def mark_constrained(requests: list[BenchRequest], fraction: float) -> list[BenchRequest]:
    """`fraction` of the requests constrained, spread evenly (0.5: every second one, starting with the second)."""
    return [replace(r, constrained=math.floor((i + 1) * fraction) > math.floor(i * fraction))
            for i, r in enumerate(requests)]


def eos_fields(method: str, eos_token_ids: tuple[int, ...]) -> dict:
    """Request fields that keep the server generating past EOS."""
    if method == "ignore-eos":
        return {"ignore_eos": True}
    if method == EOS_NOT_SUPPRESSED:
        return {}
    assert method == "logit-bias", f"unresolved EOS suppression {method!r}"
    return {"logit_bias": {str(token_id): EOS_LOGIT_BIAS for token_id in eos_token_ids}}


def _messages(request: BenchRequest) -> list[dict]:
    messages = [{"role": "user", "content": request.prompt}]
    if request.system_prompt is not None:
        messages.insert(0, {"role": "system", "content": request.system_prompt})
    return messages
