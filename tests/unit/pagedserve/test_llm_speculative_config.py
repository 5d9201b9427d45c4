"""The offline LLM gives one speculative config to both the scheduler (which plans draft positions) and the worker
(which loads the draft model it names)."""

from __future__ import annotations

import json

import pytest

from pagedserve.llm import with_speculative_config
from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from pagedserve.services.scheduler.scheduler_config import SchedulerConfig

DRAFT = json.dumps({"method": "draft_model", "model": "models/draft", "num_speculative_tokens": 3})
NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 2})


def test_either_config_or_the_argument_reaches_both():
    for worker, scheduler, text in ((DRAFT, "", ""), ("", DRAFT, ""), ("", "", DRAFT), (NGRAM, NGRAM, DRAFT)):
        w, s = with_speculative_config(WorkerConfig(model_dir="m", speculative_config=worker),
                                       SchedulerConfig(speculative_config=scheduler), text)
        assert w.speculative_config == s.speculative_config == DRAFT
        assert w.draft_model_dir == "models/draft"
    w, s = with_speculative_config(WorkerConfig(model_dir="m"), SchedulerConfig())
    assert (w.speculative_config, s.speculative_config, w.draft_model_dir) == ("", "", None)


def test_two_different_configs_are_refused():
    with pytest.raises(ValueError, match="differ"):
        with_speculative_config(WorkerConfig(model_dir="m", speculative_config=NGRAM),
                                SchedulerConfig(speculative_config=DRAFT))
    with pytest.raises(ValueError, match="tensor parallelism"):
        WorkerConfig(model_dir="m", speculative_config=DRAFT, tensor_parallel_size=2)
