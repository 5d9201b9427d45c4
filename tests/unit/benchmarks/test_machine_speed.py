"""The machine-speed probe that `make bench` / `make bench-peers` run before and after the suite."""

import json
import signal

import torch

import pagedserve.benchmarks.peers.__main__ as peers_main
from pagedserve.benchmarks.peers.machine_speed import MachineSpeed, measure_speed, save_speeds
from pagedserve.benchmarks.peers.servers import ServerKind
from tests.unit.benchmarks.conftest import MODEL_DIR
from tests.unit.benchmarks.test_peers import fake_spec


def test_measures_one_and_all_threads_and_restores_torch_threads():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        speed = measure_speed(threads=2)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(previous)
    assert speed.threads == 2
    assert speed.gflops_one_thread > 1 and speed.gflops_all_threads > 1
    assert speed.scaling == speed.gflops_all_threads / speed.gflops_one_thread


def test_line_and_json_carry_both_figures_and_the_scaling(tmp_path):
    before = MachineSpeed("2026-12-01 21:00:00 UTC", 2, 50.0, 72.5)
    after = MachineSpeed("2026-12-01 21:30:00 UTC", 2, 60.0, 120.0)
    assert before.line() == "fp32 GEMM 50 GFLOP/s on 1 thread, 72 on 2 (1.45x), at 2026-12-01 21:00:00 UTC"
    save_speeds(tmp_path / "out" / "machine-speed.json", {"before": before, "after": after})
    saved = json.loads((tmp_path / "out" / "machine-speed.json").read_text())
    assert saved["before"]["scaling"] == 1.45 and saved["after"]["gflops_all_threads"] == 120.0


def test_the_suite_probes_the_machine_before_and_after(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(peers_main.SERVER_KINDS, "pagedserve", ServerKind("pagedserve", fake_spec("pagedserve")))
    speeds = iter([MachineSpeed("t0", 2, 50.0, 70.0), MachineSpeed("t1", 2, 55.0, 110.0)])
    monkeypatch.setattr(peers_main, "measure_speed", lambda: next(speeds))
    argv = ["--servers", "pagedserve", "--model-dir", str(MODEL_DIR), "--out-dir", str(tmp_path), "--concurrencies",
            "1", "--workloads", "random", "--min-prompts", "2", "--num-warmups", "0", "--no-plot"]
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)}
    assert peers_main.main(argv) == 0
    # main() in-process leaves the caller's handlers alone (a SIGTERM to the test runner used to become SystemExit 143)
    assert {signum: signal.getsignal(signum) for signum in handlers} == handlers
    out = capsys.readouterr().out
    assert "machine before: fp32 GEMM 50 GFLOP/s on 1 thread, 70 on 2 (1.40x), at t0" in out
    assert "machine after: fp32 GEMM 55 GFLOP/s on 1 thread, 110 on 2 (2.00x), at t1" in out
    saved = json.loads((tmp_path / "machine-speed.json").read_text())
    assert (saved["before"]["measured_at"], saved["after"]["measured_at"]) == ("t0", "t1")
