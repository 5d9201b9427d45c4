"""Paged attention in torch, with room for faster decode and prefill kernels a platform hands in (CPU: C ones).

Decodes (one query each) run as one batched call of `decode_fn`: `paged_decode` eagerly or compiled, or a kernel
that reads each request's own blocks up to its own length. Prefill chunks run all together in `prefill_fn` when
one is given (it reads the paged context in place); else each chunk runs as its own scaled_dot_product_attention
over its gathered context (a step holds few chunks, and padding a long chunk against many decodes would cost
more). With `decodes_as_chunks`, decodes too go through `prefill_fn` as one-row chunks: one kernel for every
row, so a row's numbers do not depend on whether it was computed as a decode or inside a prompt chunk (the
batch-invariant mode). Tensors every layer needs the same (masks, index casts) are built once per step and kept
in `meta.scratch`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F

from pagedserve.services.gpu_worker.attention.backend import UNIT_SCALES, AttentionBackend, AttentionShape, KVScales
from pagedserve.services.gpu_worker.attention.cpu_decode import paged_decode
from pagedserve.services.gpu_worker.attention.metadata import AttentionMetadata

log = logging.getLogger(__name__)
SHORT_CHUNK = 128  # 16-bit chunks up to this many queries over a cached context skip SDPA (_short_chunk_attention)
# (query [B, H, D], key_cache, value_cache, block_tables [B, nb], seq_lens [B], scale, window) -> [B, H, D]
DecodeFn = Callable[..., torch.Tensor]
# (query [T, H, D], key_cache, value_cache, block_tables [B, nb], query_starts [B + 1], seq_lens [B], scale,
#  window) -> [T, H, D]
PrefillFn = Callable[..., torch.Tensor]


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def __init__(self, shape: AttentionShape, decode_fn: DecodeFn = paged_decode, decode_native: bool = False,
                 prefill_fn: PrefillFn | None = None, decodes_as_chunks: bool = False) -> None:
        """`decode_native`: `decode_fn` takes the whole int32 block tables and lengths (a C kernel), not int64
        tables trimmed to the longest context (paged_decode's contract)."""
        super().__init__(shape)
        if decodes_as_chunks and prefill_fn is None:
            raise ValueError("decodes run as prompt chunks only through a prefill kernel")
        self.decode_fn = decode_fn
        self.decode_native = decode_native
        self.prefill_fn = prefill_fn
        self.decodes_as_chunks = decodes_as_chunks

    @property
    def decode_compiled(self) -> bool:
        return self.decode_fn is not paged_decode and not self.decode_native

    def warm_up(self, key_cache: torch.Tensor, value_cache: torch.Tensor, query_dtype: torch.dtype | None = None
                ) -> None:
        """Compile the decode graphs up front (batch and block counts of 1 specialize); if compiling fails, run
        decode attention eagerly, with a warning."""
        if not self.decode_compiled or self.decodes_as_chunks:
            return
        try:
            with torch.inference_mode():  # as steps run: inference tensors and grad mode are part of the guards
                for batch, num_blocks in ((1, 1), (1, 2), (2, 1), (2, 2), (3, 3)):
                    decode_dummy(self.decode_fn, self.shape, key_cache, value_cache, batch, num_blocks,
                                 query_dtype or key_cache.dtype)
        except Exception as exc:  # a missing C++ compiler, an unsupported platform
            log.warning("torch.compile of decode attention failed (%s: %s); running it eagerly",
                        type(exc).__name__, exc)
            self.decode_fn = paged_decode

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                value_cache: torch.Tensor, meta: AttentionMetadata, scales: KVScales = UNIT_SCALES) -> torch.Tensor:
        """As the base, with the skipped (negative) slots found once a step, not in every layer (no fp8 caches
        here, so `scales` never apply)."""
        _store(key, value, key_cache, value_cache, *_kept_slots(meta))
        return self.attend(query, key_cache, value_cache, meta)

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 slot_mapping: torch.Tensor, scales: KVScales = UNIT_SCALES) -> None:
        _store(key, value, key_cache, value_cache, *_kept(slot_mapping))

    def attend(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
               meta: AttentionMetadata, scales: KVScales = UNIT_SCALES) -> torch.Tensor:
        if self.decodes_as_chunks:
            return self.prefill_fn(query, key_cache, value_cache, meta.block_tables, meta.query_start_loc,
                                   meta.seq_lens, self.shape.scale, self.shape.sliding_window or 0)
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
    accumulates in fp32 (faster than torch's CPU SDPA there; docs/cpu.md).

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


def decode_dummy(decode_fn: DecodeFn, shape: AttentionShape, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 batch: int, num_blocks: int, query_dtype: torch.dtype) -> None:
    """One decode call of `batch` zero queries over the first `num_blocks` blocks (to compile or try a kernel)."""
    device = key_cache.device
    query = torch.zeros(batch, shape.num_heads, shape.head_dim, dtype=query_dtype, device=device)
    tables = torch.zeros(batch, num_blocks, dtype=torch.long, device=device)
    lens = torch.ones(batch, dtype=torch.long, device=device)
    decode_fn(query, key_cache, value_cache, tables, lens, shape.scale, shape.sliding_window or 0)
