"""Turn parsed `serve` flags into the frozen configs the run reads (the only place flags are interpreted)."""

import argparse
import json
import math
import os
from pathlib import Path

from pagedserve.benchmarks.datasets import SYNTHETIC_DATASETS, DatasetConfig
from pagedserve.benchmarks.load import LoadPoint, parse_sweep
from pagedserve.benchmarks.metrics import MetricsConfig
from pagedserve.benchmarks.payload import BACKEND_ALIASES, EndpointConfig
from pagedserve.benchmarks.runner import RunOptions
from pagedserve.benchmarks.serve import ServeConfig
from pagedserve.benchmarks.tokenizer import BenchTokenizer, load_tokenizer


def serve_config_from_args(args: argparse.Namespace) -> tuple[ServeConfig, BenchTokenizer | None]:
    tokenizer = _tokenizer(args)
    endpoint = _endpoint(args, tokenizer)
    base = LoadPoint(args.request_rate, args.burstiness, args.max_concurrency)
    points = tuple(parse_sweep(args.sweep, base)) if args.sweep else (base,)
    if args.num_warmups < 0:
        raise ValueError("--num-warmups must be >= 0")
    cfg = ServeConfig(
        endpoint=endpoint,
        dataset=_dataset(args),
        run=_run_options(args, endpoint),
        points=points,
        sweep=args.sweep,
        seed=args.seed,
        num_warmups=args.num_warmups,
        label=args.label or endpoint.endpoint_type,
    )
    return cfg, tokenizer


def _tokenizer(args: argparse.Namespace) -> BenchTokenizer | None:
    path = args.tokenizer or (args.model if args.model and Path(args.model).is_dir() else None)
    return load_tokenizer(path) if path else None


def _endpoint(args: argparse.Namespace, tokenizer: BenchTokenizer | None) -> EndpointConfig:
    extra_body = json.loads(args.extra_body) if args.extra_body else {}
    if not isinstance(extra_body, dict):
        raise ValueError("--extra-body must be a JSON object")
    constrained_body = json.loads(args.constrained_body) if args.constrained_body else {}
    if not isinstance(constrained_body, dict):
        raise ValueError("--constrained-body must be a JSON object")
    return EndpointConfig(
        base_url=args.base_url or f"http://{args.host}:{args.port}",
        model=args.model or "",  # "": the server's first model (pagedserve.benchmarks.discovery)
        endpoint_type=BACKEND_ALIASES.get(args.endpoint_type, args.endpoint_type),
        endpoint=args.endpoint,
        api_key=args.api_key or os.environ.get("OPENAI_API_KEY"),
        ignore_eos=args.dataset_name in SYNTHETIC_DATASETS if args.ignore_eos is None else args.ignore_eos,
        eos_suppression=args.eos_suppression,
        eos_token_ids=tokenizer.eos_token_ids if tokenizer else (),
        temperature=args.temperature,
        request_timeout_s=args.request_timeout,
        extra_body=extra_body,
        constrained_body=constrained_body,
        constrained_fraction=(1.0 if constrained_body else 0.0) if args.constrained_fraction is None
        else args.constrained_fraction,
    )


def _dataset(args: argparse.Namespace) -> DatasetConfig:
    return DatasetConfig(
        name=args.dataset_name,
        num_prompts=args.num_prompts,
        path=args.dataset_path,
        random_input_len=args.random_input_len,
        random_output_len=args.random_output_len,
        random_range_ratio=args.random_range_ratio,
        random_prefix_len=args.random_prefix_len,
        shared_prefix_len=args.shared_prefix_len,
        shared_prefix_question_len=args.shared_prefix_question_len,
        shared_prefix_output_len=args.shared_prefix_output_len,
        shared_prefix_output_range_ratio=args.shared_prefix_output_range_ratio,
        shared_prefix_seed=args.shared_prefix_seed,
        num_groups=args.num_groups,
        sharegpt_output_len=args.sharegpt_output_len,
        custom_output_len=args.custom_output_len,
    )


def metrics_config(args: argparse.Namespace) -> MetricsConfig:
    """What a run's metrics compute, from its flags (or from a saved result's `contract["args"]`)."""
    return MetricsConfig(
        percentile_metrics=tuple(name.strip() for name in args.percentile_metrics.split(",") if name.strip()),
        percentiles=tuple(float(p) for p in args.metric_percentiles.split(",") if p.strip()),
        goodput_slos_ms=dict(_slo(item) for item in args.goodput or []),
    )


def _run_options(args: argparse.Namespace, endpoint: EndpointConfig) -> RunOptions:
    metrics = metrics_config(args)
    metrics_url = None if args.no_server_metrics else args.metrics_url or endpoint.base_url.rstrip("/") + "/metrics"
    return RunOptions(metrics, metrics_url, args.metrics_interval, not args.disable_tqdm)


def _slo(item: str) -> tuple[str, float]:
    name, sep, value = item.partition(":")
    try:
        value_ms = float(value)
    except ValueError:
        value_ms = math.nan
    if not sep or not value_ms > 0:
        raise ValueError(f"--goodput wants METRIC:MS with MS > 0, got {item!r}")
    return name, value_ms
