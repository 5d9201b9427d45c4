"""The device script's targets table judges rows as the issue states them (synthetic results, no device)."""

from __future__ import annotations

from pagedserve.benchmarks.device.results import Results, SectionRecord
from pagedserve.benchmarks.device.targets import TARGETS


def _results(tmp_path, engine_rows=(), attention_rows=(), hf_rows=()) -> Results:
    results = Results(tmp_path / "r.json", "cuda")
    results.sections["engine"] = SectionRecord(rows=list(engine_rows))
    results.sections["attention kernels"] = SectionRecord(rows=list(attention_rows))
    results.sections["transformers baseline"] = SectionRecord(rows=list(hf_rows))
    return results


def _verdicts(results: Results) -> dict[str, str]:
    return {t.figure: t.judge(results)[1] for t in TARGETS}


def _engine(shape, batch, tok_s, graphs="on"):
    return {"shape": shape, "graphs": graphs, "batch": batch, "tok_s": tok_s, "step_ms": 1e3 * batch / tok_s}


def test_nothing_measured_is_not_measured(tmp_path):
    assert all(v.startswith("NOT MEASURED") for v in _verdicts(_results(tmp_path)).values())


def test_engine_targets_pass_and_fail_at_their_bounds(tmp_path):
    rows = [_engine("smollm2-135m", 1, 200.0), _engine("smollm2-135m", 256, 30_000.0),
            _engine("smollm2-135m", 64, 12_000.0),
            {"shape": "llama-3.2-1b", "graphs": "on", "weight_read_ms": 0.5, "init_s": 1.0},
            _engine("llama-3.2-1b", 1, 1000.0), _engine("llama-3.2-1b", 64, 64 / 1.5e-3)]
    hf = [{"batch": 1, "tok_s": 250.0, "how": "cuda graph"}, {"batch": 64, "tok_s": 6_000.0, "how": "cuda graph"}]
    verdicts = _verdicts(_results(tmp_path, rows, hf_rows=hf))
    assert verdicts["SmolLM2 shape, decode tok/s, graphs on"] == "PASS"
    assert verdicts["same, vs transformers StaticCache + CUDA graph"] == "PASS"  # 0.8x and 2.0x exactly
    assert verdicts["1B shape, batch-1 step"] == "PASS"  # 1.0 ms <= 2 x 0.5 ms
    assert verdicts["1B shape, batch-64 step vs batch-1 step"] == "FAIL"  # 1.5x
    rows[0] = _engine("smollm2-135m", 1, 199.0)
    assert _verdicts(_results(tmp_path, rows, hf_rows=hf))["SmolLM2 shape, decode tok/s, graphs on"] == "FAIL"


def test_eager_runs_do_not_stand_for_graph_runs(tmp_path):
    rows = [_engine("smollm2-135m", 1, 500.0, graphs="off"), _engine("smollm2-135m", 256, 50_000.0, graphs="off")]
    assert _verdicts(_results(tmp_path, rows))["SmolLM2 shape, decode tok/s, graphs on"].startswith("NOT MEASURED")


def test_attention_floors(tmp_path):
    def row(kind, batch, context, speed):
        return {"kind": kind, "batch": batch, "context": context, "triton_speed_vs_flash": speed,
                "triton_how": "graph"}

    decode = [row("decode", 1, 8192, 0.7), row("decode", 16, 8192, 0.95), row("decode", 64, 2048, 0.95),
              row("decode", 256, 8192, 0.96)]
    prefill = [row("prefill", 1, 8192, 0.79), row("prefill", 4, 8192, 0.9)]
    verdicts = _verdicts(_results(tmp_path, attention_rows=decode + prefill))
    assert verdicts["paged decode, graph-timed, cold L2, vs FLASH"] == "PASS"
    assert verdicts["prefill vs SDPA FLASH"] == "FAIL"
