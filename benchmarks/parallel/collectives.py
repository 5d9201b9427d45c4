"""`python -m pagedserve.benchmarks.parallel.collectives [--world-size N]`: the per-step cost of tensor parallelism's
collectives on CPU (gloo): rank 0's step broadcast (a StepMessage of B decoding requests) and the all-reduces of
[T, hidden] fp32 activations (2 a layer), median of repeated calls, in microseconds."""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time

import torch

from pagedserve.services.gpu_worker.parallel.group import free_init_method, join_group, leave_group
from pagedserve.services.gpu_worker.parallel.step_message import StepMessage
from pagedserve.shared.step_protocol import CachedRequest, StepInput

REPEATS = 200


def decode_message(batch: int) -> StepMessage:
    """A decode step of `batch` requests: each one token, one in 16 with a new block, and their last samples."""
    step = StepInput(cached_requests=[CachedRequest(f"req-{i}", [1000 + i] if i % 16 == 0 else [], 300 + i)
                                      for i in range(batch)],
                     num_scheduled_tokens={f"req-{i}": 1 for i in range(batch)}, incarnation_id="f" * 32)
    return StepMessage(step, dict(step.num_scheduled_tokens), [], [(f"req-{i}", 4242 + i) for i in range(batch)], [])


def _median_us(call) -> float:
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _rank(rank: int, world_size: int, init_method: str, results) -> None:
    torch.set_num_threads(1)
    tp = join_group(rank, world_size, init_method, torch.device("cpu"), 60.0)
    rows = []
    for batch in (1, 32, 256):
        message = decode_message(batch)
        rows.append(("broadcast step", batch, _median_us(lambda m=message: tp.broadcast(m if rank == 0 else None))))
    for hidden in (576, 8192):
        for tokens in (1, 32, 256):
            x = torch.randn(tokens, hidden)
            rows.append((f"all-reduce [T, {hidden}] fp32", tokens, _median_us(lambda x=x: tp.all_reduce(x))))
    if rank == 0:
        results.put(rows)
    leave_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    init_method = free_init_method()
    ranks = [context.Process(target=_rank, args=(r, args.world_size, init_method, results))
             for r in range(args.world_size)]
    for process in ranks:
        process.start()
    rows = results.get(timeout=600)
    for process in ranks:
        process.join()
    print(f"gloo on CPU, {args.world_size} ranks, median of {REPEATS} calls")
    print(f"{'collective':<28} {'B or T':>6} {'us':>9}")
    for name, size, micros in rows:
        print(f"{name:<28} {size:>6} {micros:>9.1f}")


if __name__ == "__main__":
    main()
