"""The batched sampler on hand-made logits: each processing step against a direct computation."""

from __future__ import annotations

import torch

from pagedserve.services.gpu_worker.sampler import sample
from pagedserve.services.gpu_worker.sampling_batch import SamplingRow, build_sampling_batch
from pagedserve.shared.sampling_params import SamplingParams

VOCAB = 50


def logits_rows(num_rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(num_rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def run(logits: torch.Tensor, params: list[SamplingParams], outputs: list[list[int]] | None = None,
        prompts: list[list[int]] | None = None, stops: tuple[int, ...] = ()):
    outputs = outputs or [[] for _ in params]
    prompts = prompts or [[] for _ in params]
    rows = [SamplingRow(p, pr, o, stops) for p, pr, o in zip(params, prompts, outputs, strict=True)]
    return sample(logits, build_sampling_batch(rows, VOCAB, torch.device("cpu")))


def test_greedy_is_argmax():
    logits = logits_rows(4)
    ids, logprobs = run(logits, [SamplingParams(temperature=0.0)] * 4)
    assert ids.tolist() == logits.argmax(-1).tolist()
    assert logprobs == [None] * 4


def test_top_k_one_and_tiny_top_p_are_greedy():
    logits = logits_rows(3, seed=1)
    params = [SamplingParams(temperature=1.0, top_k=1), SamplingParams(temperature=1.0, top_p=1e-6),
              SamplingParams(temperature=1.0, min_p=1.0)]
    for _ in range(5):
        ids, _ = run(logits, params)
        assert ids.tolist() == logits.argmax(-1).tolist()


def test_top_k_limits_the_support():
    logits = logits_rows(1, seed=2).expand(400, VOCAB).contiguous()
    ids, _ = run(logits, [SamplingParams(temperature=5.0, top_k=3)] * 400)
    assert set(ids.tolist()) <= set(logits[0].topk(3).indices.tolist())
    assert len(set(ids.tolist())) == 3  # high temperature: all three are drawn


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.full((500, VOCAB), -30.0)
    logits[:, :4] = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    ids, _ = run(logits, [SamplingParams(temperature=1.0, top_p=0.7)] * 500)
    assert set(ids.tolist()) == {0, 1}  # 0.5 < 0.7 needs token 1 too; 0.8 >= 0.7 stops there


def test_sampling_follows_the_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = torch.full((3000, VOCAB), -30.0)
    logits[:, :3] = probs.log()
    ids, _ = run(logits, [SamplingParams(temperature=1.0)] * 3000)
    freq = torch.bincount(ids, minlength=3)[:3].float() / 3000
    assert torch.allclose(freq, probs, atol=0.04)


def test_seeded_rows_repeat_and_differ_by_seed():
    logits = logits_rows(1, seed=3).expand(2, VOCAB).contiguous()
    params = [SamplingParams(temperature=1.5, seed=7), SamplingParams(temperature=1.5, seed=8)]
    draws = [[run(logits, params, outputs=[[1] * k, [1] * k])[0].tolist() for k in range(20)] for _ in range(2)]
    assert draws[0] == draws[1]  # same seed, same output index -> same token, whatever the batch
    assert [d[0] for d in draws[0]] != [d[1] for d in draws[0]]


def test_logit_bias_forces_and_bans_tokens():
    logits = logits_rows(2, seed=4)
    weakest = int(logits[0].argmin())
    strongest = int(logits[1].argmax())
    ids, _ = run(logits, [SamplingParams(temperature=0.0, logit_bias={weakest: 100.0}),
                          SamplingParams(temperature=0.0, logit_bias={strongest: -100.0})])
    assert ids[0] == weakest
    assert ids[1] != strongest


def test_penalties_match_their_definitions():
    logits = logits_rows(1, seed=5)
    prompt_ids, output_ids = [3, 4], [5, 5, 6]
    params = SamplingParams(temperature=0.0, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.25)
    rows = [SamplingRow(params, prompt_ids, output_ids, ())]
    batch = build_sampling_batch(rows, VOCAB, torch.device("cpu"))
    from pagedserve.services.gpu_worker.sampler import _apply_bias_and_penalties

    got = _apply_bias_and_penalties(logits, batch)[0]
    expected = logits[0].clone()
    for token in {3, 4, 5, 6}:
        value = expected[token]
        expected[token] = value / 1.3 if value > 0 else value * 1.3
    expected[5] -= 0.5 + 2 * 0.25
    expected[6] -= 0.5 + 1 * 0.25
    torch.testing.assert_close(got, expected)


def test_min_tokens_bans_stop_tokens_until_reached():
    logits = torch.zeros(2, VOCAB)
    logits[:, 7] = 10.0  # token 7 is the stop token and by far the likeliest
    params = SamplingParams(temperature=0.0, min_tokens=2)
    ids, _ = run(logits, [params, params], outputs=[[1], [1, 2]], stops=(7,))
    assert ids[0] != 7 and ids[1] == 7


def test_banned_tokens_are_never_sampled_even_against_a_bias():
    """ignore_eos bans EOS at every step: greedy, sampled, past min_tokens, and over a positive logit bias."""
    logits = torch.zeros(3, VOCAB)
    logits[:, 7] = 10.0  # token 7 (EOS) is by far the likeliest
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=1),
              SamplingParams(temperature=0.0, logit_bias={7: 100.0})]
    rows = [SamplingRow(p, [], [1, 2, 3], (), (7,)) for p in params]
    for _ in range(20):
        ids, _ = sample(logits.clone(), build_sampling_batch(rows, VOCAB, torch.device("cpu")))
        assert 7 not in ids.tolist()
    free = [SamplingRow(p, [], [1, 2, 3], ()) for p in params[:1]]
    assert sample(logits[:1].clone(), build_sampling_batch(free, VOCAB, torch.device("cpu")))[0].tolist() == [7]


def test_logprobs_come_from_the_raw_distribution():
    logits = logits_rows(2, seed=6)
    ids, logprobs = run(logits, [SamplingParams(temperature=0.0, logprobs=3, logit_bias={0: 100.0}),
                                 SamplingParams(temperature=0.0)])
    raw = torch.log_softmax(logits, -1)
    first = logprobs[0]
    assert first.token_id == 0 and abs(first.logprob - raw[0, 0].item()) < 1e-6
    assert first.rank == int((raw[0] > raw[0, 0]).sum()) + 1
    assert first.top_token_ids == raw[0].topk(3).indices.tolist()
    assert logprobs[1] is None
