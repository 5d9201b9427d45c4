"""`serve` end to end against the in-process fake server (tests the client only; real servers come later)."""

import asyncio
import json

import pytest

from pagedserve.benchmarks.cli import main
from pagedserve.benchmarks.client import make_http_client, send_request
from pagedserve.benchmarks.datasets import BenchRequest
from pagedserve.benchmarks.payload import EndpointConfig
from pagedserve.benchmarks.probe import resolve_eos_suppression
from pagedserve.benchmarks.records import RequestRecord
from pagedserve.services.ports import free_port
from tests.unit.benchmarks.conftest import MODEL_DIR
from tests.unit.benchmarks.fake_openai_server import (
    PREFIX_HITS_PER_REQUEST,
    PREFIX_QUERIES_PER_REQUEST,
    FakeOpenAIServer,
    FakeState,
)

NUM_OUTPUT_TOKENS = 8
TRACE = ["warm a", "warm b", "q1", "FAIL q2", "q3", "CUT q4", "q5", "FAIL q6", "q7", "q8"]


def serve_args(base_url: str, tmp_path, *extra: str) -> list[str]:
    return [
        "serve",
        "--base-url",
        base_url,
        "--model",
        "fake-model",
        "--tokenizer",
        str(MODEL_DIR),
        "--metrics-interval",
        "0.01",
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(tmp_path),
        *extra,
    ]


def test_serve_counts_failures_and_saves_the_contract(tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(json.dumps({"prompt": p, "output_tokens": NUM_OUTPUT_TOKENS}) for p in TRACE))
    state = FakeState(reject_ignore_eos=True, chunk_delay_s=0.005)
    with FakeOpenAIServer(state) as server:
        rc = main(
            serve_args(
                server.base_url,
                tmp_path,
                "--dataset-name",
                "custom",
                "--dataset-path",
                str(trace),
                "--num-prompts",
                "10",
                "--num-warmups",
                "2",
                "--max-concurrency",
                "3",
                "--ignore-eos",
                "--goodput",
                "ttft:60000",
                "--result-filename",
                "r.json",
                "--seed",
                "4",
            )
        )
    assert rc == 1  # a run with failed requests is a failed run
    captured = capsys.readouterr()
    out = captured.out
    assert captured.err.strip().splitlines()[-1] == "error: 3 of 10 requests failed (http_500: 2, incomplete_stream: 1)"
    assert "Failed requests:                            3  (http_500: 2, incomplete_stream: 1)" in out
    assert 'http_500: {"error": {"message": "boom"}}' in out
    result = json.loads((tmp_path / "r.json").read_text())
    contract = result["contract"]
    assert contract["model"] == "fake-model"
    assert contract["server"]["version"] == "fake-1.0"
    assert contract["server"]["models"] == ["fake-model"]
    assert contract["eos_suppression"] == "logit-bias"  # the fake rejected ignore_eos with a 400
    assert contract["dataset"]["name"] == "custom" and contract["seed"] == 4
    assert contract["args"]["max_concurrency"] == 3 and contract["num_warmup_failures"] == 0
    assert contract["machine"]["cpu_count"] >= 1 and contract["machine"]["python"]

    (run,) = result["runs"]
    m = run["metrics"]
    assert (m["completed"], m["failed"]) == (7, 3)
    assert m["failures"] == {"http_500": 2, "incomplete_stream": 1}
    assert m["total_output_tokens"] == 7 * NUM_OUTPUT_TOKENS and m["num_short_outputs"] == 0
    assert m["num_good"] == 7 and 1 <= m["max_in_flight"] <= 3
    records = run["requests"]
    assert [r["error"] for r in records] == [
        None,
        None,
        None,
        "http_500",
        None,
        "incomplete_stream",
        None,
        "http_500",
        None,
        None,
    ]
    ok = [r for r in records if r["error"] is None]
    assert all(r["output_tokens_source"] == "usage" and r["num_output_tokens"] == NUM_OUTPUT_TOKENS for r in ok)
    assert all(len(r["chunk_times_s"]) == NUM_OUTPUT_TOKENS and r["chunk_times_s"][0] <= r["e2el_s"] for r in ok)
    assert all(r["num_prompt_tokens"] == 7 for r in ok)  # the fake's usage.prompt_tokens wins over the dataset

    server_metrics = run["server_metrics"]
    assert server_metrics["prefix_cache_hits"] == 7 * PREFIX_HITS_PER_REQUEST  # warm-ups are not in the delta
    assert server_metrics["prefix_cache_queries"] == 7 * PREFIX_QUERIES_PER_REQUEST
    assert server_metrics["prefix_cache_hit_rate"] == 0.5 and server_metrics["num_preemptions"] == 0
    assert 0.1 <= server_metrics["kv_cache_usage_peak"] <= 0.3  # 1 to 3 requests in flight, 0.1 each
    assert server_metrics["server_metric_names"]["kv_cache_usage"] == "pagedserve_kv_cache_usage_ratio"

    assert state.bodies[0]["ignore_eos"] is True  # the probe
    measured = state.bodies[-10:]
    assert all(b["logit_bias"] == {"2": -100.0} and "ignore_eos" not in b for b in measured)
    assert {b["messages"][-1]["content"] for b in measured} == set(TRACE)


def test_sweep_writes_one_run_per_point_plots_and_compares(tmp_path, tokenizer, capsys):
    state = FakeState(send_usage=False)
    args = [
        "--backend",
        "openai-completions",
        "--num-prompts",
        "4",
        "--random-input-len",
        "20",
        "--random-output-len",
        "4",
        "--sweep",
        "max-concurrency=1,2",
        "--ignore-eos",
        "--plot",
    ]
    with FakeOpenAIServer(state) as server:
        assert main(serve_args(server.base_url, tmp_path, *args, "--label", "A", "--result-filename", "a.json")) == 0
        assert main(serve_args(server.base_url, tmp_path, *args, "--label", "B", "--result-filename", "b.json")) == 0
    result = json.loads((tmp_path / "a.json").read_text())
    assert [run["label"] for run in result["runs"]] == [
        "request_rate=inf,max_concurrency=1",
        "request_rate=inf,max_concurrency=2",
    ]
    assert [run["offered_load"] for run in result["runs"]] == [1.0, 2.0]
    assert [run["seed"] for run in result["runs"]] == [0, 1]
    assert result["contract"]["eos_suppression"] == "ignore-eos"
    ok = [r for run in result["runs"] for r in run["requests"]]
    assert all(r["output_tokens_source"] == "tokenizer" for r in ok)
    assert all(r["num_output_tokens"] == tokenizer.count(" hello" * 4) for r in ok)
    prompts = [b["prompt"] for b in state.bodies if b["max_tokens"] != 2]  # leave out the EOS probes
    assert len(set(prompts[:4]) & set(prompts[4:8])) == 0  # each point gets fresh prompts
    points = [set(prompts[i : i + 4]) for i in range(0, 16, 4)]  # A's two points, then B's
    assert points[:2] == points[2:]  # and the same ones for the same seed
    for name in ("a_concurrency1_distributions.png", "a_concurrency2_distributions.png", "a_vs_load.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    capsys.readouterr()
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--plot", str(tmp_path / "c.png")]) == 0
    table = capsys.readouterr().out
    assert "== request_rate=inf,max_concurrency=2 ==" in table and "B/A" in table
    completed = next(line for line in table.splitlines() if line.startswith("completed"))
    assert completed.split() == ["completed", "4", "4", "1.000"]
    assert (tmp_path / "c.png").is_file()


async def send_one(cfg: EndpointConfig, prompt: str) -> RequestRecord:
    async with make_http_client(cfg) as client:
        return await send_request(client, cfg, BenchRequest(prompt, None, 4), RequestRecord(0, 4), None)


def test_refused_connection_is_a_connection_failure():
    cfg = EndpointConfig(base_url=f"http://127.0.0.1:{free_port()}", model="m")
    record = asyncio.run(send_one(cfg, "hi"))
    assert record.error == "connection" and record.http_status is None


def test_slow_server_is_a_timeout():
    with FakeOpenAIServer(FakeState(stall_s=1.0)) as server:
        cfg = EndpointConfig(base_url=server.base_url, model="m", request_timeout_s=0.2)
        record = asyncio.run(send_one(cfg, "STALL"))
    assert record.error == "timeout"
    assert 0.2 <= record.e2el_s < 0.9  # gave up at the timeout, not when the server answered after 1 s


def test_chunks_without_usage_fall_back_to_counting_chunks():
    with FakeOpenAIServer(FakeState(send_usage=False)) as server:
        record = asyncio.run(send_one(EndpointConfig(base_url=server.base_url, model="m"), "hi"))
    assert record.ok and record.finish_reason == "length"
    assert (record.output_tokens_source, record.num_output_tokens) == ("chunks", 4)


def test_bad_flags_exit_with_2(capsys):
    assert main(["serve", "--model", "m", "--goodput", "ttft"]) == 2
    assert "--goodput" in capsys.readouterr().err


async def resolve(base_url: str, eos_token_ids: tuple[int, ...]) -> str:
    cfg = EndpointConfig(base_url=base_url, model="m", ignore_eos=True, eos_token_ids=eos_token_ids)
    async with make_http_client(cfg) as client:
        return (await resolve_eos_suppression(client, cfg)).eos_suppression


def test_auto_eos_suppression_falls_back_in_order(capsys):
    with FakeOpenAIServer(FakeState()) as server:
        assert asyncio.run(resolve(server.base_url, (2,))) == "ignore-eos"
    with FakeOpenAIServer(FakeState(reject_ignore_eos=True)) as server:
        assert asyncio.run(resolve(server.base_url, (2,))) == "logit-bias"
        assert asyncio.run(resolve(server.base_url, ())) == "none"  # no EOS ids: skip logit_bias
    state = FakeState(reject_ignore_eos=True, reject_logit_bias=True)
    with FakeOpenAIServer(state) as server:
        assert asyncio.run(resolve(server.base_url, (2,))) == "none"
    assert [sorted(set(b) & {"ignore_eos", "logit_bias"}) for b in state.bodies] == [["ignore_eos"], ["logit_bias"], []]
    assert "warning: server accepts no EOS suppression" in capsys.readouterr().out


def test_auto_eos_suppression_stops_when_the_server_is_down():
    with pytest.raises(RuntimeError, match="ignore-eos: connection"):
        asyncio.run(resolve(f"http://127.0.0.1:{free_port()}", (2,)))


def test_error_object_inside_a_stream_is_a_stream_error():
    with FakeOpenAIServer(FakeState()) as server:
        record = asyncio.run(send_one(EndpointConfig(base_url=server.base_url, model="m"), "ERR"))
    assert record.error == "stream_error" and "engine died" in record.error_detail
    assert record.http_status == 200 and len(record.chunk_times_s) == 1


def test_cached_tokens_and_replicas_from_usage_and_headers(tmp_path, capsys):
    """Routing quality without server metrics: the share of prompt tokens the server says it served from cache,
    and which replica answered each request."""
    state = FakeState(cached_tokens=5, replicas=("replica-0", "replica-1"), chunk_delay_s=0.001)
    with FakeOpenAIServer(state) as server:
        rc = main(serve_args(server.base_url, tmp_path, "--dataset-name", "random", "--random-input-len", "8",
                             "--random-output-len", "2", "--num-prompts", "4", "--max-concurrency", "1",
                             "--ignore-eos", "--result-filename", "r.json"))
    assert rc == 0
    metrics = json.loads((tmp_path / "r.json").read_text())["runs"][0]["metrics"]
    assert metrics["cached_prompt_tokens_ratio"] == pytest.approx(5 / 7)
    assert metrics["requests_per_replica"] == {"replica-0": 2, "replica-1": 2}
    out = capsys.readouterr().out
    assert "Cached prompt tokens, from usage (%):       71.4" in out
    assert "Requests per replica:                       replica-0: 2, replica-1: 2" in out


def test_constrained_body_reaches_the_given_share_and_the_contract(tmp_path):
    state = FakeState()
    body = {"response_format": {"type": "json_object"}}
    args = ["--num-prompts", "6", "--random-input-len", "20", "--random-output-len", "4", "--num-warmups", "2",
            "--constrained-body", json.dumps(body), "--constrained-fraction", "0.5", "--result-filename", "c.json"]
    with FakeOpenAIServer(state) as server:
        assert main(serve_args(server.base_url, tmp_path, *args)) == 0
    result = json.loads((tmp_path / "c.json").read_text())
    assert result["contract"]["constrained_body"] == body and result["contract"]["constrained_fraction"] == 0.5
    measured = state.bodies[-6:]
    assert sorted("response_format" in b for b in measured) == [False] * 3 + [True] * 3
    warmups = state.bodies[-8:-6]
    assert any("response_format" in b for b in warmups)  # a grammar compiles before the measured point
