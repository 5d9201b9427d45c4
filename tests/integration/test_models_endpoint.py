"""The official `openai` client's model calls against the real stack: list and retrieve agree, `created` is real."""

from __future__ import annotations

import time

import openai
import pytest


def test_openai_client_lists_and_retrieves_the_model(client: openai.OpenAI, model_name: str) -> None:
    listed = client.models.list().data
    retrieved = client.models.retrieve(model_name)
    assert [model.id for model in listed] == [model_name] and retrieved.id == model_name
    assert retrieved.created == listed[0].created and 1_700_000_000 < retrieved.created <= time.time()
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
