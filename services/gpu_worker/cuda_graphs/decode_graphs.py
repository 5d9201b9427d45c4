"""Decode-only steps replayed from graphs captured per padded batch size (vLLM's FULL_DECODE_ONLY idea).

Each graph runs the model's forward and the logits over the static buffers of StaticInputs for one padded size of
the ladder; a step of n decodes runs the smallest captured size >= n, its padding rows writing no KV slot and never
sampled. Prefill, mixed steps and decode batches past the largest size run eagerly. Captured largest first, each
after one eager warm-up (which also compiles the kernels), all in one memory pool.
"""

from __future__ import annotations

import bisect
import logging
import time
from dataclasses import dataclass

import torch

from pagedserve.services.gpu_worker.attention.backend import AttentionBackend
from pagedserve.services.gpu_worker.attention.metadata import AttentionMetadata
from pagedserve.services.gpu_worker.cuda_graphs.graph_backend import CapturedGraph, GraphBackend
from pagedserve.services.gpu_worker.cuda_graphs.static_inputs import DecodeViews, StaticInputs
from pagedserve.services.gpu_worker.kv_cache import KVCache
from pagedserve.services.gpu_worker.model import DecoderLM
from pagedserve.services.gpu_worker.platforms.platform import ModelForward
from pagedserve.services.gpu_worker.request_state import RequestState

log = logging.getLogger(__name__)
DEFAULT_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def capture_sizes(spec: str, max_num_seqs: int) -> tuple[int, ...]:
    """`--cuda-graph-sizes` ("" for the default ladder, else comma-separated sizes), never above max_num_seqs."""
    sizes = DEFAULT_SIZES if not spec.strip() else tuple(int(part) for part in spec.split(",") if part.strip())
    if any(size < 1 for size in sizes):
        raise ValueError(f"--cuda-graph-sizes must be positive integers, got {spec!r}")
    return tuple(sorted({size for size in sizes if size <= max_num_seqs}))


@dataclass
class CapturedDecode:
    size: int
    graph: CapturedGraph
    views: DecodeViews
    outputs: dict  # "logits": [size, vocab] fp32, written by every replay


class DecodeGraphs:
    def __init__(self, model: DecoderLM, forward: ModelForward, kv_cache: KVCache, attention: AttentionBackend,
                 sizes: tuple[int, ...], max_model_len: int, backend: GraphBackend) -> None:
        if not sizes:
            raise ValueError("no CUDA graph size fits --max-num-seqs")
        self.model, self.forward, self.kv_cache, self.attention = model, forward, kv_cache, attention
        self.sizes = sizes
        self.backend = backend
        device = kv_cache.key_caches[0].device
        width = -(-max_model_len // kv_cache.block_size)
        self.max_len = width * kv_cache.block_size
        self.inputs = StaticInputs.allocate(max(sizes), width, kv_cache.block_size, device)
        self.graphs: dict[int, CapturedDecode] = {}
        self.capture_s = 0.0
        self.pool_bytes = 0

    @property
    def max_size(self) -> int:
        return self.sizes[-1]

    def padded_size(self, num_rows: int) -> int | None:
        """The smallest captured size holding num_rows decodes; None past the largest."""
        i = bisect.bisect_left(self.sizes, num_rows)
        return self.sizes[i] if i < len(self.sizes) else None

    @torch.inference_mode()
    def capture(self) -> None:
        start = time.perf_counter()
        reserve = getattr(self.attention, "reserve_decode", None)
        if reserve is not None:  # the split-K workspace must not be allocated inside a graph
            reserve(self.max_size, self.max_len, self.inputs.device_buffer.device)
        pool = self.backend.new_pool()
        for size in sorted(self.sizes, reverse=True):
            views = self.inputs.views(size)
            _fill_padding(views)
            outputs: dict = {}
            body = self._body(size, views, outputs)
            body()  # eager warm-up: kernels compile and autotune outside the capture
            self.graphs[size] = CapturedDecode(size, self.backend.capture(body, pool), views, outputs)
        self.capture_s = time.perf_counter() - start
        self.pool_bytes = self.backend.pool_bytes()
        log.info("captured %d decode graphs (sizes %s) in %.2fs; graph pool %.1f MiB", len(self.sizes),
                 ",".join(map(str, self.sizes)), self.capture_s, self.pool_bytes / 2**20)

    def _body(self, size: int, views: DecodeViews, outputs: dict):
        device = views.token_ids.device
        meta = AttentionMetadata(
            slot_mapping=views.slot_mapping,
            query_start_loc=torch.arange(size + 1, dtype=torch.int32, device=device),
            seq_lens=views.seq_lens, block_tables=views.block_tables, num_decodes=size, max_query_len=1,
            max_seq_len=self.max_len, query_start_loc_cpu=list(range(size + 1)), seq_lens_cpu=[self.max_len] * size)
        layers = self.kv_cache.layers

        def body() -> None:
            hidden = self.forward(views.token_ids, views.positions, layers, meta, None)
            outputs["logits"] = self.model.compute_logits(hidden, meta.rows)

        return body

    def run(self, requests: list[RequestState], previous_step: int, previous_sampled: torch.Tensor | None
            ) -> torch.Tensor:
        """fp32 logits [len(requests), vocab] of a decode-only step (one row per request, in order); rows whose
        token is on the device only take it from `previous_sampled` (step `previous_step`'s sampled ids)."""
        captured = self.graphs[self.padded_size(len(requests))]
        num_fed = self.inputs.stage(requests, captured.size, previous_step)
        if num_fed:
            views = captured.views
            rows = views.feed_rows[:num_fed].long()
            views.token_ids.index_copy_(0, rows, previous_sampled[views.feed_sources[:num_fed].long()].int())
        captured.graph.replay()
        return captured.outputs["logits"][: len(requests)]


def _fill_padding(views: DecodeViews) -> None:
    """Every row a padding row: token 0, position 0, no KV slot, length 1, block 0."""
    views.token_ids.zero_()
    views.positions.zero_()
    views.slot_mapping.fill_(-1)
    views.seq_lens.fill_(1)
    views.block_tables.zero_()
