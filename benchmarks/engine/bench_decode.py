"""Decode throughput of the engine next to transformers' `generate` on the same model, in one run.

For each batch size B: B chat prompts, EOS ignored, N new tokens each, after an untimed short run of the same batch.
Decode tokens/s = B x (N - 1) divided by the time after the first token (so prefill is excluded on both sides: the
engine's first step, and a separate `generate` of one token for transformers).
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoModelForCausalLM

from pagedserve.llm import LLM
from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from pagedserve.services.scheduler.scheduler_config import SchedulerConfig
from pagedserve.shared.request_io import GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams

QUESTIONS = ["What is the capital of France?", "Explain photosynthesis.", "Write a poem about rain.",
             "How do airplanes fly?", "What is a prime number?", "Describe the water cycle.",
             "Why is the sky blue?", "What is machine learning?"]
WARMUP_TOKENS = 4  # one untimed short run per batch size and side first (JIT compiles, allocator, caches)


def engine_decode_tok_s(llm: LLM, prompts: list[list[int]], num_new: int) -> float:
    params = SamplingParams(temperature=0.0, max_tokens=num_new, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        llm.engine.add_request(GenerateRequest(f"bench-{time.monotonic_ns()}-{i}", prompt, params))
    llm.engine.step()  # the whole batch's prefill (budget permitting) and first tokens
    while llm.engine.scheduler.snapshot_stats().num_waiting or any(
            r.num_computed_tokens < r.num_prompt_tokens for r in llm.engine.scheduler.running):
        llm.engine.step()
    start = time.perf_counter()
    num_decoded = 0
    while llm.engine.has_unfinished_requests():
        num_decoded += sum(len(o.new_token_ids) for o in llm.engine.step())
    return num_decoded / (time.perf_counter() - start)


def transformers_decode_tok_s(model, prompts: list[list[int]], num_new: int, pad_id: int) -> float:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)

    def timed(n: int) -> float:
        start = time.perf_counter()
        model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                       pad_token_id=pad_id)
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    first = timed(1)
    return len(prompts) * (num_new - 1) / max(timed(num_new) - first, 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch-sizes", default="1,8,32,64")
    parser.add_argument("--num-new-tokens", type=int, default=32)
    parser.add_argument("--device", default="cpu", help="both sides run here: cpu, cuda")
    args = parser.parse_args()
    llm = LLM(WorkerConfig(model_dir=args.model, kv_cache_memory_bytes=1024**3, device=args.device),
              SchedulerConfig(max_num_batched_tokens=4096, max_num_seqs=256))
    # transformers in the engine's compute dtype (fp32 on CPU; bf16 for fp32 checkpoints on a GPU)
    dtype = llm.engine.worker.runner.model_config.dtype if args.device != "cpu" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(args.device).eval()
    pad_id = llm.tokenizer.pad_token_id or 0
    print(f"device: {args.device}, torch threads: {torch.get_num_threads()}, model: {args.model}, dtype: {dtype}, "
          f"new tokens: {args.num_new_tokens}")
    print(f"{'batch':>5} {'engine tok/s':>13} {'transformers tok/s':>19} {'ratio':>6}")
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        prompts = [llm.chat_prompt(QUESTIONS[i % len(QUESTIONS)]) for i in range(batch)]
        engine_decode_tok_s(llm, prompts, WARMUP_TOKENS)  # kernel compiles and caches for this shape, untimed
        ours = engine_decode_tok_s(llm, prompts, args.num_new_tokens)
        with torch.inference_mode():
            transformers_decode_tok_s(model, prompts, WARMUP_TOKENS, pad_id)
            theirs = transformers_decode_tok_s(model, prompts, args.num_new_tokens, pad_id)
        print(f"{batch:>5} {ours:>13.1f} {theirs:>19.1f} {ours / theirs:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
