"""Turn the requests scheduled this step into flat model inputs and attention metadata.

Region map of the flattened batch (decodes first, then prefill chunks):
    rows  [0, num_decodes)                   one token each, the request's newest position
    rows  [num_decodes, T)                   chunk i covers positions [computed_i, computed_i + scheduled_i)
A request with draft tokens (speculative decoding) is a chunk over its last known token and its drafts; it keeps
the logits of all those rows (each verifies the next draft), the others only of their last row. A request asking
for prompt logprobs also keeps the rows of its chunk that predict a prompt token (prompt_logprobs.py): the forward
keeps the union, and `sample_positions` picks the sampling rows out of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedserve.services.gpu_worker.attention.metadata import AttentionMetadata
from pagedserve.services.gpu_worker.prompt_logprobs import PromptRows, plan_prompt_rows
from pagedserve.services.gpu_worker.request_state import RequestState
from pagedserve.services.gpu_worker.step_rows import KeptRows, StepRows


@dataclass
class ModelInput:
    token_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: AttentionMetadata
    requests: list[RequestState]  # batch order
    num_scheduled: list[int]  # parallel to requests
    sample_indices: list[int]  # indices into `requests` of those that sample a token this step
    logits_rows: KeptRows  # the rows the forward keeps: the sampling rows, and the prompt rows when any
    feed_rows: list[int]  # rows whose token is on the device only (RequestState.pending) ...
    feed_sources: list[int]  # ... and its row in the sampled ids of the step that made it
    prompt: PromptRows | None = None  # the rows whose logits give prompt logprobs; None: no such row
    # with prompt rows: where the sampling rows (in order) and the prompt rows sit in the kept rows, and the
    # StepRows of the sampling rows alone
    sample_positions: torch.Tensor | None = None
    prompt_positions: torch.Tensor | None = None
    sample_rows: StepRows | None = None

    @property
    def has_drafts(self) -> bool:
        return any(self.requests[i].draft_token_ids for i in self.sample_indices)


def order_decodes_first(requests: list[RequestState], num_scheduled: list[int]) -> list[int]:
    """Stable order with single-token requests first (attention runs them as one batched decode)."""
    return sorted(range(len(requests)), key=lambda i: num_scheduled[i] != 1)


def build_model_input(requests: list[RequestState], num_scheduled: list[int], block_size: int,
                      device: torch.device, previous_step: int = -1) -> ModelInput:
    """`previous_step`: the serial of the step whose sampled ids still hold tokens only the device knows."""
    order = order_decodes_first(requests, num_scheduled)
    requests = [requests[i] for i in order]
    num_scheduled = [num_scheduled[i] for i in order]
    starts = [r.num_computed_tokens for r in requests]
    token_ids: list[int] = []
    feed_rows: list[int] = []
    feed_sources: list[int] = []
    for r, start, n in zip(requests, starts, num_scheduled, strict=True):
        known = r.token_ids + r.draft_token_ids if r.draft_token_ids else r.token_ids  # drafts follow the known
        token_ids.extend(known[start: start + n])
        if start + n > len(known):  # the newest token is still on the device: a placeholder, fed by index
            feed_rows.append(len(token_ids))
            feed_sources.append(r.fed_row(previous_step))
            token_ids.append(0)

    lengths = torch.tensor(num_scheduled, dtype=torch.long)
    query_start_loc = torch.zeros(len(requests) + 1, dtype=torch.long)
    torch.cumsum(lengths, 0, out=query_start_loc[1:])
    seq_lens = torch.tensor(starts, dtype=torch.long) + lengths
    request_of_row = torch.repeat_interleave(torch.arange(len(requests)), lengths)
    positions = torch.arange(int(query_start_loc[-1])) - query_start_loc[request_of_row] + torch.tensor(
        starts, dtype=torch.long)[request_of_row]

    max_blocks = max(len(r.block_ids) for r in requests)
    block_tables = torch.zeros(len(requests), max_blocks, dtype=torch.int32)
    for i, r in enumerate(requests):
        block_tables[i, : len(r.block_ids)] = torch.tensor(r.block_ids, dtype=torch.int32)
    slot_mapping = block_tables[request_of_row, positions // block_size].long() * block_size + positions % block_size

    sample_indices = [i for i, (r, s, n) in enumerate(zip(requests, starts, num_scheduled, strict=True))
                      if s + n == r.num_tokens + len(r.draft_token_ids)]
    num_decodes = sum(1 for n in num_scheduled if n == 1)
    prompt = None
    if any(r.sampling.prompt_logprobs is not None for r in requests):
        prompt = plan_prompt_rows(requests, starts, num_scheduled, query_start_loc[:-1].tolist(), num_decodes)
    meta = AttentionMetadata(
        slot_mapping=slot_mapping.to(device),
        query_start_loc=query_start_loc.to(device=device, dtype=torch.int32),
        seq_lens=seq_lens.to(device=device, dtype=torch.int32),
        block_tables=block_tables.to(device),
        num_decodes=num_decodes,
        max_query_len=max(num_scheduled),
        max_seq_len=int(seq_lens.max()),
        query_start_loc_cpu=query_start_loc.tolist(),
        seq_lens_cpu=seq_lens.tolist(),
    )
    logits_rows = _logits_rows(requests, sample_indices, query_start_loc, num_decodes, device)
    model_input = ModelInput(
        token_ids=torch.tensor(token_ids, dtype=torch.long, device=device),
        positions=positions.to(device),
        meta=meta,
        requests=requests,
        num_scheduled=num_scheduled,
        sample_indices=sample_indices,
        logits_rows=logits_rows,
        feed_rows=feed_rows,
        feed_sources=feed_sources,
    )
    if prompt is not None:
        _keep_prompt_rows(model_input, prompt, num_decodes, device)
    return model_input


def _keep_prompt_rows(model_input: ModelInput, prompt: PromptRows, num_decodes: int, device: torch.device) -> None:
    """Keep the prompt rows beside the sampling rows (the two sets never share a row: a sampling row is at a
    position >= the prompt's last, prompt rows before it), in increasing row order."""
    sampling = model_input.logits_rows
    sample_rows = sampling.indices.cpu()
    rows = torch.cat([sample_rows, torch.tensor(prompt.rows, dtype=torch.long)])
    kept, order = rows.sort()
    position_of = torch.empty_like(order)
    position_of[order] = torch.arange(len(order))
    model_input.logits_rows = KeptRows(kept.to(device), StepRows(len(kept), int((kept < num_decodes).sum())))
    model_input.sample_positions = position_of[: len(sample_rows)].to(device)
    model_input.prompt_positions = position_of[len(sample_rows):].to(device)
    model_input.sample_rows = sampling.rows
    model_input.prompt = prompt


def _logits_rows(requests: list[RequestState], sample_indices: list[int], query_start_loc: torch.Tensor,
                 num_decodes: int, device: torch.device) -> KeptRows:
    """Each sampling request's last row, preceded by one row per draft token it carries."""
    num_sampling_decodes = sum(1 for i in sample_indices if i < num_decodes)
    last_rows = query_start_loc[1:][sample_indices] - 1
    if not any(requests[i].draft_token_ids for i in sample_indices):
        return KeptRows(last_rows.to(device), StepRows(len(sample_indices), num_sampling_decodes))
    num_drafts = torch.tensor([len(requests[i].draft_token_ids) for i in sample_indices], dtype=torch.long)
    counts = num_drafts + 1
    firsts = torch.repeat_interleave(last_rows - num_drafts, counts)
    offsets = torch.arange(int(counts.sum())) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    return KeptRows((firsts + offsets).to(device), StepRows(int(counts.sum()), num_sampling_decodes))
