"""The peers runner (`make bench`, `make bench-peers`) driven against fake servers started as real processes."""

import itertools
import json
import socket
import statistics
import sys
from pathlib import Path

import pytest

from pagedserve.benchmarks.peers.plan import SuitePlan
from pagedserve.benchmarks.peers.process import ServerProcess, ServerSpec
from pagedserve.benchmarks.peers.ratios import BEST_LLAMA, comparison
from pagedserve.benchmarks.peers.results import write_server_results
from pagedserve.benchmarks.peers.run import bench_server, point_problem
from pagedserve.benchmarks.peers.servers import (
    SERVER_KINDS,
    ServerKind,
    ServerOptions,
    llama_spec,
    pagedserve_spec,
    server_kinds,
)
from pagedserve.benchmarks.suite import DEFAULT_WORKLOADS, WORKLOADS
from pagedserve.services.ports import free_port
from pagedserve.services.serve_config import parse_serve_config
from tests.unit.benchmarks.conftest import MODEL_DIR

REPO = Path(__file__).resolve().parents[3]


def fake_spec(label: str):
    def spec(options: ServerOptions, concurrency: int) -> ServerSpec:
        port = free_port()
        argv = [sys.executable, "-m", "tests.unit.benchmarks.fake_server_process", str(port)]
        return ServerSpec(label, argv, port, env={"PYTHONPATH": str(REPO)}, startup_timeout_s=30, stop_timeout_s=5)

    return spec


def port_is_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_prompts_and_seeds_per_point(tmp_path):
    plan = SuitePlan(tmp_path)
    assert [plan.prompts_for(c) for c in (1, 4, 16, 64)] == [8, 8, 16, 64]
    assert SuitePlan(tmp_path, prompts_per_concurrency=2).prompts_for(64) == 128
    assert SuitePlan(tmp_path, num_prompts=5).prompts_for(64) == 5


def test_pagedserve_gets_its_own_extra_points(tmp_path):
    plan = SuitePlan(tmp_path, concurrencies=(1, 4, 16), own_concurrencies=(64, 4))
    assert plan.concurrencies_for("pagedserve") == (1, 4, 16, 64)
    assert plan.concurrencies_for("llama.cpp") == (1, 4, 16)
    assert plan.concurrencies_for("llama.cpp-spec") == (1, 4, 16)
    assert plan.concurrencies_for("pagedserve-plain") == (1, 4, 16, 64)
    seeds = [plan.seed_for(c) for c in (1, 4, 16, 64)]
    assert not {s + 1 for s in seeds} & set(seeds), "a warm-up seed must never be a point's seed"
    with pytest.raises(ValueError):
        SuitePlan(tmp_path, concurrencies=(0,))


def test_llama_server_gets_one_slot_per_concurrent_request(tmp_path):
    spec = llama_spec(ServerOptions(MODEL_DIR, tmp_path, llama_ctx_per_slot=2048, threads=1), 16)
    argv = spec.argv
    assert argv[argv.index("-np") + 1] == "16" and argv[argv.index("-c") + 1] == str(16 * 2048)
    assert argv[argv.index("--port") + 1] == str(spec.port)


def test_a_llama_thread_sweep_runs_one_server_per_count(tmp_path):
    kinds = server_kinds(["pagedserve", "llama.cpp"], (1, 2))
    assert list(kinds) == ["pagedserve", "llama.cpp-t1", "llama.cpp-t2"]
    spec = kinds["llama.cpp-t2"].spec(ServerOptions(MODEL_DIR, tmp_path, threads=1), 16)
    assert spec.label == "llama.cpp-t2" and spec.argv[spec.argv.index("-t") + 1] == "2"
    assert list(server_kinds(["pagedserve", "llama.cpp"], (2,))) == ["pagedserve", "llama.cpp"]


def test_pagedserve_queues_a_burst_instead_of_refusing_it(tmp_path):
    """Its argv is one `serve` takes, with the admission bound on predicted queue time lifted."""
    argv = pagedserve_spec(ServerOptions(MODEL_DIR, tmp_path), 16).argv
    assert argv[3:5] == ["serve", str(MODEL_DIR)]
    config = parse_serve_config(argv[4:], environ={})
    assert config.scheduler.admission.max_queue_wait_s == 0.0


def test_a_given_gguf_is_what_both_servers_run(tmp_path):
    gguf = tmp_path / "model.Q4_K_M.gguf"
    options = ServerOptions(MODEL_DIR, tmp_path / "peers", gguf=gguf)
    assert pagedserve_spec(options, 16).argv[4] == str(gguf)
    llama = llama_spec(options, 16).argv
    assert llama[llama.index("-m") + 1] == str(gguf)
    with pytest.raises(RuntimeError, match="not the --gguf file"):
        SERVER_KINDS["transformers"].prepare(options)


def test_speculation_runs_against_plain_pagedserve_and_both_llama_modes(tmp_path):
    """`pagedserve` takes --speculative-config, `pagedserve-plain` never; llama.cpp-spec adds its n-gram flags."""
    config = '{"method": "ngram", "num_speculative_tokens": 4}'
    options = ServerOptions(MODEL_DIR, tmp_path, speculative_config=config)
    speculative = SERVER_KINDS["pagedserve"].spec(options, 1).argv
    assert speculative[speculative.index("--speculative-config") + 1] == config
    assert parse_serve_config(speculative[4:], environ={}).scheduler.scheduler.speculative_config == config
    plain = SERVER_KINDS["pagedserve-plain"].spec(options, 1)
    assert plain.label == "pagedserve-plain" and "--speculative-config" not in plain.argv
    llama = SERVER_KINDS["llama.cpp"].spec(options, 1).argv
    llama_speculative = SERVER_KINDS["llama.cpp-spec"].spec(options, 1)
    assert "--spec-type" not in llama and llama_speculative.label == "llama.cpp-spec"
    assert llama_speculative.argv[len(llama):] == list(options.llama_spec_args)
    assert llama_speculative.argv[llama_speculative.argv.index("--spec-type") + 1] == "ngram-simple"


def test_the_copy_heavy_workload_runs_on_request_only():
    copy_heavy = next(w for w in WORKLOADS if w.name == "copy-heavy")
    assert copy_heavy.args[copy_heavy.args.index("--dataset-name") + 1] == "copy-heavy"
    assert "copy-heavy" not in DEFAULT_WORKLOADS


def _result(points: dict[int, tuple[float, float]]) -> dict:
    """concurrency -> (output tok/s, median ITL ms), in the shape of a merged result file."""
    runs = [{"load": {"max_concurrency": c}, "metrics": {"output_throughput_tok_s": tps, "median_itl_ms": itl,
                                                         "failed": 0, "num_short_outputs": 0}}
            for c, (tps, itl) in points.items()]
    return {"runs": runs}


def test_pagedserve_is_compared_with_the_best_llama_thread_count_per_point(tmp_path):
    results = {"pagedserve": _result({1: (100.0, 10.0), 16: (300.0, 40.0)}),
               "llama.cpp-t1": _result({1: (90.0, 11.0), 16: (100.0, 30.0)}),
               "llama.cpp-t2": _result({1: (95.0, 12.0), 16: (150.0, 45.0)})}
    for label, result in results.items():
        (tmp_path / f"{label}-random.json").write_text(json.dumps(result))
    table = comparison(tmp_path, list(results), ("random",), plot=False)
    assert f"{BEST_LLAMA} at concurrency 1: llama.cpp-t1" in table  # the lower ITL at one stream
    assert f"{BEST_LLAMA} at concurrency 16: llama.cpp-t2" in table  # the higher throughput under load
    header = next(line for line in table.splitlines() if "ps/" + BEST_LLAMA in line)
    row = next(line for line in table.splitlines() if line.split()[:3] == ["16", "output", "tok/s"])
    assert header.split()[-2:] == [BEST_LLAMA, "ps/" + BEST_LLAMA] and row.split()[-2:] == ["150.0", "2.00"]


def test_a_point_with_failed_requests_is_flagged(tmp_path):
    path = tmp_path / "point.json"
    path.write_text(json.dumps({"runs": [{"metrics": {"failed": 2}}]}))
    assert point_problem(0, path) == "2 requests failed"
    assert point_problem(1, path) == "serve exited with 1"
    assert point_problem(0, tmp_path / "missing.json") == "no result file"


def test_server_process_that_exits_is_reported_with_its_log(tmp_path):
    spec = ServerSpec("broken", [sys.executable, "-c", "print('no model here'); raise SystemExit(3)"], free_port())
    with pytest.raises(RuntimeError, match="exited with 3(.|\n)*no model here"):
        with ServerProcess(spec, tmp_path / "broken.log"):
            pass


def test_runs_each_server_merges_points_and_compares(tmp_path):
    plan = SuitePlan(tmp_path, concurrencies=(1, 2), workloads=("random",), min_prompts=3, num_warmups=1)
    options = ServerOptions(MODEL_DIR, tmp_path / "peers")
    kinds = [ServerKind("pagedserve", fake_spec("pagedserve")),
             ServerKind("peer", fake_spec("peer"), restart_per_concurrency=True)]  # fmt: skip
    for kind in kinds:
        run = bench_server(kind, options, plan, plan.concurrencies)
        assert (run.error, run.failed_points) == (None, [])
        written = write_server_results(plan, kind.label, plan.concurrencies, plot=False)
        assert written == [tmp_path / f"{kind.label}-random.json"]

    logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert logs == ["pagedserve-c1-2.log", "peer-c1.log", "peer-c2.log"]  # the peer was restarted per point
    merged = json.loads((tmp_path / "peer-random.json").read_text())
    assert [run["load"]["max_concurrency"] for run in merged["runs"]] == [1, 2]
    assert [run["metrics"]["completed"] for run in merged["runs"]] == [3, 3]
    assert merged["contract"]["sweep"] == "max-concurrency=1,2"
    assert merged["contract"]["point_seeds"] == [plan.seed_for(1), plan.seed_for(2)]
    ours = json.loads((tmp_path / "pagedserve-random.json").read_text())
    prompts = [[r["num_prompt_tokens"] for r in run["requests"]] for run in ours["runs"]]
    assert prompts == [[r["num_prompt_tokens"] for r in run["requests"]] for run in merged["runs"]]

    table = comparison(tmp_path, ["pagedserve", "peer"], plan.workloads, plot=False)
    assert "== random ==" in table and "ps/peer" in table
    rows = [line for line in table.splitlines() if "median TTFT ms" in line]
    assert [line.split()[0] for line in rows] == ["1", "2"]


def test_rounds_alternate_the_servers_and_each_point_pools_its_rounds(tmp_path):
    plan = SuitePlan(tmp_path, concurrencies=(1,), workloads=("random",), min_prompts=3, num_warmups=0, rounds=2)
    options = ServerOptions(MODEL_DIR, tmp_path / "peers")
    kinds = [ServerKind("pagedserve", fake_spec("pagedserve")), ServerKind("peer", fake_spec("peer"))]
    runs = [bench_server(kind, options, plan, plan.concurrencies, r) for r in range(plan.rounds) for kind in kinds]
    assert [(run.label, run.round_index, run.error, run.failed_points) for run in runs] == [
        ("pagedserve", 0, None, []), ("peer", 0, None, []), ("pagedserve", 1, None, []), ("peer", 1, None, [])]
    rounds = [json.loads(path.read_text()) for path in plan.raw_paths("peer", 1, "random")]
    assert len(rounds) == 2
    write_server_results(plan, "peer", plan.concurrencies, plot=False)
    pooled = json.loads((tmp_path / "peer-random.json").read_text())["runs"][0]
    assert pooled["rounds"] == 2 and pooled["metrics"]["completed"] == 6
    assert pooled["metrics"]["duration_s"] == pytest.approx(sum(r["runs"][0]["metrics"]["duration_s"] for r in rounds))
    gaps = sorted(b - a for r in rounds for request in r["runs"][0]["requests"]
                  for a, b in itertools.pairwise(request["chunk_times_s"]))
    assert pooled["metrics"]["median_itl_ms"] == pytest.approx(1000 * statistics.median(gaps), rel=1e-6)
    assert set(pooled["metrics"]) == set(rounds[0]["runs"][0]["metrics"])  # the same percentiles and fields
