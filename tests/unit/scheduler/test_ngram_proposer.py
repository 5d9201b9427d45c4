"""Prompt-lookup drafts and the speculative config."""

from __future__ import annotations

import pytest

from pagedserve.services.scheduler.spec_decode.ngram_proposer import NgramProposer
from pagedserve.shared.speculative_config import SpeculativeConfig


def test_drafts_continue_the_latest_earlier_occurrence_of_the_longest_tail():
    proposer = NgramProposer(min_n=1, max_n=3)
    tokens = [7, 8, 9, 1, 2, 5, 8, 9, 3, 4, 0, 8, 9]
    assert proposer.propose(tokens, 3) == [3, 4, 0]  # "8 9" last occurred before 3 4 0
    assert proposer.propose(tokens, 1) == [3]
    assert proposer.propose([1, 2, 3, 4], 3) == []  # nothing recurs
    assert NgramProposer(min_n=2, max_n=3).propose([5, 1, 6, 2, 1], 2) == []  # "1" recurs but 2-grams do not


def test_config_takes_vllms_json_and_refuses_what_it_cannot_do():
    config = SpeculativeConfig.from_json(
        '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2, "prompt_lookup_max": 4}')
    assert (config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max) == (5, 2, 4)
    assert SpeculativeConfig.from_json("") is None
    for bad in ('{"method": "draft_model", "num_speculative_tokens": 3}', '{"num_speculative_tokens": 99}',
                '{"prompt_lookup_min": 5, "prompt_lookup_max": 2}', '{"lookup": 1}', "[1]", "{"):
        with pytest.raises(ValueError):
            SpeculativeConfig.from_json(bad)


def test_config_takes_a_draft_model_and_refuses_it_without_its_folder():
    config = SpeculativeConfig.from_json(
        '{"method": "draft_model", "model": "/m/draft", "num_speculative_tokens": 3, "disable_by_batch_size": 4}')
    assert (config.method, config.model, config.num_speculative_tokens, config.disable_by_batch_size) == (
        "draft_model", "/m/draft", 3, 4)
    assert config.uses_draft_model
    assert SpeculativeConfig.from_json('{"model": "/m/draft"}').method == "draft_model"  # vLLM infers it
    for bad, says in (('{"method": "draft_model"}', "needs \"model\""),
                      ('{"method": "eagle", "model": "/m/e"}', "not supported"),
                      ('{"method": "ngram", "model": "/m/draft"}', "is for method"),
                      ('{"method": "draft_model", "model": 3}', "must be a string"),
                      ('{"method": "draft_model", "model": "/m", "num_speculative_tokens": 0}', "num_speculative")):
        with pytest.raises(ValueError, match=says):
            SpeculativeConfig.from_json(bad)
