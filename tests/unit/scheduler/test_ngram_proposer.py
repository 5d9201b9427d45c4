"""Prompt-lookup drafts and the speculative config."""

from __future__ import annotations

import pytest

from pagedserve.services.scheduler.spec_decode.config import SpeculativeConfig
from pagedserve.services.scheduler.spec_decode.ngram_proposer import NgramProposer


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
