"""Owns the model and the KV cache on one device: runs one flattened forward per step and samples.

A step is launched (`launch`) and its output taken later (`PendingOutput.result`). On CUDA a step whose sampling
rows need nothing from the host (no grammar, penalties, seed, logprobs or pending min_tokens) leaves its ids on the
device: the next step takes them by index and the host reads them after that step is enqueued (no sync between
steps). Decode-only steps that fit a captured size replay a graph (cuda_graphs/); the rest run eagerly.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from pagedserve.services.gpu_worker.attention.backend import AttentionShape
from pagedserve.services.gpu_worker.cuda_graphs.decode_graphs import DecodeGraphs, capture_sizes
from pagedserve.services.gpu_worker.cuda_graphs.graph_backend import CudaGraphBackend, GraphBackend
from pagedserve.services.gpu_worker.generation_defaults import eos_token_ids
from pagedserve.services.gpu_worker.input_batch import build_model_input
from pagedserve.services.gpu_worker.kv_cache import KVCache, kv_bytes_per_token, num_blocks_for_budget
from pagedserve.services.gpu_worker.loader import load_model
from pagedserve.services.gpu_worker.model_config import (
    ModelConfig,
    UnsupportedModelError,
    dtype_name,
    load_model_config,
)
from pagedserve.services.gpu_worker.parallel.rank_budget import rank_kv_budget_bytes
from pagedserve.services.gpu_worker.parallel.shard_plan import ShardPlan
from pagedserve.services.gpu_worker.parallel.sharded_loader import load_sharded_model
from pagedserve.services.gpu_worker.pending_output import PendingOutput
from pagedserve.services.gpu_worker.platforms import platform_for
from pagedserve.services.gpu_worker.platforms.platform import Platform
from pagedserve.services.gpu_worker.prompt_logprobs import gather_prompt_logprobs
from pagedserve.services.gpu_worker.quantized.scheme import read_scheme
from pagedserve.services.gpu_worker.request_state import RequestState
from pagedserve.services.gpu_worker.sampler import sample
from pagedserve.services.gpu_worker.sampling_batch import SamplingRow, build_sampling_batch
from pagedserve.services.gpu_worker.spec_decode.draft_model import DraftModel, DraftModelProposer, load_draft_model
from pagedserve.services.gpu_worker.spec_decode.verify_step import verify_step
from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from pagedserve.shared.step_protocol import FailedRequest, ModelDescription, StepOutput, TokenLogprobs

if TYPE_CHECKING:  # xgrammar loads only once a request brings a grammar
    from pagedserve.services.gpu_worker.grammar import RequestGrammar
    from pagedserve.services.gpu_worker.grammar_mask import GrammarMask
    from pagedserve.services.gpu_worker.parallel.group import TensorParallelGroup

log = logging.getLogger(__name__)


class ModelRunner:
    """`tp`: this rank's tensor-parallel group (None: the whole model here). Under tensor parallelism the model,
    attention and KV pool hold this rank's heads (the same block ids on every rank), logits exist on rank 0 alone
    (the others skip sampling) and steps run eagerly with their outputs on the host at launch."""

    def __init__(self, config: WorkerConfig, tp: TensorParallelGroup | None = None) -> None:
        self.config = config
        self.platform = platform_for(config)
        self.device = self.platform.device
        mc = load_model_config(config.model_dir, config.dtype)
        if config.dtype in ("auto", ""):
            mc = replace(mc, dtype=self.platform.serving_dtype(mc.dtype, str(config.model_dir)))
        self.model_config = mc
        self.max_model_len = config.max_model_len or mc.max_position_embeddings
        kv_dtype = self.platform.kv_cache_dtype(config.kv_cache_dtype, mc.dtype)
        plan = None if tp is None else ShardPlan.for_rank(mc, tp.rank, tp.world_size)
        local = mc if plan is None else plan.local_config  # this rank's heads
        shape = AttentionShape(local.num_heads, local.num_kv_heads, mc.head_dim, mc.head_dim ** -0.5,
                               mc.sliding_window)
        self.backend = self.platform.attention_backend(config.attention_backend, shape, mc.dtype, kv_dtype,
                                                       config.block_size)
        if plan is None:
            self.model = load_model(config.model_dir, mc, self.backend, self.max_model_len, self.platform,
                                    config.load_format, config.quantization)
        else:
            if config.load_format != "dummy" and read_scheme(config.model_dir, config.quantization) is not None:
                raise UnsupportedModelError("tensor parallelism loads unquantized safetensors checkpoints; "
                                            f"{config.model_dir} holds a quantization_config")
            self.model = load_sharded_model(config.model_dir, plan, tp, self.backend, self.max_model_len,
                                            self.platform, config.load_format)
        self.eos_token_ids = eos_token_ids(config.model_dir)
        draft = self._load_draft(mc) if config.draft_model_dir else None
        budget = rank_kv_budget_bytes(self.platform, config, tp)
        if draft is not None:  # the pool pays for the draft's shadow of every block too
            own = kv_bytes_per_token(local, kv_dtype)
            budget = budget * own // (own + draft.kv_bytes_per_token)
        num_blocks = num_blocks_for_budget(local, budget, config.block_size, kv_dtype)
        self.kv_cache = KVCache.allocate(local, num_blocks, config.block_size, self.device, kv_dtype)
        self.drafter = None if draft is None else DraftModelProposer(draft, num_blocks, config.block_size,
                                                                     self.platform)
        if tp is None:
            self.forward = self.platform.model_forward(self.model, self.backend, self.kv_cache)
        else:  # the layer by layer forward, whose row-parallel linears all-reduce (no one-call C decode)
            self.forward = Platform.model_forward(self.platform, self.model, self.backend, self.kv_cache)
        log.info("KV cache: %d blocks of %d tokens in %s (%.0f MiB); model in %s", self.kv_cache.num_blocks,
                 config.block_size, dtype_name(kv_dtype), self.kv_cache.num_bytes / 2**20, dtype_name(mc.dtype))
        self.defer_outputs = self.device.type == "cuda" and tp is None  # sampled ids stay on the device
        self.graphs: DecodeGraphs | None = None
        self._serial = 0  # of the last step launched
        self._deferred: list[PendingOutput] = []  # launched steps whose ids may still be on the device only
        if self.device.type == "cuda" and not config.enforce_eager and tp is None:
            if self.backend.name == "triton":
                self.enable_graphs(CudaGraphBackend(self.device))
            else:
                log.info("decode graphs need the triton attention backend: running eagerly")

    def _load_draft(self, target: ModelConfig) -> DraftModel:
        draft_dir = self.config.draft_model_dir
        assert draft_dir is not None
        draft = load_draft_model(draft_dir, self.config, self.platform, target, str(self.config.model_dir),
                                 self.max_model_len)
        log.info("draft model %s: %d layers in %s", draft_dir, draft.model.config.num_layers,
                 dtype_name(draft.model.config.dtype))
        return draft

    def enable_graphs(self, backend: GraphBackend) -> None:
        """Capture the decode graphs of `--cuda-graph-sizes` (tests pass a fake backend on CPU)."""
        sizes = capture_sizes(self.config.cuda_graph_sizes, self.config.max_num_seqs)
        self.graphs = DecodeGraphs(self.model, self.forward, self.kv_cache, self.backend, sizes, self.max_model_len,
                                   backend)
        self.graphs.capture()

    def describe(self) -> ModelDescription:
        return ModelDescription(
            model_name=self.config.model_name or Path(self.config.model_dir).name,
            architecture=self.model_config.architecture,
            max_model_len=self.max_model_len,
            vocab_size=self.model_config.vocab_size,
            num_kv_blocks=self.kv_cache.num_blocks,
            block_size=self.kv_cache.block_size,
            eos_token_ids=self.eos_token_ids,
            dtype=dtype_name(self.model_config.dtype),
            device=str(self.device),
            attention_backend=self.backend.name,
            kv_cache_bytes=self.kv_cache.num_bytes,
        )

    def run(self, requests: list[RequestState], num_scheduled: list[int]) -> StepOutput:
        """Compute the scheduled tokens of each request; sample for those that reach their last known token."""
        return self.launch(requests, num_scheduled).result()

    @torch.inference_mode()
    def launch(self, requests: list[RequestState], num_scheduled: list[int]) -> PendingOutput:
        """Enqueue a step; its output comes from the returned PendingOutput's result()."""
        start_ns = time.perf_counter_ns()
        previous = self._serial
        self._serial += 1
        self._resolve_deferred(before=previous)  # only the previous step's ids may feed this one
        if not all(_plain(r) for r in requests if r.pending is not None):
            self._resolve_deferred(before=self._serial)  # their sampling rows read outputs from the host
        logits, sampling = self._logits(requests, num_scheduled, previous)
        pending, sample_ns = PendingOutput.done(self._serial, StepOutput()), 0
        if sampling and logits is not None:  # None: a tensor-parallel rank other than 0
            sample_start_ns = time.perf_counter_ns()
            pending = self._sample_deferred(sampling, logits) if self.defer_outputs else None
            if pending is None:
                self._resolve_deferred(before=self._serial)  # appends in step order
                output = self._sample(sampling, logits) if not any(r.draft_token_ids for r in sampling) else \
                    verify_step(sampling, logits, self._sample, self.model_config.vocab_size, self.kv_cache.block_size)
                pending = PendingOutput.done(self._serial, output)
            sample_ns = time.perf_counter_ns() - sample_start_ns
        for request, n in zip(requests, num_scheduled, strict=True):
            request.num_computed_tokens += n
        _attach_prompt_logprobs(sampling, pending.output)
        pending.output.forward_time_ns, pending.output.sample_time_ns = time.perf_counter_ns() - start_ns, sample_ns
        return pending

    def _logits(self, requests: list[RequestState], num_scheduled: list[int], previous: int
                ) -> tuple[torch.Tensor | None, list[RequestState]]:
        """The step's forward: logits of the rows that sample, and their requests (in row order)."""
        fed_from = self._deferred[-1].token_ids if self._deferred else None
        if (self.graphs is not None and len(requests) <= self.graphs.max_size and all(n == 1 for n in num_scheduled)
                and all(r.num_computed_tokens + 1 == r.num_tokens for r in requests)):
            return self.graphs.run(requests, previous, fed_from), list(requests)
        batch = build_model_input(requests, num_scheduled, self.kv_cache.block_size, self.device, previous)
        if batch.feed_rows:
            rows = torch.tensor(batch.feed_rows, device=self.device)
            batch.token_ids.index_copy_(0, rows, fed_from[torch.tensor(batch.feed_sources, device=self.device)])
        hidden = self.forward(batch.token_ids, batch.positions, self.kv_cache.layers, batch.meta, batch.logits_rows)
        sample_rows = batch.logits_rows.rows
        if batch.prompt is not None:  # prompt rows kept beside the sampling rows: take them out first
            gather_prompt_logprobs(hidden[batch.prompt_positions], batch.prompt, self.model.compute_logits)
            hidden, sample_rows = hidden[batch.sample_positions], batch.sample_rows
        if not batch.sample_indices:
            return None, []
        return (self.model.compute_logits(hidden, sample_rows),
                [batch.requests[i] for i in batch.sample_indices])

    def _sample_deferred(self, requests: list[RequestState], logits: torch.Tensor) -> PendingOutput | None:
        """Sample on the device and leave the ids there; None when a row needs the host path."""
        if not all(_plain(r) for r in requests):
            return None
        rows = [SamplingRow(r.sampling, r.prompt_token_ids, r.output_token_ids, r.stop_token_ids, r.banned_token_ids)
                for r in requests]
        try:
            token_ids, _ = sample(logits, build_sampling_batch(rows, self.model_config.vocab_size, self.device))
        except Exception:
            log.exception("sampling a batch of %d rows on the device failed: sampling on the host", len(rows))
            return None
        finite = torch.isfinite(logits.amax(dim=-1))  # NaN and +inf propagate through amax
        pending = PendingOutput.start(self._serial, StepOutput(), requests, token_ids, finite)
        self._deferred.append(pending)
        return pending

    def _resolve_deferred(self, before: int) -> None:
        """Take the outputs of the deferred steps launched before step `before` (their ids reach the host)."""
        while self._deferred and self._deferred[0].serial < before:
            self._deferred.pop(0).result()
        self._deferred = [p for p in self._deferred if not p.resolved]

    def _sample(self, sampling_requests: list[RequestState], logits: torch.Tensor) -> StepOutput:
        """Sample every row that is due; a row with non-finite logits, or one the sampler fails on, fails its own
        request alone (the batch is retried row by row only after an error)."""
        rows = [SamplingRow(r.sampling, r.prompt_token_ids, r.output_token_ids, r.stop_token_ids, r.banned_token_ids)
                for r in sampling_requests]
        finite = torch.isfinite(logits.amax(dim=-1)).tolist()  # NaN and +inf propagate through amax
        grammars = [r.grammar for r in sampling_requests]
        try:
            batch = build_sampling_batch(rows, self.model_config.vocab_size, self.device)
            token_ids, logprobs = sample(logits, batch, self._grammar_mask(grammars, rows))
            results = list(zip(token_ids.tolist(), logprobs, strict=True))
        except Exception:
            log.exception("sampling a batch of %d rows failed: retrying row by row", len(rows))
            results = [self._sample_row(logits[i:i + 1], row, grammars[i]) for i, row in enumerate(rows)]
        output = StepOutput()
        for request, ok, result in zip(sampling_requests, finite, results, strict=True):
            if not ok or isinstance(result, Exception):
                request.dropped = True
                reason = "non-finite logits" if not ok else f"sampling failed: {type(result).__name__}"
                log.error("request %s failed in the worker: %s", request.req_id, reason)
                output.failed.append(FailedRequest(request.req_id, reason, invalid_argument=False))
                continue
            request.token_ids.append(result[0])
            if request.grammar is not None:
                request.grammar.advance(result[0])
            output.req_ids.append(request.req_id)
            output.sampled_token_ids.append(result[0])
            output.logprobs.append(result[1])
        return output

    def _sample_row(self, logits: torch.Tensor, row: SamplingRow, grammar: RequestGrammar | None
                    ) -> tuple[int, TokenLogprobs | None] | Exception:
        try:
            batch = build_sampling_batch([row], self.model_config.vocab_size, self.device)
            token_ids, logprobs = sample(logits, batch, self._grammar_mask([grammar], [row]))
        except Exception as exc:
            log.exception("sampling failed for one row")
            return exc
        return int(token_ids[0]), logprobs[0]

    def _grammar_mask(self, grammars: list[RequestGrammar | None], rows: list[SamplingRow]) -> GrammarMask | None:
        """The token bitmasks of the rows under a grammar; None when no row is (xgrammar is not even imported)."""
        if all(grammar is None for grammar in grammars):
            return None
        from pagedserve.services.gpu_worker.grammar_mask import build_grammar_mask

        return build_grammar_mask(grammars, [row.banned_now for row in rows], self.model_config.vocab_size,
                                  self.device)


def _attach_prompt_logprobs(sampling: list[RequestState], output: StepOutput) -> None:
    """Send the prompt logprobs of the requests that sampled after computing their whole prompt (once each)."""
    for request in sampling:
        if request.sampling.prompt_logprobs is None or request.prompt_logprobs_sent or request.dropped:
            continue
        if request.num_computed_tokens >= request.num_prompt_tokens:
            output.prompt_logprobs[request.req_id] = request.prompt_logprobs
            request.prompt_logprobs, request.prompt_logprobs_sent = [], True


def _plain(request: RequestState) -> bool:
    """Its sampling reads nothing from the host mirror's outputs (so it may run before they are back)."""
    p = request.sampling
    return (request.grammar is None and not request.draft_token_ids and not p.has_penalties and p.logprobs is None
            and p.prompt_logprobs is None
            and (p.seed is None or p.greedy) and len(request.output_token_ids) >= p.min_tokens)
