"""Paged attention in plain torch, for CPU.

Decodes (one query each) run as one batched call: the C kernel of kernels/cpu when enabled and built (it reads
each request's own blocks up to its own length), else `paged_decode` compiled by torch.compile, else eagerly.
Prefill chunks run all together in the C prefill kernel when enabled and built (it reads the paged context in
place, with an online softmax: no gathered copy, no mask); else each chunk runs as its own
scaled_dot_product_attention over its gathered context (a step holds few chunks, and padding a long chunk
against many decodes would cost more). Measured on the CI machine (fp32, AVX2): 8 chunks of 66 tokens over
1,300 cached ones (a 512-token step of the shared-prefix benchmark) take 15 ms of attention a layer in the C kernel
(kernels/cpu/paged_prefill.c) against about 27 ms through SDPA. Tensors every layer needs the same
(masks, index casts) are built once per step and kept in `meta.scratch`.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from kernels.cpu.build import built_or_none
from kernels.cpu.paged_decode import NativePagedDecode
from kernels.cpu.paged_decode import supports as native_supports
from kernels.cpu.paged_prefill import NativePagedPrefill
from kernels.cpu.paged_prefill import supports as native_prefill_supports
from services.gpu_worker.attention.backend import AttentionBackend, AttentionShape
from services.gpu_worker.attention.cpu_decode import compiled_paged_decode, paged_decode
from services.gpu_worker.attention.metadata import AttentionMetadata

log = logging.getLogger(__name__)
SHORT_CHUNK = 128  # 16-bit chunks up to this many queries over a cached context skip SDPA (_short_chunk_attention)


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def __init__(self, shape: AttentionShape, compile_decode: bool = False, native_decode: bool = False) -> None:
        super().__init__(shape)
        self.decode_fn = compiled_paged_decode() if compile_decode else paged_decode
        self.native_decode = native_decode  # tried by warm_up, which knows the cache dtype (prefill kernel too)
        self.prefill_fn: NativePagedPrefill | None = None  # set by warm_up

    @property
    def decode_compiled(self) -> bool:
        return self.decode_fn is not paged_decode and not self.decode_native

    @property
    def decode_native(self) -> bool:
        return isinstance(self.decode_fn, NativePagedDecode)

    def warm_up(self, key_cache: torch.Tensor, value_cache: torch.Tensor, query_dtype: torch.dtype | None = None
                ) -> None:
        """Build the C decode kernel, or compile the decode graphs up front (batch and block counts of 1
        specialize); on failure fall back to the next option (C kernel -> compiled -> eager) with a warning."""
        query_dtype = query_dtype or key_cache.dtype
        if self.native_decode:
            self._use_native_prefill(key_cache, value_cache, query_dtype)
        if self.native_decode and self._use_native(key_cache, value_cache, query_dtype):
            return
        if not self.decode_compiled:
            return
        try:
            with torch.inference_mode():  # as steps run: inference tensors and grad mode are part of the guards
                for batch, num_blocks in ((1, 1), (1, 2), (2, 1), (2, 2), (3, 3)):
                    self._decode_dummy(self.decode_fn, key_cache, value_cache, batch, num_blocks, query_dtype)
        except Exception as exc:  # a missing C++ compiler, an unsupported platform
            log.warning("torch.compile of decode attention failed (%s: %s); running it eagerly",
                        type(exc).__name__, exc)
            self.decode_fn = paged_decode

    def _use_native(self, key_cache: torch.Tensor, value_cache: torch.Tensor, query_dtype: torch.dtype) -> bool:
        s = self.shape
        if key_cache.device.type != "cpu" or not native_supports(query_dtype, s.num_heads, s.num_kv_heads,
                                                                 s.head_dim, key_cache.dtype):
            return False
        kernel = built_or_none("the C decode attention kernel",
                               lambda: self._tried(NativePagedDecode(), key_cache, value_cache, query_dtype))
        if kernel is not None:
            self.decode_fn = kernel
        return kernel is not None

    def _use_native_prefill(self, key_cache: torch.Tensor, value_cache: torch.Tensor, query_dtype: torch.dtype
                            ) -> None:
        s = self.shape
        if key_cache.device.type == "cpu" and native_prefill_supports(query_dtype, s.num_heads, s.num_kv_heads,
                                                                      s.head_dim, key_cache.shape[1], key_cache.dtype):
            self.prefill_fn = built_or_none("the C prefill attention kernel", lambda: self._tried_prefill(
                NativePagedPrefill(), key_cache, value_cache, query_dtype))

    def _tried_prefill(self, kernel: NativePagedPrefill, key_cache: torch.Tensor, value_cache: torch.Tensor,
                       query_dtype: torch.dtype) -> NativePagedPrefill:
        query = torch.zeros(3, self.shape.num_heads, self.shape.head_dim, dtype=query_dtype)
        starts, lens = torch.tensor([0, 3], dtype=torch.int32), torch.tensor([3], dtype=torch.int32)
        kernel(query, key_cache, value_cache, torch.zeros(1, 1, dtype=torch.int32), starts, lens, self.shape.scale,
               self.shape.sliding_window or 0)
        return kernel

    def _tried(self, kernel: NativePagedDecode, key_cache: torch.Tensor, value_cache: torch.Tensor,
               query_dtype: torch.dtype) -> NativePagedDecode:
        self._decode_dummy(kernel, key_cache, value_cache, 2, 2, query_dtype)
        return kernel

    def _decode_dummy(self, decode_fn, key_cache: torch.Tensor, value_cache: torch.Tensor, batch: int,
                      num_blocks: int, query_dtype: torch.dtype) -> None:
        device = key_cache.device
        query = torch.zeros(batch, self.shape.num_heads, self.shape.head_dim, dtype=query_dtype, device=device)
        tables = torch.zeros(batch, num_blocks, dtype=torch.long, device=device)
        lens = torch.ones(batch, dtype=torch.long, device=device)
        decode_fn(query, key_cache, value_cache, tables, lens, self.shape.scale, self.shape.sliding_window or 0)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                value_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """As the base, with the skipped (negative) slots found once a step, not in every layer."""
        _store(key, value, key_cache, value_cache, *_kept_slots(meta))
        return self.attend(query, key_cache, value_cache, meta)

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        _store(key, value, key_cache, value_cache, *_kept(slot_mapping))

    def attend(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
               meta: AttentionMetadata) -> torch.Tensor:
        if meta.num_decodes == meta.num_requests:  # a decode-only step: no copy into a shared output
            return self._decode(query, key_cache, value_cache, meta)
        out = torch.empty_like(query)
        if meta.num_decodes:
            out[: meta.num_decodes] = self._decode(query[: meta.num_decodes], key_cache, value_cache, meta)
        starts = meta.query_start_loc_cpu
        if self.prefill_fn is not None and meta.num_requests > meta.num_decodes:
            first = starts[meta.num_decodes]
            out[first:] = self.prefill_fn(query[first:], key_cache, value_cache, *_prefill_inputs(meta),
                                          self.shape.scale, self.shape.sliding_window or 0)
            return out
        for i in range(meta.num_decodes, meta.num_requests):
            q = query[starts[i]: starts[i + 1]]
            out[starts[i]: starts[i + 1]] = self._prefill(q, key_cache, value_cache, meta, i)
        return out

    def _decode(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        tables, lens = _decode_inputs(meta, key_cache.shape[1], self.decode_native)
        return self.decode_fn(query, key_cache, value_cache, tables, lens, self.shape.scale,
                              self.shape.sliding_window or 0)

    def _prefill(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 meta: AttentionMetadata, i: int) -> torch.Tensor:
        """query [q_len, H, D] of request i, whose tokens are the last q_len of its seq_len positions."""
        seq_len, q_len = meta.seq_lens_cpu[i], query.shape[0]
        keys, values = _gather_context(key_cache, value_cache, meta.block_tables[i: i + 1], seq_len, query.dtype)
        gqa = self.shape.num_heads != self.shape.num_kv_heads
        q = query.transpose(0, 1).unsqueeze(0)
        if seq_len == q_len and self.shape.sliding_window is None:  # nothing cached before the chunk: plain causal
            out = F.scaled_dot_product_attention(q, keys, values, is_causal=True, scale=self.shape.scale,
                                                 enable_gqa=gqa)
        elif query.dtype != torch.float32 and q_len <= SHORT_CHUNK:
            window = self.shape.sliding_window
            mask = (_chunk_mask(meta, i, q_len, window, query.dtype) if window is not None
                    else _causal_tail(meta, q_len, query.dtype))
            return _short_chunk_attention(query, keys[0], values[0], mask, self.shape.scale)
        else:
            mask = _chunk_mask(meta, i, q_len, self.shape.sliding_window, query.dtype)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.shape.scale,
                                                 enable_gqa=gqa)
        return out.squeeze(0).transpose(0, 1)


def _short_chunk_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                           scale: float) -> torch.Tensor:
    """A short chunk over a long cached context in 16-bit: two batched GEMMs per KV head around a softmax that
    accumulates in fp32. Measured in-process on 16 requests of 66 new tokens over 1,300 cached ones (bf16), the
    512-token steps took 600-670 ms this way against 840-880 ms through torch's CPU SDPA.

    query [q, H, D], keys/values [Hkv, L, D], mask additive over the last mask.shape[1] keys -> [q, H, D]."""
    q_len, num_heads, head_dim = query.shape
    num_kv_heads, length = keys.shape[0], keys.shape[1]
    group = num_heads // num_kv_heads
    q = (query * scale).view(q_len, num_kv_heads, group, head_dim).permute(1, 2, 0, 3).reshape(num_kv_heads, -1,
                                                                                               head_dim)
    scores = torch.bmm(q, keys.transpose(1, 2)).view(num_kv_heads, group, q_len, length)
    scores[..., length - mask.shape[1]:] += mask
    probs = torch.softmax(scores, dim=-1).view(num_kv_heads, -1, length)
    out = torch.bmm(probs, values).view(num_kv_heads, group, q_len, head_dim)
    return out.permute(2, 0, 1, 3).reshape(q_len, num_heads, head_dim)


def _kept(slot_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the slots to write: the non-negative ones, the mask of their rows, None when every row is written)."""
    keep = slot_mapping >= 0
    return (slot_mapping, None) if bool(keep.all()) else (slot_mapping[keep], keep)


def _kept_slots(meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor | None]:
    """_kept of the step's slot mapping, once a step."""
    if "torch.slots" not in meta.scratch:
        meta.scratch["torch.slots"] = _kept(meta.slot_mapping)
    return meta.scratch["torch.slots"]


def _store(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
           slots: torch.Tensor, keep: torch.Tensor | None) -> None:
    if keep is not None:
        key, value = key[keep], value[keep]
    key, value = key.to(key_cache.dtype), value.to(value_cache.dtype)  # an fp16 cache under fp32 queries
    num_kv_heads, head_dim = key_cache.shape[2], key_cache.shape[3]
    key_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, key)
    value_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, value)


def _decode_inputs(meta: AttentionMetadata, block_size: int, native: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The decodes' block tables and lengths (once a step): as they are (int32) for the C kernel, else trimmed to
    the longest context and int64."""
    key = ("torch.decode", native)
    if key not in meta.scratch:
        num = meta.num_decodes
        if native:
            meta.scratch[key] = (meta.block_tables[:num], meta.seq_lens[:num])
        else:
            num_blocks = -(-max(meta.seq_lens_cpu[:num]) // block_size)
            meta.scratch[key] = (meta.block_tables[:num, :num_blocks].long(), meta.seq_lens[:num].long())
    return meta.scratch[key]


def _prefill_inputs(meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The prefill chunks' block tables, query starts (from their first token) and lengths, once a step."""
    key = "torch.prefill"
    if key not in meta.scratch:
        first = meta.num_decodes
        meta.scratch[key] = (meta.block_tables[first:], meta.query_start_loc[first:] - meta.query_start_loc_cpu[first],
                             meta.seq_lens[first:])
    return meta.scratch[key]


def _causal_tail(meta: AttentionMetadata, q_len: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive causal mask [q_len, q_len] over a chunk's own keys: the cached keys before them are all visible."""
    key = ("torch.causal", q_len, dtype)
    if key not in meta.scratch:
        ones = torch.ones(q_len, q_len, dtype=torch.bool, device=meta.seq_lens.device)
        meta.scratch[key] = _additive(torch.triu(ones, diagonal=1), dtype)
    return meta.scratch[key]


def _chunk_mask(meta: AttentionMetadata, i: int, q_len: int, window: int | None, dtype: torch.dtype) -> torch.Tensor:
    """Additive causal (and sliding-window) mask [q_len, seq_len] of chunk i (once a step; torch's CPU attention
    runs about twice as fast with a 0/-inf float mask as with a boolean one)."""
    key = ("torch.mask", i, dtype)
    if key not in meta.scratch:
        seq_len = meta.seq_lens_cpu[i]
        device = meta.seq_lens.device
        q_pos = torch.arange(seq_len - q_len, seq_len, device=device)
        k_pos = torch.arange(seq_len, device=device)
        hidden = k_pos[None, :] > q_pos[:, None]
        if window is not None:
            hidden |= k_pos[None, :] <= (q_pos[:, None] - window)
        meta.scratch[key] = _additive(hidden, dtype)
    return meta.scratch[key]


def _additive(hidden: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean hide-mask -> 0 / -inf additive mask."""
    return torch.zeros(hidden.shape, dtype=dtype, device=hidden.device).masked_fill_(hidden, float("-inf"))


def _gather_context(key_cache: torch.Tensor, value_cache: torch.Tensor, block_tables: torch.Tensor,
                    length: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole blocks of each request's context -> keys, values [B, Hkv, length, D] in `dtype` (the queries')."""
    block_size = key_cache.shape[1]
    num_blocks = -(-length // block_size)
    table = block_tables[:, :num_blocks].long()
    batch = table.shape[0]
    keys = key_cache[table].view(batch, num_blocks * block_size, *key_cache.shape[2:])[:, :length]
    values = value_cache[table].view(batch, num_blocks * block_size, *value_cache.shape[2:])[:, :length]
    return keys.transpose(1, 2).to(dtype), values.transpose(1, 2).to(dtype)
