"""The routing benchmarks set up what they claim: the microbenchmark's shared prefixes sit on the replicas its
router then picks, and the comparison's bench flags parse and its table reports what the runs measured."""

from __future__ import annotations

import random

from pagedserve.benchmarks.cli import build_parser
from pagedserve.benchmarks.routing.bench_router import build_router, prompts_for
from pagedserve.benchmarks.routing.compare import bench_argv, table
from pagedserve.benchmarks.routing.compare import build_parser as compare_parser
from pagedserve.services.gateway.routing.prefix_mirror import ReplicaLoad
from pagedserve.shared.request_io import GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams


def test_the_microbenchmark_routes_each_shared_prefix_to_the_replica_holding_it():
    rng = random.Random(0)
    prefixes = [[rng.randrange(49152) for _ in range(900)] for _ in range(16)]
    router = build_router(8, cached_blocks=200, prefixes=prefixes, rng=rng)
    for view in router.mirror.views.values():  # equal loads: the prefix alone decides
        view.load = ReplicaLoad(5, 0, 0.5, 0.0)
    for index, prefix in enumerate(prefixes):
        prompt = prefix + [rng.randrange(49152) for _ in range(100)]
        route = router.route(GenerateRequest(f"r{index}", prompt, SamplingParams(max_tokens=1)))
        assert route.replica.name == f"replica-{index % 8}"  # build_router puts prefix i on replica i mod 8
        assert route.choice.predicted_cached_blocks == 900 // 16 and route.choice.because_of_prefix
    other = prompts_for(1, 1000, prefixes, random.Random(1))[0]
    assert len(other) == 1000


def test_the_comparison_passes_flags_bench_serve_takes_and_tabulates_its_runs():
    args = compare_parser().parse_args(["--num-groups", "4", "--num-prompts", "32"])
    parsed = build_parser().parse_args(bench_argv(args, "http://127.0.0.1:1", "m", "prefix"))
    assert (parsed.dataset_name, parsed.num_groups, parsed.num_prompts) == ("shared-prefix", 4, 32)
    assert parsed.ignore_eos and parsed.no_server_metrics
    metrics = {"cached_prompt_tokens_ratio": 0.9, "request_throughput_rps": 1.5, "output_throughput_tok_s": 48.0,
               "median_ttft_ms": 800.0, "p99_ttft_ms": 2100.0, "requests_per_replica": {"a": 17, "b": 15},
               "failed": 0}
    gateway = {"predicted_cached_tokens_total": 880.0, "prompt_tokens_total": 1000.0}
    text = table([{"policy": "prefix", "metrics": metrics, "gateway": gateway}])
    assert text.splitlines()[1].split() == ["prefix", "90.0", "88.0", "1.50", "48.0", "800", "2100", "17,", "15"]
