"""Prompt logprobs through the worker's real step path, against a full-vocabulary log_softmax of transformers' own
forward over the whole prompt (fp32, tiny random model, 1e-4): in one step, in uneven chunks beside other requests,
and through the engine when another request already cached the prompt's prefix."""

from __future__ import annotations

import pytest
import torch

from pagedserve.llm_engine import LLMEngine
from pagedserve.services.gpu_worker.worker import Worker
from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from pagedserve.services.scheduler.scheduler_config import SchedulerConfig
from pagedserve.shared.request_io import GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams
from pagedserve.shared.step_protocol import CachedRequest, NewRequest, StepInput, TokenLogprobs
from tests.unit.gpu_worker.tiny_models import make_tiny_model

ATOL = 1e-4
BLOCK_SIZE = 4
ASKS = SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=3)
PLAIN = SamplingParams(max_tokens=8, temperature=0.0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    return make_tiny_model("llama", folder), folder


def make_worker(folder) -> Worker:
    return Worker(WorkerConfig(model_dir=str(folder), dtype="float32", block_size=BLOCK_SIZE,
                               kv_cache_memory_bytes=2 * 1024**2, torch_compile=False, native_kernels=False,
                               int8_activations=False))


def prompt(seed: int, length: int) -> list[int]:
    return torch.randint(0, 101, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def reference(hf_model, tokens: list[int]) -> torch.Tensor:
    """[len - 1, V]: row p is the log-distribution of token p + 1."""
    with torch.no_grad():
        return torch.log_softmax(hf_model(torch.tensor([tokens])).logits[0, :-1].float(), dim=-1)


def assert_matches(entries: list[TokenLogprobs], tokens: list[int], ref: torch.Tensor, top_n: int) -> None:
    assert [e.token_id for e in entries] == tokens[1:]
    got = torch.tensor([e.logprob for e in entries])
    want = ref.gather(-1, torch.tensor(tokens[1:])[:, None]).squeeze(-1)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    assert [e.rank for e in entries] == ((ref > want[:, None]).sum(-1) + 1).tolist()
    top_values, top_ids = ref.topk(top_n, dim=-1)
    assert [e.top_token_ids for e in entries] == top_ids.tolist()
    torch.testing.assert_close(torch.tensor([e.top_logprobs for e in entries]), top_values, atol=ATOL, rtol=0)


def blocks(first: int, num_tokens: int) -> list[int]:
    return list(range(first, first + -(-num_tokens // BLOCK_SIZE)))


def test_whole_prompt_in_one_step(tiny):
    hf_model, folder = tiny
    worker, tokens = make_worker(folder), prompt(1, 23)
    step = StepInput(new_requests=[NewRequest("a", tokens, len(tokens), ASKS, blocks(0, 25), 0)],
                     num_scheduled_tokens={"a": len(tokens)}, incarnation_id=worker.incarnation_id)
    output = worker.execute_step(step)
    assert output.req_ids == ["a"] and list(output.prompt_logprobs) == ["a"]
    assert_matches(output.prompt_logprobs["a"], tokens, reference(hf_model, tokens), 3)


def test_uneven_chunks_beside_decodes_and_a_plain_prefill(tiny):
    """Chunks of 5, 1, 9 and 8 tokens (the 1-token one sits in the decode region of its step) in steps shared with
    a decoding request and a plain prompt; the entries leave the worker once, with the first token, and the other
    requests sample what they sample alone."""
    hf_model, folder = tiny
    tokens, other, plain_prompt = prompt(2, 23), prompt(3, 6), prompt(4, 11)
    alone = make_worker(folder)
    solo = alone.execute_step(StepInput(
        new_requests=[NewRequest("d", other, len(other), PLAIN, blocks(0, 20), 0),
                      NewRequest("p", plain_prompt, len(plain_prompt), PLAIN, blocks(10, 20), 0)],
        num_scheduled_tokens={"d": len(other), "p": len(plain_prompt)}, incarnation_id=alone.incarnation_id))
    worker = make_worker(folder)
    inc = worker.incarnation_id
    first = worker.execute_step(StepInput(
        new_requests=[NewRequest("a", tokens, len(tokens), ASKS, blocks(20, 25), 0),
                      NewRequest("d", other, len(other), PLAIN, blocks(0, 20), 0)],
        num_scheduled_tokens={"a": 5, "d": len(other)}, incarnation_id=inc))
    assert first.prompt_logprobs == {} and first.req_ids == ["d"]
    chunks, computed = [], 5
    second = worker.execute_step(StepInput(
        new_requests=[NewRequest("p", plain_prompt, len(plain_prompt), PLAIN, blocks(10, 20), 0)],
        cached_requests=[CachedRequest("a", [], computed), CachedRequest("d", [], len(other))],
        num_scheduled_tokens={"a": 1, "d": 1, "p": len(plain_prompt)}, incarnation_id=inc))
    assert second.prompt_logprobs == {}
    assert dict(zip(second.req_ids, second.sampled_token_ids, strict=True))["p"] == solo.sampled_token_ids[1]
    computed += 1
    for n in (9, 8):
        chunks.append(worker.execute_step(StepInput(
            cached_requests=[CachedRequest("a", [], computed), CachedRequest("d", [], len(other) + 1 + len(chunks)),
                             CachedRequest("p", [], len(plain_prompt) + len(chunks))],
            num_scheduled_tokens={"a": n, "d": 1, "p": 1}, incarnation_id=inc)))
        computed += n
    assert chunks[0].prompt_logprobs == {} and "a" not in chunks[0].req_ids
    assert list(chunks[1].prompt_logprobs) == ["a"] and "a" in chunks[1].req_ids
    assert_matches(chunks[1].prompt_logprobs["a"], tokens, reference(hf_model, tokens), 3)
    assert first.sampled_token_ids == [solo.sampled_token_ids[0]]


def test_a_mirror_starting_past_the_first_token_fails_alone(tiny):
    _, folder = tiny
    worker, tokens = make_worker(folder), prompt(5, 12)
    output = worker.execute_step(StepInput(
        new_requests=[NewRequest("a", tokens, len(tokens), ASKS, blocks(0, 14), 4)],
        num_scheduled_tokens={"a": len(tokens) - 4}, incarnation_id=worker.incarnation_id))
    assert [f.req_id for f in output.failed] == ["a"] and not output.failed[0].invalid_argument
    assert output.prompt_logprobs == {}


@pytest.mark.parametrize("budget", [64, 7])
def test_engine_with_the_prefix_cached_by_another_request(tiny, budget):
    """A first request caches the prompt's leading blocks; the second asks for prompt logprobs: it computes the
    whole prompt (no cached tokens) in chunks of the step budget, and its entries match the reference."""
    hf_model, folder = tiny
    engine = LLMEngine(make_worker(folder), SchedulerConfig(max_num_batched_tokens=budget, prefill_finish_slack=0))
    shared = prompt(6, 16)
    tokens = shared + prompt(7, 5)
    outputs = {}
    for req_id, token_ids, params in (("warm", shared + prompt(8, 3), PLAIN), ("asks", tokens, ASKS),
                                      ("plain", tokens, PLAIN)):
        engine.add_request(GenerateRequest(req_id, token_ids, params))
        while engine.has_unfinished_requests():
            for out in engine.step():
                outputs.setdefault(out.req_id, []).append(out)
    assert outputs["warm"][0].prompt_logprobs is None
    assert [o.prompt_logprobs is not None for o in outputs["asks"]] == [True, False]
    assert outputs["asks"][0].num_cached_tokens == 0
    assert_matches(outputs["asks"][0].prompt_logprobs, tokens, reference(hf_model, tokens), 3)
    assert outputs["plain"][0].num_cached_tokens == 20  # the cache did hold the prefix (and now asks' blocks)
