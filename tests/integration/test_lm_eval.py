"""lm-evaluation-harness (PyPI lm-eval, its `local-completions` model) against a real `pagedserve serve` of the
default model, on a loglikelihood task built from local files (lm_eval_task/: no hub): it completes, and every
item's logprob equals the offline engine's (`pagedserve.LLM`, prompt logprobs of the same tokens) within 1e-4.

lm-eval lives in its own virtual environment (`make lm-eval-tools`, which `make test` runs): it is never imported
here, only run as the command a user runs. It sends echo=True, max_tokens=1, logprobs=1 with token-id prompts and
sums token_logprobs[ctxlen:-1] (lm_eval/models/openai_completions.py).

Slow (about 2 minutes on 2 busy cores, the session's stack aside): lm_eval's own start takes ~35 s and the offline
engine's (torch.compile) most of the rest; the items are few and short.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from pagedserve.llm import LLM
from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from pagedserve.shared.sampling_params import SamplingParams
from tests.integration.processes import MODEL_DIR, REPO, Stack

LM_EVAL = REPO / ".lmeval-venv" / "bin" / "lm_eval"
TASK_DIR = Path(__file__).parent / "lm_eval_task"
ATOL = 1e-4

pytestmark = pytest.mark.slow


def run_lm_eval(stack: Stack, tmp_path: Path) -> list[dict]:
    """Run the task through lm-eval against the stack; its logged samples."""
    if not LM_EVAL.is_file():
        raise AssertionError(f"{LM_EVAL} is missing: run `make lm-eval-tools` (lm-eval in its own venv)")
    include = tmp_path / "tasks"
    include.mkdir()
    task = (TASK_DIR / "task.yaml").read_text().replace("ITEMS_PATH", str(TASK_DIR / "items.jsonl"))
    (include / "task.yaml").write_text(task)
    model_args = ",".join([f"model={MODEL_DIR.name}", f"base_url={stack.base_url}/v1/completions",
                           "tokenizer_backend=huggingface", f"tokenizer={MODEL_DIR}", "num_concurrent=1",
                           "max_retries=1"])
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    done = subprocess.run([str(LM_EVAL), "--model", "local-completions", "--model_args", model_args,
                           "--tasks", "pagedserve_tiny_ll", "--include_path", str(include),
                           "--output_path", str(tmp_path / "out"), "--log_samples"],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert done.returncode == 0, f"lm_eval failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    samples = list((tmp_path / "out").rglob("samples_pagedserve_tiny_ll_*.jsonl"))
    assert len(samples) == 1, samples
    return [json.loads(line) for line in samples[0].read_text().splitlines()]


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's split for causal models: trailing spaces of the context move to the continuation, the whole is
    encoded (no special tokens) and cut at the context's length."""
    num_spaces = len(context) - len(context.rstrip())
    if num_spaces:
        context, continuation = context[:-num_spaces], context[-num_spaces:] + continuation
    whole = tokenizer(context + continuation, add_special_tokens=False).input_ids
    num_context = len(tokenizer(context, add_special_tokens=False).input_ids)
    return whole[:num_context], whole[num_context:]


def test_local_completions_loglikelihood_matches_the_offline_engine(stack: Stack, tmp_path):
    samples = run_lm_eval(stack, tmp_path)
    items = [json.loads(line) for line in (TASK_DIR / "items.jsonl").read_text().splitlines()]
    assert sorted(s["doc_id"] for s in samples) == list(range(len(items)))
    pairs, served = [], []
    for sample in samples:
        for i in range(len(sample["doc"]["choices"])):
            args = sample["arguments"][f"gen_args_{i}"]
            pairs.append((args["arg_0"], args["arg_1"]))
            logprob, greedy = sample["resps"][i][0]
            served.append((float(logprob), greedy == "True"))
    assert len(pairs) == sum(len(item["choices"]) for item in items)

    llm = LLM(WorkerConfig(model_dir=str(MODEL_DIR), kv_cache_memory_bytes=256 * 1024**2))  # serve's defaults
    offline, prompts = [], []
    for context, continuation in pairs:
        context_ids, continuation_ids = encode_pair(llm.tokenizer, context, continuation)
        [completion] = llm.generate([context_ids + continuation_ids],
                                    SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=2))
        entries = completion.prompt_logprobs[len(context_ids) - 1:]  # entry i is prompt token i + 1's
        assert [e.token_id for e in entries] == continuation_ids
        offline.append((sum(e.logprob for e in entries), all(e.rank == 1 for e in entries)))
        prompts.append((context_ids + continuation_ids, completion.prompt_logprobs))
    for (context, continuation), (got, got_greedy), (want, want_greedy) in zip(pairs, served, offline, strict=True):
        assert abs(got - want) <= ATOL, (context, continuation, got, want)
        assert got_greedy == want_greedy, (context, continuation)

    # vLLM's prompt_logprobs field on the same stack: every entry, the top 2 included
    token_ids, entries = prompts[-1]
    answer = httpx.post(f"{stack.base_url}/v1/completions", timeout=120, json={
        "model": MODEL_DIR.name, "prompt": token_ids, "max_tokens": 1, "prompt_logprobs": 2})
    assert answer.status_code == 200, answer.text
    served_entries = answer.json()["choices"][0]["prompt_logprobs"]
    assert served_entries[0] is None and len(served_entries) == len(token_ids)
    for token_id, served_entry, entry in zip(token_ids[1:], served_entries[1:], entries, strict=True):
        want = {token_id: entry.logprob} | dict(zip(entry.top_token_ids, entry.top_logprobs, strict=True))
        got = {int(t): v["logprob"] for t, v in served_entry.items()}
        assert got.keys() == want.keys() and all(abs(got[t] - want[t]) <= ATOL for t in want), (got, want)
