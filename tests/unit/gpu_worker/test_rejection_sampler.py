"""Draft verification: greedy accepts the argmax prefix; at temperature 1 the emitted tokens follow the target
distribution exactly (chi-square over 2,000 draws through the real acceptance code, fixed seed)."""

from __future__ import annotations

import torch

from pagedserve.services.gpu_worker.sampling_batch import SamplingRow, build_sampling_batch
from pagedserve.services.gpu_worker.spec_decode.rejection_sampler import verify
from pagedserve.shared.sampling_params import SamplingParams

TARGET = torch.tensor([0.05, 0.30, 0.10, 0.25, 0.20, 0.10])
VOCAB = len(TARGET)


def _chi_square_pvalue(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson's test: the chi-square survival function is the regularised upper incomplete gamma function."""
    statistic = ((observed - expected) ** 2 / expected).sum()
    df = torch.tensor(len(observed) - 1, dtype=torch.float64)
    return float(torch.special.gammaincc(df / 2, statistic / 2))


def _batch(num_rows: int, temperature: float):
    row = SamplingRow(SamplingParams(temperature=temperature, max_tokens=8), [1, 2], [], ())
    return build_sampling_batch([row] * num_rows, VOCAB, torch.device("cpu"))


def test_greedy_accepts_the_argmax_prefix_then_emits_the_argmax():
    logits = torch.full((7, VOCAB), -5.0)
    for row, best in enumerate([3, 1, 4, 0, 2, 5, 5]):  # request 0: rows 0-3 (3 drafts); request 1: rows 4-6 (2)
        logits[row, best] = 5.0
    drafts = torch.tensor([3, 1, 2, -1, 2, 5, -1])  # request 0: 2 accepted, then 4; request 1: all, then bonus 5
    result = verify(logits, _batch(7, 0.0), drafts, [3, 2])
    assert result.num_accepted == [2, 2]
    assert result.token_ids == [[3, 1, 4], [2, 5, 5]]


def test_sampling_with_a_point_mass_draft_keeps_the_target_distribution():
    """2,000 requests, each drafting token 1 (p = 0.3) then one more: the first emitted token (the draft when
    accepted, else a draw from the residual) must be distributed as TARGET, and so must the second whenever the
    draft was accepted (the bonus row's draw)."""
    torch.manual_seed(1234)
    num_requests = 2000
    logits = TARGET.log().repeat(2 * num_requests, 1)
    drafts = torch.tensor([1, -1] * num_requests)
    result = verify(logits, _batch(2 * num_requests, 1.0), drafts, [1] * num_requests)
    first = torch.tensor([tokens[0] for tokens in result.token_ids])
    observed = torch.bincount(first, minlength=VOCAB).double()
    assert _chi_square_pvalue(observed, TARGET.double() * num_requests) > 0.01
    accepted = [tokens for tokens, n in zip(result.token_ids, result.num_accepted, strict=True) if n == 1]
    assert abs(len(accepted) / num_requests - 0.30) < 0.04
    second = torch.bincount(torch.tensor([tokens[1] for tokens in accepted]), minlength=VOCAB).double()
    assert _chi_square_pvalue(second, TARGET.double() * len(accepted)) > 0.01


def test_a_draft_the_target_cannot_produce_is_never_accepted():
    torch.manual_seed(7)
    target = TARGET.clone()
    target[2] = 0.0
    logits = (target / target.sum()).log().repeat(400, 1)
    result = verify(logits, _batch(400, 1.0), torch.tensor([2, -1] * 200), [1] * 200)
    assert result.num_accepted == [0] * 200
    assert all(tokens[0] != 2 for tokens in result.token_ids)
