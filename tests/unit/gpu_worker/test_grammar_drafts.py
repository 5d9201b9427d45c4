"""Grammar masks for draft verification (the default model's vocabulary): row j is masked with the grammar state
after the drafts before it, a draft the grammar refuses ends the walk, and settling leaves the matcher exactly
where feeding the emitted tokens one step at a time would."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer

from pagedserve.services.gpu_worker.grammar import RequestGrammar
from pagedserve.services.gpu_worker.spec_decode.grammar_drafts import walk
from pagedserve.shared.grammar_cache import GrammarCache
from pagedserve.shared.structured_output import StructuredOutput, StructuredOutputKind

VOCAB = 49152
EOS = 2
PERSON = StructuredOutput(StructuredOutputKind.JSON_SCHEMA, json.dumps({
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"]}))
TEXT = '{"name": "Al", "age": 31}'


@pytest.fixture(scope="module")
def compiled(smollm2_dir):
    grammars = GrammarCache(str(smollm2_dir), VOCAB, (EOS,))
    yield grammars.get(PERSON)
    grammars.close()


@pytest.fixture(scope="module")
def ids(smollm2_dir) -> list[int]:
    return AutoTokenizer.from_pretrained(smollm2_dir).encode(TEXT, add_special_tokens=False)


def mask_after(compiled, tokens: list[int]) -> torch.Tensor:
    """The next-token bitmask of a fresh matcher fed `tokens` one by one."""
    import xgrammar as xgr

    grammar = RequestGrammar.start(compiled, tokens)
    bitmask = xgr.allocate_token_bitmask(1, VOCAB)
    grammar.matcher.fill_next_token_bitmask(bitmask, 0)
    return bitmask[0]


def test_rows_follow_the_drafts_and_a_refused_draft_ends_the_walk(compiled, ids):
    outputs, refused = ids[:6], 75  # '{"name": "Al",' then ' "', 'age', and '[' where '":' must come
    drafts = [ids[6], ids[7], refused, ids[9]]
    grammar = RequestGrammar.start(compiled, outputs)
    mask, walks = walk([grammar], [drafts], [()] * 5, VOCAB, torch.device("cpu"))
    assert mask is not None and mask.rows == [0, 1, 2]  # rows after the refused draft are not constrained
    for j in range(3):
        assert torch.equal(mask.bitmask[j], mask_after(compiled, outputs + drafts[:j])), j
    logits = torch.zeros(5, VOCAB)
    mask.apply(logits)
    assert logits[2, refused] == float("-inf") and logits[2, ids[8]] == 0.0
    state = walks[0]
    assert state is not None and state.num_fed == 2
    state.settle([ids[6], ids[7], ids[8]])  # two drafts accepted, then the replacement sampled on row 2
    assert torch.equal(mask_after(compiled, ids[:9]), _next_mask(grammar))


def test_settling_rolls_back_every_draft_past_the_emitted_ones(compiled, ids):
    grammar = RequestGrammar.start(compiled, ids[:6])
    _, walks = walk([grammar, None], [ids[6:10], [5, 6]], [()] * 8, VOCAB, torch.device("cpu"))
    assert walks[1] is None and walks[0] is not None and walks[0].num_fed == 4
    other = next(t for t in _allowed(mask_after(compiled, ids[:7])) if t != ids[7])
    walks[0].settle([ids[6], other])  # one draft accepted, the second rejected and replaced by another key token
    assert torch.equal(mask_after(compiled, [*ids[:7], other]), _next_mask(grammar))
    assert grammar.constrains and not grammar.ended


def _next_mask(grammar: RequestGrammar) -> torch.Tensor:
    import xgrammar as xgr

    bitmask = xgr.allocate_token_bitmask(1, VOCAB)
    grammar.matcher.fill_next_token_bitmask(bitmask, 0)
    return bitmask[0]


def _allowed(bitmask_row: torch.Tensor) -> list[int]:
    bits = ((bitmask_row[:, None] >> torch.arange(32, dtype=torch.int32)) & 1).flatten()[:VOCAB]
    return bits.nonzero().flatten().tolist()
