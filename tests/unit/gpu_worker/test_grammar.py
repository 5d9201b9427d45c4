"""Grammars on the worker with the default model's vocabulary: compile cache, matchers, bitmasks in the sampler."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch
from transformers import AutoTokenizer

from pagedserve.services.gpu_worker.grammar import RequestGrammar
from pagedserve.services.gpu_worker.grammar_mask import allows_any, build_grammar_mask
from pagedserve.services.gpu_worker.sampler import sample
from pagedserve.services.gpu_worker.sampling_batch import SamplingRow, build_sampling_batch
from pagedserve.shared.grammar_cache import GrammarCache, GrammarError, compact_json_in_tag
from pagedserve.shared.sampling_params import SamplingParams
from pagedserve.shared.structured_output import StructuredOutput, StructuredOutputKind

VOCAB = 49152
EOS = 2
PERSON = StructuredOutput(StructuredOutputKind.JSON_SCHEMA, json.dumps({
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"]}))
YES_NO = StructuredOutput(StructuredOutputKind.REGEX, "(yes|no)")
# about 1 s to compile with xgrammar 0.2.9 (a long bounded repetition in a pattern)
SLOW = StructuredOutput(StructuredOutputKind.JSON_SCHEMA, json.dumps({"type": "string", "pattern": "^[a-z]{3000}$"}))


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def cache(smollm2_dir):
    grammars = GrammarCache(str(smollm2_dir), VOCAB, (EOS,))
    yield grammars
    grammars.close()


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def allowed_ids(bitmask_row: torch.Tensor) -> set[int]:
    bits = ((bitmask_row[:, None] >> torch.arange(32, dtype=torch.int32)) & 1).flatten()[:VOCAB]
    return set(bits.nonzero().flatten().tolist())


def test_one_compile_per_key_and_refusals_are_grammar_errors(cache):
    first = cache.prepare(PERSON)
    assert cache.prepare(PERSON) is first  # under way or done: the same future
    assert cache.get(PERSON) is first.result()
    with pytest.raises(GrammarError, match="regex"):
        cache.get(StructuredOutput(StructuredOutputKind.REGEX, "a(b"))
    with pytest.raises(GrammarError, match="json_schema"):
        cache.get(StructuredOutput(StructuredOutputKind.JSON_SCHEMA, '{"type": "nonsense"}'))


def test_the_cache_keeps_within_its_byte_budget(smollm2_dir):
    grammars = GrammarCache(str(smollm2_dir), VOCAB, (EOS,), max_cached_bytes=1)
    try:
        for pattern in ("a+", "b+", "c+"):
            grammars.get(StructuredOutput(StructuredOutputKind.REGEX, pattern))
        assert grammars.num_cached == 1  # only the newest
    finally:
        grammars.close()


def test_masks_allow_exactly_what_the_grammar_allows(cache, tokenizer):
    grammar = RequestGrammar.start(cache.get(YES_NO), [])
    mask = build_grammar_mask([None, grammar], [(), ()], VOCAB, torch.device("cpu"))
    assert mask.rows == [1] and mask.bitmask[0].eq(-1).all()  # the free row is all ones
    allowed = allowed_ids(mask.bitmask[1])
    assert {encode(tokenizer, "yes")[0], encode(tokenizer, "no")[0]} <= allowed
    assert all(tokenizer.decode([t]) in ("y", "ye", "yes", "n", "no") for t in allowed)


def test_a_replayed_matcher_is_where_the_incremental_one_is(cache, tokenizer):
    """A preempted request's mirror is rebuilt from its outputs: same state, same next mask."""
    outputs = encode(tokenizer, '{"name": "Ann", "age": 4')
    incremental = RequestGrammar.start(cache.get(PERSON), [])
    for token_id in outputs:
        incremental.advance(token_id)
    replayed = RequestGrammar.start(cache.get(PERSON), outputs)
    masks = build_grammar_mask([incremental, replayed], [(), ()], VOCAB, torch.device("cpu"))
    assert torch.equal(masks.bitmask[0], masks.bitmask[1])
    assert encode(tokenizer, "}")[0] in allowed_ids(masks.bitmask[0])


def test_sampled_tokens_follow_the_grammar_greedy_and_random(cache, tokenizer):
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(0)) * 5
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.5, seed=3), SamplingParams(temperature=0.0),
              SamplingParams(temperature=1.5, seed=4)]
    grammars = [RequestGrammar.start(cache.get(PERSON), []), RequestGrammar.start(cache.get(PERSON), []), None, None]
    texts = ["", ""]
    for _ in range(40):
        rows = [SamplingRow(p, [1], [], (EOS,)) for p in params]
        mask = build_grammar_mask(grammars, [(), (), (), ()], VOCAB, torch.device("cpu"))
        if mask is None:
            break
        ids, _ = sample(logits.clone(), build_sampling_batch(rows, VOCAB, torch.device("cpu")), mask)
        for i in (0, 1):
            if grammars[i].constrains:
                grammars[i].advance(int(ids[i]))
                texts[i] += tokenizer.decode([int(ids[i])], skip_special_tokens=True)
        assert ids[2] == logits[2].argmax()  # unconstrained rows are untouched
    for grammar, text in zip(grammars[:2], texts, strict=True):  # random logits, yet the object's valid beginning
        assert not grammar.ended and text.startswith('{"name": "')


def test_a_grammar_that_can_only_end_while_eos_is_banned_stops_constraining(cache, tokenizer):
    grammar = RequestGrammar.start(cache.get(YES_NO), encode(tokenizer, "yes"))
    assert grammar.matcher.is_completed()
    mask = build_grammar_mask([grammar], [(EOS,)], VOCAB, torch.device("cpu"))  # ignore_eos / min_tokens
    assert mask is None and grammar.ended and not grammar.constrains
    fresh = RequestGrammar.start(cache.get(YES_NO), encode(tokenizer, "yes"))
    mask = build_grammar_mask([fresh], [()], VOCAB, torch.device("cpu"))
    assert allowed_ids(mask.bitmask[0]) == {EOS}  # EOS allowed: the request ends there


def test_allows_any_sees_past_the_banned_tokens():
    row = torch.zeros(VOCAB // 32, dtype=torch.int32)
    row[0] = 1 << EOS
    assert not allows_any(row, (EOS,), VOCAB) and allows_any(row, (5,), VOCAB)


def test_tool_json_in_structural_tags_is_compact(cache):
    tag = {"type": "structural_tag", "format": {"type": "tag", "begin": "<a>", "end": "</a>", "content": {
        "type": "json_schema", "json_schema": {"type": "object", "properties": {"x": {"type": "integer"}},
                                               "required": ["x"]}}}}
    spec = json.dumps(tag)
    assert json.loads(compact_json_in_tag(spec))["format"]["content"]["type"] == "grammar"
    compact = StructuredOutput(StructuredOutputKind.STRUCTURAL_TAG, spec)
    loose = StructuredOutput(StructuredOutputKind.STRUCTURAL_TAG, spec, any_whitespace=True)

    def accepts(structured: StructuredOutput, text: str) -> bool:
        matcher = RequestGrammar.start(cache.get(structured), []).matcher
        return matcher.accept_string(text) and matcher.is_completed()

    assert accepts(compact, '<a>{"x": 1}</a>') and not accepts(compact, '<a>{ "x": 1}</a>')
    assert accepts(loose, '<a>{ "x":  1}</a>')


def test_a_slow_compile_runs_beside_the_caller(smollm2_dir):
    """Compiles run on the grammar threads and release the GIL: a Python loop keeps its pace meanwhile."""
    grammars = GrammarCache(str(smollm2_dir), VOCAB, (EOS,))
    try:
        grammars.get(YES_NO)  # tokenizer loaded
        future = grammars.prepare(SLOW)
        start_s, num_rounds, longest_gap_s = time.perf_counter(), 0, 0.0
        while not future.done():
            before_s = time.perf_counter()
            sum(range(20_000))
            longest_gap_s = max(longest_gap_s, time.perf_counter() - before_s)
            num_rounds += 1
        compile_s = time.perf_counter() - start_s
        future.result()
        assert compile_s > 0.2, "the schema compiled too fast to show anything"
        assert num_rounds > 20 and threading.active_count() >= 2
        print(f"compile {compile_s:.2f} s, {num_rounds} rounds, longest round {longest_gap_s * 1000:.1f} ms")
    finally:
        grammars.close()
