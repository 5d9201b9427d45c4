"""The `serve` command: probe the server, warm it up, run every load point and assemble the result."""

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime

import aiohttp

from pagedserve.benchmarks.client import make_http_client
from pagedserve.benchmarks.contract import machine_info
from pagedserve.benchmarks.dataset_builder import build_dataset
from pagedserve.benchmarks.datasets import DatasetConfig
from pagedserve.benchmarks.discovery import resolve
from pagedserve.benchmarks.load import LoadPoint
from pagedserve.benchmarks.payload import EndpointConfig, mark_constrained
from pagedserve.benchmarks.probe import resolve_eos_suppression, server_info
from pagedserve.benchmarks.report import run_to_dict
from pagedserve.benchmarks.runner import RunOptions, run_point, run_warmups
from pagedserve.benchmarks.tokenizer import BenchTokenizer

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class ServeConfig:
    endpoint: EndpointConfig
    dataset: DatasetConfig
    run: RunOptions
    points: tuple[LoadPoint, ...]
    sweep: str | None = None  # e.g. "max-concurrency=1,4,16"; None for a single point
    seed: int = 0  # point i uses seed + i, so every point gets fresh prompts (no cache hits carried between points)
    num_warmups: int = 0
    label: str = "bench"


async def run_serve(
    cfg: ServeConfig,
    tokenizer: BenchTokenizer | None,
    args: dict,
    on_run: Callable[[dict], None] = lambda run: None,
) -> dict:
    """Returns the result document (see report.py); `on_run` sees each point's run as soon as it finishes."""
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    async with make_http_client(cfg.endpoint) as client:
        server = await server_info(client, cfg.endpoint)
        endpoint, tokenizer = resolve(cfg.endpoint, tokenizer, server)
        count_tokens = tokenizer.count if tokenizer else None
        endpoint = await resolve_eos_suppression(client, endpoint)
        num_warmup_failures = await _warm_up(client, endpoint, cfg, tokenizer)
        runs = []
        for i, point in enumerate(cfg.points):
            requests = mark_constrained(build_dataset(cfg.dataset, tokenizer, cfg.seed + i),
                                        endpoint.constrained_fraction)
            result = await run_point(client, endpoint, requests, point, cfg.seed + i, cfg.run, count_tokens)
            runs.append(run_to_dict(result, cfg.sweep))
            on_run(runs[-1])
    contract = _contract(cfg, endpoint, tokenizer, server, args, started_at, num_warmup_failures)
    return {"schema_version": SCHEMA_VERSION, "contract": contract, "runs": runs}


async def _warm_up(
    client: aiohttp.ClientSession, endpoint: EndpointConfig, cfg: ServeConfig, tokenizer: BenchTokenizer | None
) -> int:
    """Warm-up prompts come from a seed no point uses. Returns how many failed."""
    if cfg.num_warmups == 0:
        return 0
    dataset = replace(cfg.dataset, num_prompts=cfg.num_warmups)
    requests = mark_constrained(build_dataset(dataset, tokenizer, cfg.seed + len(cfg.points)),
                                endpoint.constrained_fraction)  # grammars compile here, not in a point
    records = await run_warmups(client, endpoint, requests, cfg.points[0].max_concurrency)
    failures = [record for record in records if not record.ok]
    if failures:
        print(f"warning: {len(failures)} warm-up requests failed, e.g. {failures[0].error}: {failures[0].error_detail}")
    return len(failures)


def _contract(
    cfg: ServeConfig,
    endpoint: EndpointConfig,
    tokenizer: BenchTokenizer | None,
    server: dict,
    args: dict,
    started_at: str,
    num_warmup_failures: int,
) -> dict:
    return {
        "label": cfg.label,
        "started_at": started_at,
        "model": endpoint.model,
        "tokenizer": tokenizer.path if tokenizer else None,
        "endpoint_type": endpoint.endpoint_type,
        "server": server,
        "sampling": {"temperature": endpoint.temperature, "ignore_eos": endpoint.ignore_eos},
        "eos_suppression": endpoint.eos_suppression if endpoint.ignore_eos else None,
        "eos_token_ids": list(endpoint.eos_token_ids),
        "extra_body": endpoint.extra_body,
        "constrained_body": endpoint.constrained_body,
        "constrained_fraction": endpoint.constrained_fraction,
        "dataset": asdict(cfg.dataset),
        "seed": cfg.seed,
        "sweep": cfg.sweep,
        "num_warmups": cfg.num_warmups,
        "num_warmup_failures": num_warmup_failures,
        "args": {k: ("<redacted>" if k == "api_key" and v else v) for k, v in args.items()},
        "machine": machine_info(),
    }
