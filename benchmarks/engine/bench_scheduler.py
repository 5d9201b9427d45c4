"""What the scheduler buys, measured in one run on the default model through the in-process engine:
output tokens/s of 32 concurrent requests vs the same requests one at a time, and mean time to first token of
the shared-system-prompt workload with prefix caching on vs off."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from pagedserve.benchmarks.engine.workloads import POLICY_QUESTIONS, policy_system_prompt, varied_questions
from pagedserve.llm import LLM
from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from pagedserve.services.scheduler.scheduler_config import SchedulerConfig
from pagedserve.shared.request_io import GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams


@dataclass
class RunResult:
    duration_s: float
    num_output_tokens: int
    mean_ttft_s: float

    @property
    def output_tok_s(self) -> float:
        return self.num_output_tokens / self.duration_s


def run_concurrently(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> RunResult:
    """Submit all prompts at once, step until done; TTFT counted from submission."""
    start = time.perf_counter()
    first_token_s: dict[str, float] = {}
    for i, prompt in enumerate(prompts):
        llm.engine.add_request(GenerateRequest(f"r{time.monotonic_ns()}-{i}", prompt, params))
    num_tokens = 0
    while llm.engine.has_unfinished_requests():
        for out in llm.engine.step():
            first_token_s.setdefault(out.req_id, time.perf_counter() - start)
            num_tokens += len(out.new_token_ids)
    return RunResult(time.perf_counter() - start, num_tokens, sum(first_token_s.values()) / len(first_token_s))


def run_one_at_a_time(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> RunResult:
    results = [run_concurrently(llm, [p], params) for p in prompts]
    return RunResult(sum(r.duration_s for r in results), sum(r.num_output_tokens for r in results),
                     sum(r.mean_ttft_s for r in results) / len(results))


def make_llm(model: str, **scheduler) -> LLM:
    return LLM(WorkerConfig(model_dir=model, kv_cache_memory_bytes=1024**3), SchedulerConfig(**scheduler))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)

    llm = make_llm(args.model, enable_prefix_caching=False)
    prompts = [llm.chat_prompt(q) for q in varied_questions(args.num_requests)]
    batched = run_concurrently(llm, prompts, params)
    serial = run_one_at_a_time(llm, prompts, params)
    print(f"{args.num_requests} requests x {args.max_tokens} tokens: concurrent {batched.output_tok_s:.1f} tok/s, "
          f"one at a time {serial.output_tok_s:.1f} tok/s, ratio {batched.output_tok_s / serial.output_tok_s:.2f}")

    system = policy_system_prompt()
    shared = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    ttft = {}
    for caching in (True, False):
        llm = make_llm(args.model, enable_prefix_caching=caching)
        run_concurrently(llm, [llm.chat_prompt("Hello", system)], shared)  # warm-up: fills the cache when on
        ttft[caching] = run_concurrently(llm, [llm.chat_prompt(q, system) for q in POLICY_QUESTIONS], shared)
    on, off = ttft[True].mean_ttft_s, ttft[False].mean_ttft_s
    print(f"shared ~1,000-token system prompt, {len(POLICY_QUESTIONS)} requests: mean TTFT caching on {on:.3f} s, "
          f"off {off:.3f} s, ratio off/on {off / on:.1f}")


if __name__ == "__main__":
    main()
