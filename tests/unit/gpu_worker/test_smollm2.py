"""The engine on the real default model (SmolLM2-135M-Instruct from `make model`) against transformers."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from pagedserve.llm import LLM
from pagedserve.services.gpu_worker.input_batch import build_model_input
from pagedserve.services.gpu_worker.platforms.cpu.linear import CGemmLinear
from pagedserve.services.gpu_worker.request_state import RequestState
from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from pagedserve.shared.request_io import FinishReason
from pagedserve.shared.sampling_params import SamplingParams
from tests.greedy_match import check_greedy_match

PROMPTS = ["What is the capital of France?", "Write a short poem about autumn leaves.",
           "Explain what a hash table is in two sentences.", "List three uses of copper.",
           "Translate 'good morning' into Spanish and German."]
NUM_TOKENS = 64
TOP_N = 5


@pytest.fixture(scope="module")
def llm(smollm2_dir):
    """fp32 with fp32 products and an fp32 KV cache, as transformers runs below: the greedy comparisons are exact."""
    return LLM(WorkerConfig(model_dir=str(smollm2_dir), dtype="float32", kv_cache_memory_bytes=256 * 1024**2,
                            int8_activations=False, kv_cache_dtype="float32"))


@pytest.fixture(scope="module")
def prompts(llm):
    return [llm.chat_prompt(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def transformers_greedy(smollm2_dir, prompts):
    """transformers' generate, one prompt at a time: 64 tokens each (EOS banned, as under ignore_eos), top-5 a step."""
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = []  # run the full 64 tokens
    results = []
    for token_ids in prompts:
        inputs = torch.tensor([token_ids])
        # an explicit mask: otherwise generate takes the prompt's <|im_end|> (= pad id) tokens for padding
        out = model.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=NUM_TOKENS,
                             do_sample=False, pad_token_id=2, output_logits=True, return_dict_in_generate=True,
                             suppress_tokens=[2])  # ignore_eos bans EOS; the raw logits below still hold it
        tokens = out.sequences[0, len(token_ids):].tolist()
        assert len(tokens) == NUM_TOKENS
        results.append((tokens, [step[0].topk(TOP_N).indices.tolist() for step in out.logits]))
    return results


GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True, logprobs=TOP_N)


def _compare(completions, transformers_greedy, label: str) -> list[str]:
    verdicts = []
    for completion, (hf_tokens, hf_top) in zip(completions, transformers_greedy, strict=True):
        ours_top = [lp.top_token_ids for lp in completion.logprobs]
        verdicts.append(check_greedy_match(completion.token_ids, ours_top, hf_tokens, hf_top).describe())
    print(f"{label}: {verdicts}")  # which case held, per prompt (shown with -s / in the report)
    return verdicts


def test_capital_of_france(llm, prompts):
    [completion] = llm.generate([prompts[0]], SamplingParams(temperature=0.0, max_tokens=32))
    assert "Paris" in completion.text


def test_ignore_eos_bans_eos_instead_of_stopping_at_it(llm, prompts):
    """The answer ends with EOS after "Paris."; under ignore_eos the worker never samples EOS and runs on in text."""
    eos = llm.engine.worker.runner.eos_token_ids
    [plain] = llm.generate([prompts[0]], SamplingParams(temperature=0.0, max_tokens=32))
    [forced] = llm.generate([prompts[0]], SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True))
    assert plain.finish_reason == FinishReason.STOP and len(plain.token_ids) < 32
    assert len(forced.token_ids) == 32 and not set(forced.token_ids) & set(eos)
    assert forced.token_ids[: len(plain.token_ids) - 1] == plain.token_ids[:-1]  # the same answer, then more text


def test_serving_default_dtype_answers_paris(smollm2_dir, prompts):
    """`--dtype auto` (fp32 through the int8 kernel: SmolLM2's weights are 4-bit grids) with the C decode attention
    kernel."""
    llm = LLM(WorkerConfig(model_dir=str(smollm2_dir), kv_cache_memory_bytes=64 * 1024**2))
    runner = llm.engine.worker.runner
    assert runner.model_config.dtype == torch.float32
    assert runner.backend.decode_native
    [completion] = llm.generate([prompts[0]], SamplingParams(temperature=0.0, max_tokens=32))
    assert "Paris" in completion.text, completion.text


@torch.inference_mode()
def _teacher_forced_logprobs(llm: LLM, token_ids: list[int]) -> torch.Tensor:
    """Log-probabilities of the next token at every position of one sequence, computed as one prompt in the first
    blocks of the KV cache (behind the scheduler's back: only for an LLM that serves nothing else)."""
    runner = llm.engine.worker.runner
    block_size = runner.kv_cache.block_size
    state = RequestState("forced", list(token_ids), len(token_ids), SamplingParams(),
                         list(range(-(-len(token_ids) // block_size))), 0, ())
    batch = build_model_input([state], [len(token_ids)], block_size, runner.device)
    hidden = runner.forward(batch.token_ids, batch.positions, runner.kv_cache.layers, batch.meta, None)
    return runner.model.compute_logits(hidden, batch.meta.rows).log_softmax(-1)


def test_cpu_serving_default_stays_close_to_fp32(smollm2_dir, prompts, transformers_greedy):
    """The serving default on CPU (int8 inputs for the 4-bit weights with outliers in fp32, an fp16 KV cache)
    against exact fp32, teacher-forced on the prompts and transformers' greedy answers: measured KL 0.0009-0.0011
    and 98-99% top-1 agreement (int8 without the outlier split gives 0.0040 and 97.1%, which this test rejects; on 20
    prompts bf16 weights gave KL 0.0016)."""
    exact = LLM(WorkerConfig(model_dir=str(smollm2_dir), dtype="float32", kv_cache_memory_bytes=64 * 1024**2,
                             int8_activations=False, kv_cache_dtype="float32"))
    fast = LLM(WorkerConfig(model_dir=str(smollm2_dir), dtype="float32", kv_cache_memory_bytes=64 * 1024**2))
    kernels = [layer.kernel for layer in fast.engine.worker.runner.model.linears()]
    assert any(isinstance(k, CGemmLinear) and k.gemm is fast.engine.worker.runner.platform.native.int8_linear
               for k in kernels)  # the default takes the int8 kernel
    assert fast.engine.worker.runner.kv_cache.dtype == torch.float16
    kl, agree, total = 0.0, 0, 0
    for prompt, (hf_tokens, _) in zip(prompts, transformers_greedy, strict=True):
        reference, quantized = (_teacher_forced_logprobs(m, prompt + hf_tokens) for m in (exact, fast))
        kl += (reference.exp() * (reference - quantized)).sum().item()
        agree += int((reference.argmax(-1) == quantized.argmax(-1)).sum())
        total += reference.shape[0]
    print(f"serving default vs fp32: mean KL {kl / total:.5f}, top-1 agreement {agree / total:.4f} over {total} "
          "positions")
    assert kl / total < 0.002 and agree / total > 0.98


def test_greedy_matches_transformers_one_by_one(llm, prompts, transformers_greedy):
    completions = [llm.generate([p], GREEDY)[0] for p in prompts]
    assert all(len(c.token_ids) == NUM_TOKENS for c in completions)
    _compare(completions, transformers_greedy, "one by one")


def test_greedy_matches_transformers_in_one_batch(llm, prompts, transformers_greedy):
    completions = llm.generate(prompts, GREEDY)
    assert all(len(c.token_ids) == NUM_TOKENS for c in completions)
    _compare(completions, transformers_greedy, "one batch")


def test_seeded_sampling_repeats_and_seeds_differ(llm, prompts):
    def run(seed: int, batch: list[list[int]]) -> list[int]:
        params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=24, seed=seed, ignore_eos=True)
        return llm.generate(batch, params)[0].token_ids

    first = run(1234, [prompts[1]])
    assert run(1234, [prompts[1]]) == first
    assert run(1234, [prompts[1], prompts[2], prompts[3]]) == first  # batch-mates do not change a seeded stream
    assert run(4321, [prompts[1]]) != first
