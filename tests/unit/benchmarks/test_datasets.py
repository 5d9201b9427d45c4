import json
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from pagedserve.benchmarks.dataset_builder import build_dataset
from pagedserve.benchmarks.datasets import DatasetConfig, sample_lengths


def random_cfg(**kw) -> DatasetConfig:
    base = {"name": "random", "num_prompts": 16, "random_input_len": 300, "random_output_len": 100}
    return DatasetConfig(**(base | {"random_range_ratio": 0.8} | kw))


def test_sample_lengths_cover_the_inclusive_range():
    lens = sample_lengths(np.random.default_rng(0), 300, 0.8, 5000)
    assert (lens.min(), lens.max()) == (60, 540)
    assert sample_lengths(np.random.default_rng(0), 5, 0.0, 3).tolist() == [5, 5, 5]
    assert sample_lengths(np.random.default_rng(0), 1, 0.9, 100).min() == 1


def test_random_prompts_have_exact_sampled_token_lengths(tokenizer):
    cfg = random_cfg()
    requests = build_dataset(cfg, tokenizer, seed=3)
    rng = np.random.default_rng(3)  # build_random draws input then output lengths first
    expected_inputs = sample_lengths(rng, 300, 0.8, 16).tolist()
    expected_outputs = sample_lengths(rng, 100, 0.8, 16).tolist()
    assert [tokenizer.count(r.prompt) for r in requests] == expected_inputs
    assert [r.num_prompt_tokens for r in requests] == expected_inputs
    assert [r.num_output_tokens for r in requests] == expected_outputs
    assert all(r.system_prompt is None for r in requests)


def test_random_prefix_is_shared_and_counted(tokenizer):
    cfg = random_cfg(random_prefix_len=64, random_range_ratio=0.0, random_input_len=40)
    requests = build_dataset(cfg, tokenizer, seed=0)
    ids = [tokenizer.encode(r.prompt) for r in requests]
    assert all(len(i) == 104 for i in ids)
    assert len({tuple(i[:64]) for i in ids}) == 1
    assert len({tuple(i[64:]) for i in ids}) == len(requests)


def test_random_dataset_is_seeded(tokenizer):
    cfg = random_cfg(num_prompts=4)
    assert build_dataset(cfg, tokenizer, 11) == build_dataset(cfg, tokenizer, 11)
    assert build_dataset(cfg, tokenizer, 11) != build_dataset(cfg, tokenizer, 12)


def test_shared_prefix_structure(tokenizer):
    cfg = DatasetConfig(
        name="shared-prefix",
        num_prompts=24,
        shared_prefix_len=200,
        shared_prefix_question_len=20,
        shared_prefix_output_len=100,
        shared_prefix_output_range_ratio=0.6,
        num_groups=4,
    )
    requests = build_dataset(cfg, tokenizer, seed=5)
    assert Counter(r.group for r in requests) == {0: 6, 1: 6, 2: 6, 3: 6}
    prefixes = {r.group: r.system_prompt for r in requests}
    assert all(r.system_prompt == prefixes[r.group] for r in requests)
    assert len(set(prefixes.values())) == 4
    assert all(tokenizer.count(p) == 200 for p in prefixes.values())
    assert all(tokenizer.count(r.prompt) == 20 for r in requests)
    assert len({r.prompt for r in requests}) == 24
    assert all(r.num_prompt_tokens == tokenizer.count(r.completion_text()) for r in requests)
    outputs = [r.num_output_tokens for r in requests]
    assert min(outputs) >= 40 and max(outputs) <= 160 and len(set(outputs)) > 5
    assert [r.group for r in requests] != sorted(r.group for r in requests)  # groups interleave


def test_shared_prompts_stay_across_seeds_questions_do_not(tokenizer):
    """A sweep's points (and its warm-ups) use other seeds: same handbooks, other questions."""
    cfg = DatasetConfig(name="shared-prefix", num_prompts=6, shared_prefix_len=60, shared_prefix_question_len=10,
                        num_groups=3)
    first, second = build_dataset(cfg, tokenizer, seed=1), build_dataset(cfg, tokenizer, seed=2)
    assert {r.group: r.system_prompt for r in first} == {r.group: r.system_prompt for r in second}
    assert {r.prompt for r in first}.isdisjoint({r.prompt for r in second})
    other = build_dataset(replace(cfg, shared_prefix_seed=7), tokenizer, seed=1)
    assert {r.system_prompt for r in other}.isdisjoint({r.system_prompt for r in first})


def test_shared_prefix_completion_text_starts_with_the_prefix(tokenizer):
    cfg = DatasetConfig(name="shared-prefix", num_prompts=2, shared_prefix_len=50, num_groups=1)
    a, b = build_dataset(cfg, tokenizer, seed=0)
    prefix_ids = tokenizer.encode(a.system_prompt)
    assert tokenizer.encode(a.completion_text())[:50] == prefix_ids
    assert tokenizer.encode(b.completion_text())[:50] == prefix_ids


def test_synthetic_datasets_need_a_tokenizer():
    with pytest.raises(ValueError, match="--tokenizer"):
        build_dataset(random_cfg(), None, 0)


def write_sharegpt(path, conversations):
    path.write_text(json.dumps([{"id": str(i), "conversations": c} for i, c in enumerate(conversations)]))


def turn(prompt: str, reply: str) -> list[dict]:
    return [{"from": "human", "value": prompt}, {"from": "gpt", "value": reply}]


def test_sharegpt_uses_reply_length_and_filters_tiny_turns(tokenizer, tmp_path):
    path = tmp_path / "sg.json"
    long_reply = "The policy allows twenty days of paid leave per calendar year."
    write_sharegpt(path, [turn("How many leave days do I get per year?", long_reply), turn("Hi", "Hello"), []])
    cfg = DatasetConfig(name="sharegpt", num_prompts=10, path=str(path))
    (request,) = build_dataset(cfg, tokenizer, seed=0)
    assert request.prompt == "How many leave days do I get per year?"
    assert request.num_output_tokens == tokenizer.count(long_reply)
    assert request.num_prompt_tokens == tokenizer.count(request.prompt)


def test_sharegpt_jsonl_with_fixed_output_len_and_seeded_order(tmp_path):
    path = tmp_path / "sg.jsonl"
    lines = [json.dumps({"conversations": turn(f"question number {i}", "answer")}) for i in range(20)]
    path.write_text("\n".join(lines))
    cfg = DatasetConfig(name="sharegpt", num_prompts=5, path=str(path), sharegpt_output_len=33)
    first = build_dataset(cfg, None, seed=1)
    assert [r.num_output_tokens for r in first] == [33] * 5
    assert first == build_dataset(cfg, None, seed=1)
    assert [r.prompt for r in first] != [f"question number {i}" for i in range(5)]


def test_sharegpt_without_lengths_is_rejected(tmp_path):
    path = tmp_path / "sg.json"
    write_sharegpt(path, [turn("a question here", "an answer here")])
    with pytest.raises(ValueError, match="sharegpt-output-len"):
        build_dataset(DatasetConfig(name="sharegpt", num_prompts=1, path=str(path)), None, 0)


def test_custom_keeps_file_order_and_default_output_len(tokenizer, tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text('{"prompt": "first one", "output_tokens": 5}\n\n{"prompt": "second"}\n{"prompt": "third"}\n')
    cfg = DatasetConfig(name="custom", num_prompts=2, path=str(path), custom_output_len=9)
    requests = build_dataset(cfg, tokenizer, seed=0)
    assert [(r.prompt, r.num_output_tokens) for r in requests] == [("first one", 5), ("second", 9)]
    assert requests[0].num_prompt_tokens == tokenizer.count("first one")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"name": "sonnet"},
        {"name": "random", "num_prompts": 0},
        {"name": "custom"},
        {"name": "random", "random_range_ratio": 1.0},
    ],
)
def test_dataset_config_rejects_bad_flags(kwargs):
    with pytest.raises(ValueError):
        DatasetConfig(**({"num_prompts": 1} | kwargs))


def test_copy_heavy_prompts_hold_the_code_their_answer_repeats(tokenizer):
    cfg = DatasetConfig("copy-heavy", num_prompts=6, random_input_len=300, random_output_len=200)
    requests = build_dataset(cfg, tokenizer, seed=3)
    assert len({r.prompt for r in requests}) == 6 and all(r.num_output_tokens == 200 for r in requests)
    for request in requests:
        assert "```python\ndef update_" in request.prompt and "BUG: off by one" in request.prompt
        assert 150 < request.num_prompt_tokens < 600
    assert [r.prompt for r in build_dataset(cfg, tokenizer, seed=3)] == [r.prompt for r in requests]
