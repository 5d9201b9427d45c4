"""What a decode costs in `--batch-invariant` mode against the default, in process: CPU ms per decoded token.

Engines of each mode live in one process and take turns, round by round, at each batch size (B chat prompts,
greedy, EOS ignored, N tokens each; the prefill step is left out of the count). The figure is the process's CPU
time per decoded token (time.process_time), which a busy shared machine disturbs far less than wall time (other
processes' time is not counted; shared caches still are); run with one torch thread (the default here) so that no
thread spins waiting for another. Wall ms per token is printed beside it. `--layered` adds a third engine in
batch-invariant mode whose decode steps run layer by layer in Python, as the mode did before its decode steps
took the one-call C path: what that path buys.
"""

from __future__ import annotations

import argparse
import statistics
import time

from pagedserve.benchmarks.engine.workloads import varied_questions
from pagedserve.llm import LLM
from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from pagedserve.services.scheduler.scheduler_config import SchedulerConfig
from pagedserve.shared.request_io import GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams

WARMUP_TOKENS = 4


def make_llm(model_dir: str, batch_invariant: bool, threads: int, max_seqs: int) -> LLM:
    worker = WorkerConfig(model_dir=model_dir, kv_cache_memory_bytes=512 * 1024**2, batch_invariant=batch_invariant,
                          num_threads=threads)
    return LLM(worker, SchedulerConfig(max_num_batched_tokens=4096, max_num_seqs=max_seqs))


def decode_ms_per_token(llm: LLM, prompts: list[list[int]], num_new: int) -> tuple[float, float]:
    """(CPU ms, wall ms) per decoded token of one batch, after its first (prefill) step."""
    params = SamplingParams(temperature=0.0, max_tokens=num_new, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        llm.engine.add_request(GenerateRequest(f"bi-{time.monotonic_ns()}-{i}", prompt, params))
    llm.engine.step()
    wall, cpu, decoded = time.perf_counter(), time.process_time(), 0
    while llm.engine.has_unfinished_requests():
        decoded += sum(len(o.new_token_ids) for o in llm.engine.step())
    return (time.process_time() - cpu) / decoded * 1e3, (time.perf_counter() - wall) / decoded * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/SmolLM2-135M-Instruct")
    parser.add_argument("--batch-sizes", default="1,16,64")
    parser.add_argument("--num-new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--layered", action="store_true", help="also the mode with layer-by-layer decode steps")
    args = parser.parse_args()
    batches = [int(b) for b in args.batch_sizes.split(",")]
    llms = {mode: make_llm(args.model, mode != "default", args.threads, max(batches))
            for mode in ("default", "invariant", *(("layered",) if args.layered else ()))}
    if "layered" in llms:
        runner = llms["layered"].engine.worker.runner
        runner.forward = runner.model.forward
    questions = varied_questions(max(batches))
    results: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for b in batches:  # untimed: kernel caches and allocations for this batch
        for llm in llms.values():
            decode_ms_per_token(llm, [llm.chat_prompt(q) for q in questions[:b]], WARMUP_TOKENS)
    for _ in range(args.rounds):
        for b in batches:
            for mode, llm in llms.items():
                prompts = [llm.chat_prompt(q) for q in questions[:b]]
                results.setdefault((b, mode), []).append(decode_ms_per_token(llm, prompts, args.num_new_tokens))
    print(f"model {args.model}, torch threads {args.threads}, {args.rounds} rounds of {args.num_new_tokens} tokens")
    print(f"{'batch':>5} {'mode':>10} {'CPU ms/tok (median)':>20} {'vs default':>10} {'wall ms/tok':>12}")
    for b in batches:
        base = statistics.median(cpu for cpu, _ in results[b, "default"])
        for mode in llms:
            cpu = statistics.median(c for c, _ in results[b, mode])
            wall = statistics.median(w for _, w in results[b, mode])
            print(f"{b:>5} {mode:>10} {cpu:>20.2f} {cpu / base:>10.2f} {wall:>12.2f}")


if __name__ == "__main__":
    main()
