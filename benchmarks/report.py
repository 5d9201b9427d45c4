"""The result document (JSON) and its terminal rendering: one table per run and a summary row per sweep point."""

import json
import math
from pathlib import Path

from pagedserve.benchmarks.load import offered_load
from pagedserve.benchmarks.metrics import LATENCY_METRICS, latency_percentiles_ms
from pagedserve.benchmarks.records import RequestRecord
from pagedserve.benchmarks.runner import RunResult

_WIDTH = 60
_NAMES = {
    "ttft": "Time to First Token",
    "tpot": "Time per Output Token (excl. 1st)",
    "itl": "Inter-token Latency",
    "e2el": "End-to-end Latency",
}


def run_to_dict(result: RunResult, sweep: str | None) -> dict:
    x = offered_load(result.point, sweep.partition("=")[0] if sweep else None)
    return {
        "label": result.point.label,
        "load": result.point.as_dict(),
        "offered_load": None if math.isinf(x) else x,  # x of sweep plots: the swept rate or concurrency
        "seed": result.seed,
        "started_at": result.started_at,
        "metrics": result.metrics,
        "server_metrics": result.server_metrics,
        "requests": [record.to_json() for record in result.records],
    }


def run_records(run: dict) -> list[RequestRecord]:
    return [RequestRecord.from_json(record) for record in run["requests"]]


def save_result(result: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))


def load_result(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


def _row(name: str, value) -> str:
    if isinstance(value, float):
        value = f"{value:.2f}"
    return f"{name + ':':<44}{'-' if value is None else value}"


def _rule(title: str = "", char: str = "-") -> str:
    return f"{title:{char}^{_WIDTH}}"


def run_table(run: dict) -> str:
    m = run["metrics"]
    failures = ", ".join(f"{kind}: {n}" for kind, n in m["failures"].items())
    lines = [_rule(" Serving Benchmark Result ", "="), _row("Load point", run["label"])]
    lines += [
        _row("Successful requests", m["completed"]),
        _row("Failed requests", f"{m['failed']}" + (f"  ({failures})" if failures else "")),
        _row("Outputs shorter than max_tokens", m["num_short_outputs"]),
        _row("Benchmark duration (s)", m["duration_s"]),
        _row("Total input tokens", m["total_input_tokens"]),
        _row("Total generated tokens", m["total_output_tokens"]),
        _row("Request throughput (req/s)", m["request_throughput_rps"]),
        _row("Output token throughput (tok/s)", m["output_throughput_tok_s"]),
        _row("Total token throughput (tok/s)", m["total_token_throughput_tok_s"]),
        _row("Max requests in flight", m["max_in_flight"]),
    ]
    if m.get("cached_prompt_tokens_ratio") is not None:
        lines.append(_row("Cached prompt tokens, from usage (%)", _percent(m["cached_prompt_tokens_ratio"])))
    if m.get("requests_per_replica"):
        lines.append(_row("Requests per replica", ", ".join(f"{k}: {v}" for k, v in m["requests_per_replica"].items())))
    if "request_goodput_rps" in m:
        lines.append(_row("Request goodput (req/s)", m["request_goodput_rps"]))
    for name in LATENCY_METRICS:
        keys = [k for k in m if k.endswith(f"_{name}_ms")]
        if keys:
            lines.append(_rule(f" {_NAMES[name]} "))
            lines += [_row(f"{k.split('_')[0].capitalize()} {name.upper()} (ms)", m[k]) for k in keys]
    lines += _error_examples(run["requests"])
    lines += _server_rows(run["server_metrics"])
    return "\n".join([*lines, _rule(char="=")])


def _error_examples(requests: list[dict]) -> list[str]:
    """The first error message of each failure kind, so a wrong model name or URL shows at once."""
    first: dict[str, str] = {}
    for request in requests:
        if request["error"] is not None:
            first.setdefault(request["error"], (request["error_detail"] or "").replace("\n", " ")[:_WIDTH])
    return (
        [_rule(" First error of each kind "), *(f"{kind}: {detail}" for kind, detail in first.items())] if first else []
    )


def _server_rows(server: dict | None) -> list[str]:
    if server is None:
        return []
    counts = [
        ("Prefix cache hits (delta)", "prefix_cache_hits"),
        ("Prefix cache queries (delta)", "prefix_cache_queries"),
        ("Preemptions (delta)", "num_preemptions"),
        ("Speculative drafts (delta)", "spec_decode_num_drafts"),
        ("Draft tokens (delta)", "spec_decode_num_draft_tokens"),
        ("Accepted draft tokens (delta)", "spec_decode_num_accepted_tokens"),
    ]
    fractions = [
        ("Prefix cache hit rate (%)", "prefix_cache_hit_rate"),
        ("KV cache usage peak (%)", "kv_cache_usage_peak"),
    ]
    by_position = server.get("spec_decode_acceptance_by_position")
    acceptance = [_row("Acceptance by draft position (%)", " ".join(_percent(a) for a in by_position))
                  ] if by_position else []
    return [
        _rule(" Server metrics (/metrics) "),
        *(_row(title, server.get(key)) for title, key in counts),
        *(_row(title, _percent(server.get(key))) for title, key in fractions),
        *acceptance,
    ]


def _percent(fraction: float | None) -> str | None:
    """A 0-1 fraction as a percentage: a peak of 0.004 reads 0.4, not 0.00."""
    return None if fraction is None else f"{100 * fraction:.1f}"


def sweep_table(result: dict) -> str:
    """One row per load point: throughput, p50/p99 latencies and failures."""
    header = f"{'load point':<44}{'ok':>6}{'fail':>6}{'req/s':>8}{'tok/s':>9}"
    header += "".join(f"{name.upper() + ' p50/p99 ms':>22}" for name in LATENCY_METRICS)
    lines = [header]
    for run in result["runs"]:
        m = run["metrics"]
        pcts = latency_percentiles_ms(run_records(run), (50.0, 99.0))
        row = f"{run['label']:<44}{m['completed']:>6}{m['failed']:>6}"
        row += f"{m['request_throughput_rps']:>8.2f}{m['output_throughput_tok_s']:>9.1f}"
        row += "".join(f"{_pair(pcts[name]):>22}" for name in LATENCY_METRICS)
        lines.append(row)
    return "\n".join(lines)


def _pair(values: dict[str, float | None]) -> str:
    return "/".join("-" if v is None else f"{v:.1f}" for v in (values["p50"], values["p99"]))
