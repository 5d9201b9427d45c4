"""What the client observed for one request: every chunk's arrival time, token counts and how it ended."""

from dataclasses import asdict, dataclass, field

FAILURE_KINDS_DOC = "http_<status> | timeout | connection | incomplete_stream | stream_error | no_tokens"


@dataclass
class RequestRecord:
    index: int  # position in the dataset
    num_requested_output_tokens: int  # max_tokens sent
    num_prompt_tokens: int | None = None  # server usage if reported, else the dataset's count
    send_offset_s: float = 0.0  # when the request was sent, relative to the start of the run
    chunk_times_s: list[float] = field(default_factory=list)  # arrival of each chunk carrying text, from send
    e2el_s: float | None = None  # send -> end of stream
    num_output_tokens: int | None = None
    output_tokens_source: str | None = None  # usage | tokenizer | chunks
    finish_reason: str | None = None
    http_status: int | None = None
    error: str | None = None  # failure kind, one of FAILURE_KINDS_DOC; None when the request succeeded
    error_detail: str | None = None
    num_cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, when the server reports it
    replica: str | None = None  # the X-Pagedserve-Replica response header: the engine replica that served it

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_times_s[0] if self.chunk_times_s else None

    @property
    def itls_s(self) -> list[float]:
        """Gaps between consecutive text chunks (a chunk may carry more than one token)."""
        times = self.chunk_times_s
        return [b - a for a, b in zip(times, times[1:], strict=False)]

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first; None for single-token answers."""
        if not self.ok or not self.num_output_tokens or self.num_output_tokens < 2:
            return None
        return (self.e2el_s - self.ttft_s) / (self.num_output_tokens - 1)

    def to_json(self) -> dict:
        data = asdict(self)
        data["chunk_times_s"] = [round(t, 6) for t in self.chunk_times_s]
        return data

    @classmethod
    def from_json(cls, data: dict) -> "RequestRecord":
        return cls(**data)
