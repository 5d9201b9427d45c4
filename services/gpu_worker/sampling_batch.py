"""Per-step sampling tensors, built once from the rows that sample this step."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedserve.shared.sampling_params import SamplingParams

_SEED_STRIDE = 1_000_003  # mixes (seed, output index) into one generator seed


@dataclass
class SamplingRow:
    """What the sampler needs to know about one request that samples this step."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    stop_token_ids: tuple[int, ...]  # EOS (unless ignore_eos) and the request's stop ids, banned before min_tokens
    banned_token_ids: tuple[int, ...] = ()  # banned at every step (EOS under ignore_eos)

    @property
    def banned_now(self) -> tuple[int, ...]:
        """Tokens this row may not sample this step: the always-banned ones, plus its stop tokens before min_tokens."""
        if len(self.output_token_ids) < self.params.min_tokens:
            return self.banned_token_ids + self.stop_token_ids
        return self.banned_token_ids


@dataclass
class Penalties:
    presence: torch.Tensor  # [S]
    frequency: torch.Tensor  # [S]
    repetition: torch.Tensor  # [S]
    output_counts: torch.Tensor  # [S, V] occurrences of each token among the outputs
    seen_mask: torch.Tensor  # [S, V] token occurs in prompt or output (repetition penalty applies)


@dataclass
class SamplingBatch:
    temperature: torch.Tensor  # [S]; rows with 0 are greedy
    top_k: torch.Tensor | None  # [S] long, vocab size where disabled; None when no row uses it
    top_p: torch.Tensor | None  # [S]; None when no row uses it
    min_p: torch.Tensor | None  # [S]; None when no row uses it
    penalties: Penalties | None
    bias_index: tuple[torch.Tensor, torch.Tensor] | None  # (rows, token ids) receiving bias_values
    bias_values: torch.Tensor | None
    generators: list[torch.Generator | None]  # per row: seeded rows draw from their own generator
    all_greedy: bool
    num_logprobs: list[int | None]
    max_num_logprobs: int | None


def _seeded_generator(seed: int, output_index: int, device: torch.device) -> torch.Generator:
    """Depends only on (seed, how many tokens the request has produced): batching and preemption cannot change it."""
    generator = torch.Generator(device=device)
    generator.manual_seed((seed * _SEED_STRIDE + output_index) % (2**63 - 1))
    return generator


def _bias_entries(rows: list[SamplingRow]) -> tuple[list[int], list[int], list[float]]:
    """Logit bias, plus -inf on banned tokens and, for rows that have not yet reached min_tokens, on stop tokens
    (the sampler adds them up, so -inf wins over any bias)."""
    row_ids, token_ids, values = [], [], []
    for i, row in enumerate(rows):
        for token_id, bias in row.params.logit_bias.items():
            row_ids.append(i), token_ids.append(token_id), values.append(bias)
        for token_id in row.banned_now:
            row_ids.append(i), token_ids.append(token_id), values.append(float("-inf"))
    return row_ids, token_ids, values


def _penalties(rows: list[SamplingRow], vocab_size: int, device: torch.device) -> Penalties | None:
    if not any(row.params.has_penalties for row in rows):
        return None
    num = len(rows)
    output_counts = torch.zeros(num, vocab_size + 1, device=device)
    seen = torch.zeros(num, vocab_size + 1, dtype=torch.bool, device=device)
    for i, row in enumerate(rows):
        outputs = torch.tensor(row.output_token_ids, dtype=torch.long, device=device).clamp(max=vocab_size)
        prompt = torch.tensor(row.prompt_token_ids, dtype=torch.long, device=device).clamp(max=vocab_size)
        output_counts[i].index_add_(0, outputs, torch.ones_like(outputs, dtype=output_counts.dtype))
        seen[i, prompt] = True
        seen[i, outputs] = True

    def column(name: str) -> torch.Tensor:
        return torch.tensor([getattr(row.params, name) for row in rows], dtype=torch.float32, device=device)

    return Penalties(column("presence_penalty"), column("frequency_penalty"), column("repetition_penalty"),
                     output_counts[:, :vocab_size], seen[:, :vocab_size])


def build_sampling_batch(rows: list[SamplingRow], vocab_size: int, device: torch.device) -> SamplingBatch:
    params = [row.params for row in rows]
    temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)
    use_top_k = any(0 < p.top_k < vocab_size for p in params)
    use_top_p = any(p.top_p < 1.0 for p in params)
    use_min_p = any(p.min_p > 0.0 for p in params)
    row_ids, token_ids, values = _bias_entries(rows)
    num_logprobs = [p.logprobs for p in params]
    requested = [n for n in num_logprobs if n is not None]
    return SamplingBatch(
        temperature=temperature,
        top_k=torch.tensor([p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params],
                           dtype=torch.long, device=device) if use_top_k else None,
        top_p=torch.tensor([p.top_p for p in params], device=device) if use_top_p else None,
        min_p=torch.tensor([p.min_p for p in params], device=device) if use_min_p else None,
        penalties=_penalties(rows, vocab_size, device),
        bias_index=(torch.tensor(row_ids, dtype=torch.long, device=device),
                    torch.tensor(token_ids, dtype=torch.long, device=device)) if row_ids else None,
        bias_values=torch.tensor(values, dtype=torch.float32, device=device) if row_ids else None,
        generators=[None if row.params.seed is None or row.params.greedy else
                    _seeded_generator(row.params.seed, len(row.output_token_ids), device) for row in rows],
        all_greedy=all(p.greedy for p in params),
        num_logprobs=num_logprobs,
        max_num_logprobs=max(requested) if requested else None,
    )
