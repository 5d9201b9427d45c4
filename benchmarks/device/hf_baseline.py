"""Section: transformers' own decode as the baseline, the way its docs make it fast: a StaticCache and the decode
step (forward + greedy pick + position advance) captured as one CUDA graph, on the SmolLM2-135M shape, random
weights, bf16, on the same GPU; batch 1 and 64."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable

import torch
from transformers import AutoConfig, AutoModelForCausalLM, StaticCache

from pagedserve.benchmarks.device.context import SHAPES_DIR, Section

SHAPE, DRY_SHAPE = "smollm2-135m", "toy-llama"
BATCHES, DRY_BATCHES = (1, 64), (1, 2)
PROMPT_LEN, NEW_TOKENS = 16, 64
DRY_PROMPT_LEN, DRY_NEW_TOKENS = 4, 8
WARMUP_STEPS = 2


def decode_step(model, cache: StaticCache, ids: torch.Tensor, position: torch.Tensor) -> Callable[[], None]:
    """One greedy decode step on static tensors: reads `ids` [B, 1] at `position` [1], writes the next ids and
    advances the position, all on the device (capturable)."""

    def step() -> None:
        logits = model(input_ids=ids, past_key_values=cache, cache_position=position, use_cache=True).logits
        ids.copy_(logits[:, -1:].argmax(-1))
        position.add_(1)

    return step


def decode_tok_s(model, batch: int, prompt_len: int, new_tokens: int, use_graph: bool) -> tuple[float, str]:
    device = model.device
    gen = torch.Generator().manual_seed(batch)
    prompt = torch.randint(3, model.config.vocab_size, (batch, prompt_len), generator=gen).to(device)
    cache = StaticCache(config=model.config, max_cache_len=prompt_len + new_tokens + WARMUP_STEPS + 2)
    logits = model(input_ids=prompt, past_key_values=cache, cache_position=torch.arange(prompt_len, device=device),
                   use_cache=True).logits
    ids, position = logits[:, -1:].argmax(-1), torch.tensor([prompt_len], device=device)
    step, how = decode_step(model, cache, ids, position), "eager"
    if device.type == "cuda":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                step()
        torch.cuda.current_stream().wait_stream(side)
        if use_graph:
            try:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    step()
                step, how = graph.replay, "cuda graph"
            except Exception as exc:
                torch.cuda.synchronize()
                how = f"eager (capture failed: {type(exc).__name__}: {str(exc).splitlines()[0][:100]})"
    else:
        for _ in range(WARMUP_STEPS):
            step()
    _sync(device)
    start = time.perf_counter()
    for _ in range(new_tokens):
        step()
    _sync(device)
    return batch * new_tokens / (time.perf_counter() - start), how


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run(section: Section) -> str | None:
    shape = DRY_SHAPE if section.dry_run else SHAPE
    dtype = torch.float32 if section.dry_run else torch.bfloat16
    config = AutoConfig.from_pretrained(SHAPES_DIR / shape)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).to(section.device).eval()
    if section.dry_run:
        section.note("needs cuda: the CUDA graph of the decode step (the dry run times the same step eagerly)")
    prompt_len, new_tokens = (DRY_PROMPT_LEN, DRY_NEW_TOKENS) if section.dry_run else (PROMPT_LEN, NEW_TOKENS)
    warnings.filterwarnings("ignore", message=".*past_key_values.*deprecated")  # the name older releases know
    with torch.inference_mode():
        for batch in DRY_BATCHES if section.dry_run else BATCHES:
            if section.out_of_time(f"batch {batch}"):
                return "timed out: box spent (partial rows)"
            tok_s, how = decode_tok_s(model, batch, prompt_len, new_tokens, section.state.capture_ok)
            section.row(shape=shape, batch=batch, tok_s=tok_s, how=how, new_tokens=new_tokens)
    return None
