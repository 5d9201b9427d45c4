"""A tiny OpenAI-compatible streaming server on 127.0.0.1 for testing the bench client (never a real engine).

Prompts steer it: "FAIL" gets a 500, "STALL" answers only after stall_s, "CUT" streams two chunks then closes
without [DONE], "ERR" sends an error object inside the stream; anything else streams
max_tokens chunks of " hello". /metrics counts completions so the client's deltas can be checked exactly.
"""

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PREFIX_HITS_PER_REQUEST = 10
PREFIX_QUERIES_PER_REQUEST = 20


@dataclass
class FakeState:
    reject_ignore_eos: bool = False  # answer 400 to bodies with ignore_eos, like a strict server
    reject_logit_bias: bool = False  # answer 500, as transformers serve did for integer biases
    send_usage: bool = True
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens of every answer, when set
    replicas: tuple[str, ...] = ()  # X-Pagedserve-Replica of answers, in turn
    num_streams: int = 0
    model_root: str | None = None  # /v1/models `root` of fake-model (pagedserve reports its model folder there)
    eos_first: bool = False  # without ignore_eos, answer with no text at all (a model that ends at once)
    chunk_delay_s: float = 0.002
    stall_s: float = 1.0  # how long a "STALL" prompt waits before answering
    num_completed: int = 0
    num_in_flight: int = 0
    bodies: list[dict] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(BaseHTTPRequestHandler):
    state: FakeState  # set on the subclass made per server

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def do_GET(self) -> None:
        if self.path == "/version":
            self._json(200, {"version": "fake-1.0"})
        elif self.path == "/v1/models":
            card = {"id": "fake-model", **({"root": self.state.model_root} if self.state.model_root else {})}
            self._json(200, {"object": "list", "data": [card]})
        elif self.path == "/metrics":
            self._send(200, "text/plain", self._metrics_text().encode())
        else:
            self._json(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.state.lock:
            self.state.bodies.append(body)
        prompt = body.get("prompt") or " ".join(m["content"] for m in body.get("messages", []))
        if self.state.reject_ignore_eos and "ignore_eos" in body:
            self._json(400, {"error": {"message": "unknown field ignore_eos", "param": "ignore_eos"}})
        elif self.state.reject_logit_bias and "logit_bias" in body:
            self._json(500, {"error": {"message": "logit_bias not supported"}})
        elif "STALL" in prompt:
            time.sleep(self.state.stall_s)
            self._json(500, {"error": {"message": "stalled"}})
        elif "ERR" in prompt:
            self.send_response(200)
            self.end_headers()
            self._event({"choices": [{"index": 0, "delta": {"content": " hi"}, "finish_reason": None}]})
            self._event({"error": {"message": "engine died", "code": 500}})
        elif self.state.eos_first and not body.get("ignore_eos") and not body.get("logit_bias"):
            self.send_response(200)
            self.end_headers()
            self._event({"choices": [{"index": 0, "delta": {}, "text": "", "finish_reason": "stop"}]})
            self.wfile.write(b"data: [DONE]\n\n")
        elif "FAIL" in prompt:
            self._json(500, {"error": {"message": "boom"}})
        else:
            self._stream(body, num_chunks=2 if "CUT" in prompt else body["max_tokens"], cut="CUT" in prompt)

    def _stream(self, body: dict, num_chunks: int, cut: bool) -> None:
        chat = "messages" in body
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        with self.state.lock:
            self.state.num_in_flight += 1
            self.state.num_streams += 1
            if self.state.replicas:
                self.send_header("X-Pagedserve-Replica",
                                 self.state.replicas[self.state.num_streams % len(self.state.replicas)])
        self.end_headers()
        completed = False
        try:
            for i in range(num_chunks):
                time.sleep(self.state.chunk_delay_s)
                finish = None if cut or i < num_chunks - 1 else "length"
                choice = {"index": 0, "finish_reason": finish}
                choice |= {"delta": {"content": " hello"}} if chat else {"text": " hello"}
                self._event({"choices": [choice]})
            completed = not cut
        finally:
            with self.state.lock:  # before the last bytes go out, so a client never sees stale counters
                self.state.num_in_flight -= 1
                self.state.num_completed += completed
        if not completed:
            return
        if self.state.send_usage and body.get("stream_options", {}).get("include_usage"):
            usage = {"prompt_tokens": 7, "completion_tokens": num_chunks, "total_tokens": 7 + num_chunks}
            if self.state.cached_tokens is not None:
                usage["prompt_tokens_details"] = {"cached_tokens": self.state.cached_tokens}
            self._event({"choices": [], "usage": usage})
        self.wfile.write(b"data: [DONE]\n\n")

    def _event(self, chunk: dict) -> None:
        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.flush()

    def _metrics_text(self) -> str:
        with self.state.lock:
            done, in_flight = self.state.num_completed, self.state.num_in_flight
        return (
            "# HELP pagedserve_prefix_cache_hits_total Prefix cache hits.\n"
            "# TYPE pagedserve_prefix_cache_hits_total counter\n"
            f'pagedserve_prefix_cache_hits_total{{model="fake"}} {done * PREFIX_HITS_PER_REQUEST}\n'
            f"pagedserve_prefix_cache_hits_created 1.7e9\n"
            f"pagedserve_prefix_cache_queries_total {done * PREFIX_QUERIES_PER_REQUEST}\n"
            "pagedserve_num_preemptions_total 0\n"
            f"pagedserve_kv_cache_usage_ratio {in_flight / 10}\n"
        )

    def _json(self, status: int, payload: dict) -> None:
        self._send(status, "application/json", json.dumps(payload).encode())

    def _send(self, status: int, content_type: str, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class FakeOpenAIServer:
    """Runs in a background thread on a free loopback port; use as a context manager."""

    def __init__(self, state: FakeState):
        self.state = state
        handler = type("Handler", (_Handler,), {"state": state})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._server.handle_error = lambda request, address: None  # clients that hang up are part of the tests
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "FakeOpenAIServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
