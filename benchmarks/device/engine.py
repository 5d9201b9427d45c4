"""Section: the whole engine in-process on model shapes with dummy weights (no checkpoint), graphs on and off.

Per shape and graph mode: the worker's build time, the memory it reserved and its log lines about graphs; per
batch: decode tokens/s after the prefill, with greedy tokens compared between graphs on and off. On CUDA the
profiler also counts the kernels of a batch-1 decode step. Graphs are asked for through WorkerConfig's
`enforce_eager` where this build has it (the CUDA graph runner of issue 38); without it every run is eager.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import time
import uuid
from dataclasses import dataclass

import torch

from pagedserve.benchmarks.device.context import SHAPES_DIR, Section
from pagedserve.llm_engine import LLMEngine
from pagedserve.services.gpu_worker.worker import Worker
from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from pagedserve.services.scheduler.scheduler_config import SchedulerConfig
from pagedserve.shared.request_io import GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams

HBM_BYTES_PER_S = 4.8e12  # the issue's yardstick for a weight read (an H200's HBM3e)


@dataclass(frozen=True)
class Plan:
    shapes: tuple[str, ...]
    batches: tuple[int, ...]
    prompt_len: int
    new_tokens: int
    max_model_len: int


PLAN = Plan(("smollm2-135m", "llama-3.2-1b"), (1, 64, 256), 16, 64, 1024)
DRY_PLAN = Plan(("toy-llama",), (1, 4), 4, 8, 128)
WARMUP_TOKENS = 4


def graphs_supported() -> bool:
    return "enforce_eager" in {f.name for f in dataclasses.fields(WorkerConfig)}


def worker_config(shape: str, section: Section, plan: Plan, graphs: bool | None) -> WorkerConfig:
    kwargs = dict(model_dir=str(SHAPES_DIR / shape), load_format="dummy", device=section.device.type,
                  max_model_len=plan.max_model_len, gpu_memory_utilization=0.1)
    if section.dry_run:
        kwargs.update(dtype="float32", torch_compile=False, native_kernels=False, kv_cache_memory_bytes=2**24)
    if graphs is not None:
        kwargs["enforce_eager"] = not graphs
    if "max_num_seqs" in {f.name for f in dataclasses.fields(WorkerConfig)}:
        kwargs["max_num_seqs"] = max(plan.batches)
    return WorkerConfig(**kwargs)


class _GraphLog(logging.Handler):
    """Keeps the worker's log lines that speak of graphs or capture (time taken, pool size)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "graph" in text.lower() or "captur" in text.lower():
            self.lines.append(text)


def build_engine(config: WorkerConfig, plan: Plan) -> tuple[LLMEngine, dict]:
    handler, logger = _GraphLog(), logging.getLogger("pagedserve.services.gpu_worker")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    start = time.perf_counter()
    try:
        engine = LLMEngine(Worker(config), SchedulerConfig(max_num_seqs=max(plan.batches),
                                                           max_num_batched_tokens=max(2048, 2 * plan.prompt_len *
                                                                                      max(plan.batches))),
                           async_scheduling=True)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    info = {"init_s": time.perf_counter() - start, "graph_log": handler.lines}
    if config.device == "cuda":
        torch.cuda.synchronize()
        info["reserved_gib"] = torch.cuda.memory_reserved() / 2**30
    return engine, info


def weight_bytes(engine: LLMEngine) -> int:
    """Bytes of the model's distinct tensors (a tied head counted once): what a decode step reads at least."""
    seen = {p.data_ptr(): p.numel() * p.element_size() for p in engine.worker.runner.model.parameters()}
    return sum(seen.values())


def decode(engine: LLMEngine, batch: int, plan: Plan, new_tokens: int) -> tuple[float, list[list[int]]]:
    """Decode tokens/s of `batch` requests once their prompts are in, and each request's greedy tokens."""
    vocab = engine.description.vocab_size
    gen = torch.Generator().manual_seed(batch)
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    ids = [f"{uuid.uuid4().hex}-{i}" for i in range(batch)]
    for req_id in ids:
        prompt = torch.randint(3, vocab, (plan.prompt_len,), generator=gen).tolist()
        engine.add_request(GenerateRequest(req_id, prompt, params))
    tokens: dict[str, list[int]] = {req_id: [] for req_id in ids}
    scheduler = engine.scheduler
    while scheduler.snapshot_stats().num_waiting or any(
            r.num_computed_tokens < r.num_prompt_tokens for r in scheduler.running):
        _collect(engine.step(), tokens)
    start, before = time.perf_counter(), sum(map(len, tokens.values()))
    while engine.has_unfinished_requests():
        _collect(engine.step(), tokens)
    elapsed = time.perf_counter() - start
    return (sum(map(len, tokens.values())) - before) / elapsed, [tokens[req_id] for req_id in ids]


def _collect(outputs, tokens: dict[str, list[int]]) -> None:
    for out in outputs:
        tokens[out.req_id].extend(out.new_token_ids)


def profile_kernels(engine: LLMEngine, plan: Plan, num_layers: int) -> dict:
    """CUDA kernels (memcpy/memset apart) of batch-1 decode steps, counted by torch's profiler."""
    from torch.profiler import ProfilerActivity, profile

    decode(engine, 1, plan, WARMUP_TOKENS)
    steps = 8
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        decode(engine, 1, plan, steps)
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels = [n for n in names if not n.lower().startswith(("memcpy", "memset"))]
    per_step = len(kernels) / steps  # prefill included: an upper bound on a decode step's count
    return {"profiled_steps": steps, "kernels_per_step": per_step, "kernels_per_layer": per_step / num_layers,
            "copies_per_step": (len(names) - len(kernels)) / steps}


def run_shape(section: Section, shape: str, graphs: bool | None, plan: Plan) -> dict[int, list[list[int]]]:
    """Every batch of `plan` on one engine; returns each batch's tokens."""
    label = "n/a (eager build)" if graphs is None else ("on" if graphs else "off")
    engine, info = build_engine(worker_config(shape, section, plan, graphs), plan)
    num_layers = engine.worker.runner.model_config.num_layers
    bytes_read = weight_bytes(engine)
    section.row(shape=shape, graphs=label, weight_bytes=bytes_read,
                weight_read_ms=bytes_read / HBM_BYTES_PER_S * 1e3, **info)
    tokens = {}
    try:
        for batch in plan.batches:
            if section.out_of_time(f"{shape} graphs {label} batch {batch}"):
                break
            decode(engine, batch, plan, WARMUP_TOKENS)  # Triton compiles and allocator growth, untimed
            tok_s, tokens[batch] = decode(engine, batch, plan, plan.new_tokens)
            section.row(shape=shape, graphs=label, batch=batch, tok_s=tok_s, step_ms=1e3 * batch / tok_s)
        if section.device.type == "cuda" and graphs is not True and not section.out_of_time("kernel profile"):
            try:
                section.row(shape=shape, graphs=label, **profile_kernels(engine, plan, num_layers))
            except Exception as exc:  # no CUPTI in a sandbox, say: the count is missing, the runs still stand
                section.row(shape=shape, graphs=label, kernel_profile=f"failed: {type(exc).__name__}: {exc}"[:200])
    finally:
        del engine
        gc.collect()
        if section.device.type == "cuda":
            torch.cuda.empty_cache()
    return tokens


def run(section: Section) -> str | None:
    plan = DRY_PLAN if section.dry_run else PLAN
    if section.dry_run:
        section.note("needs cuda: the profiler's kernel count (tests/kernels/test_layer_kernel_count.py counts the "
                     "launches on CPU); on CPU the worker has no graphs, so 'on' runs the eager path")
    modes: list[bool | None] = [True, False] if graphs_supported() else [None]
    if modes == [None]:
        section.note("this build's WorkerConfig has no enforce_eager: eager runs only, no graph comparison")
    elif not section.state.capture_ok and not section.dry_run:
        section.note("the capture probe failed: graphs-on runs skipped")
        modes = [False]
    for shape in plan.shapes:
        runs = {}
        for graphs in modes:
            if section.out_of_time(f"{shape} graphs {graphs}"):
                return "timed out: box spent (partial rows)"
            runs[graphs] = run_shape(section, shape, graphs, plan)
        if True in runs and False in runs:
            for batch in sorted(set(runs[True]) & set(runs[False])):
                differ = sum(a != b for a, b in zip(runs[True][batch], runs[False][batch], strict=True))
                section.row(shape=shape, batch=batch, compare="graphs on vs off, greedy",
                            tokens_identical=differ == 0, sequences_differing=differ, steps=plan.new_tokens)
    return None
