"""CPU time per engine step of one greedy copy-heavy stream, n-gram speculation on vs off, in process.

One LLM per setting (k = 0: no speculation; k > 0: n-gram, k drafts a step), loaded up front; rounds alternate
the settings. Each round runs the same copy-heavy prompts one at a time to `--max-tokens` and times every
`engine.step()` after the prefill in CPU time (`time.process_time`: all threads; one torch thread by default, so
that threads spinning on a shared machine do not count) and wall time. A step that
returns more than one token is a verification step that accepted drafts; a step with one token is a plain decode
or a verification that accepted none. Reports, per round and setting: CPU ms per output token, the median CPU ms
of one-token and of several-token steps, and tokens per step.

    python -m pagedserve.benchmarks.engine.bench_spec_steps --model models/SmolLM2-135M-Instruct 0 4
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from pagedserve.benchmarks.copy_heavy import copy_heavy_prompts
from pagedserve.benchmarks.tokenizer import load_tokenizer
from pagedserve.llm import LLM
from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from pagedserve.services.scheduler.scheduler_config import SchedulerConfig
from pagedserve.shared.request_io import GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams

SPEC = '{"method": "ngram", "num_speculative_tokens": %d, "prompt_lookup_min": 2, "prompt_lookup_max": 4}'


@dataclass
class Steps:
    cpu: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)

    def median_cpu_ms(self, several: bool) -> tuple[int, float]:
        times = [t for t, n in zip(self.cpu, self.tokens, strict=True) if (n > 1) == several]
        return len(times), 1e3 * statistics.median(times) if times else 0.0


def run_stream(llm: LLM, prompt: list[int], max_tokens: int, steps: Steps) -> None:
    engine = llm.engine
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    engine.add_request(GenerateRequest(f"spec-steps-{time.monotonic_ns()}", prompt, params))
    engine.step()  # the prefill and first token: not timed
    while engine.has_unfinished_requests():
        cpu, wall = time.process_time(), time.perf_counter()
        outputs = engine.step()
        steps.cpu.append(time.process_time() - cpu)
        steps.wall.append(time.perf_counter() - wall)
        steps.tokens.append(sum(len(o.new_token_ids) for o in outputs))


def report(round_index: int, k: int, steps: Steps) -> str:
    tokens = sum(steps.tokens)
    ones, one_ms = steps.median_cpu_ms(False)
    several, several_ms = steps.median_cpu_ms(True)
    return (f"round {round_index} k={k}: {tokens} tokens in {len(steps.cpu)} steps ({tokens / len(steps.cpu):.2f} "
            f"a step); CPU {1e3 * sum(steps.cpu) / tokens:.2f} ms/token (wall {1e3 * sum(steps.wall) / tokens:.2f}); "
            f"1-token steps n={ones} p50 {one_ms:.2f} ms CPU; >1-token steps n={several} p50 {several_ms:.2f} ms CPU")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("drafts", type=int, nargs="*", default=[0, 4], help="k per setting; 0: no speculation")
    parser.add_argument("--model", default="models/SmolLM2-135M-Instruct")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--input-lens", type=int, nargs="+", default=[300, 300, 300])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: CPU time is the work, not threads spinning on a busy machine)")
    args = parser.parse_args()
    llms = {k: LLM(WorkerConfig(model_dir=args.model, num_threads=args.threads),
                   SchedulerConfig(speculative_config=SPEC % k) if k else SchedulerConfig()) for k in args.drafts}
    first = llms[args.drafts[0]]
    rng = np.random.default_rng(0)
    prompts = [first.chat_prompt(text) for text, _ in
               copy_heavy_prompts(load_tokenizer(args.model), rng, args.input_lens)]
    for llm in llms.values():  # untimed warm-up
        run_stream(llm, prompts[0], 8, Steps())
    for round_index in range(args.rounds):
        for k, llm in llms.items():
            steps = Steps()
            for prompt in prompts:
                run_stream(llm, prompt, args.max_tokens, steps)
            print(report(round_index, k, steps), flush=True)


if __name__ == "__main__":
    main()
