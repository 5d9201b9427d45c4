"""Owns the model and the KV cache on one device: runs one flattened forward per step and samples."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from services.gpu_worker.attention.backend import AttentionShape
from services.gpu_worker.generation_defaults import eos_token_ids
from services.gpu_worker.input_batch import ModelInput, build_model_input
from services.gpu_worker.kv_cache import KVCache, num_blocks_for_budget
from services.gpu_worker.loader import load_model
from services.gpu_worker.model_config import dtype_name, load_model_config
from services.gpu_worker.platforms import platform_for
from services.gpu_worker.request_state import RequestState
from services.gpu_worker.sampler import sample
from services.gpu_worker.sampling_batch import SamplingRow, build_sampling_batch
from services.gpu_worker.spec_decode.verify_step import verify_step
from services.gpu_worker.worker_config import WorkerConfig
from shared.step_protocol import FailedRequest, ModelDescription, StepOutput, TokenLogprobs

if TYPE_CHECKING:  # xgrammar loads only once a request brings a grammar
    from services.gpu_worker.grammar import RequestGrammar
    from services.gpu_worker.grammar_mask import GrammarMask

log = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.platform = platform_for(config)
        self.device = self.platform.device
        mc = load_model_config(config.model_dir, config.dtype)
        if config.dtype in ("auto", ""):
            mc = replace(mc, dtype=self.platform.serving_dtype(mc.dtype, str(config.model_dir)))
        self.model_config = mc
        self.max_model_len = config.max_model_len or mc.max_position_embeddings
        kv_dtype = self.platform.kv_cache_dtype(config.kv_cache_dtype, mc.dtype)
        shape = AttentionShape(mc.num_heads, mc.num_kv_heads, mc.head_dim, mc.head_dim ** -0.5, mc.sliding_window)
        self.backend = self.platform.attention_backend(config.attention_backend, shape, mc.dtype, kv_dtype,
                                                       config.block_size)
        self.model = load_model(config.model_dir, mc, self.backend, self.max_model_len, self.platform)
        self.eos_token_ids = eos_token_ids(config.model_dir)
        num_blocks = num_blocks_for_budget(mc, self.platform.kv_cache_budget_bytes(config), config.block_size,
                                           kv_dtype)
        self.kv_cache = KVCache.allocate(mc, num_blocks, config.block_size, self.device, kv_dtype)
        self.forward = self.platform.model_forward(self.model, self.backend, self.kv_cache)
        log.info("KV cache: %d blocks of %d tokens in %s (%.0f MiB); model in %s", self.kv_cache.num_blocks,
                 config.block_size, dtype_name(kv_dtype), self.kv_cache.num_bytes / 2**20, dtype_name(mc.dtype))

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

    @torch.inference_mode()
    def run(self, requests: list[RequestState], num_scheduled: list[int]) -> StepOutput:
        """Compute the scheduled tokens of each request; sample for those that reach their last known token."""
        start_ns = time.perf_counter_ns()
        batch = build_model_input(requests, num_scheduled, self.kv_cache.block_size, self.device)
        hidden = self.forward(batch.token_ids, batch.positions, self.kv_cache.layers, batch.meta, batch.logits_rows)
        output, sample_ns = StepOutput(), 0
        if batch.sample_indices:
            logits = self.model.compute_logits(hidden, batch.logits_rows.rows)
            sample_start_ns = time.perf_counter_ns()
            output = self._sample(batch, logits) if not batch.has_drafts else verify_step(
                batch, logits, self._sample, self.model_config.vocab_size, self.kv_cache.block_size)
            sample_ns = time.perf_counter_ns() - sample_start_ns
        for request, n in zip(batch.requests, batch.num_scheduled, strict=True):
            request.num_computed_tokens += n
        output.forward_time_ns, output.sample_time_ns = time.perf_counter_ns() - start_ns, sample_ns
        return output

    def _sample(self, batch: ModelInput, logits: torch.Tensor) -> StepOutput:
        """Sample every row that is due; a row with non-finite logits, or one the sampler fails on, fails its own
        request alone (the batch is retried row by row only after an error)."""
        sampling_requests = [batch.requests[i] for i in batch.sample_indices]
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
        from services.gpu_worker.grammar_mask import build_grammar_mask

        return build_grammar_mask(grammars, [row.banned_now for row in rows], self.model_config.vocab_size,
                                  self.device)
