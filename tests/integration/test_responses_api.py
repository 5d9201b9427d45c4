"""The Responses API end to end with the official `openai` client: create, stream (the SDK's own accumulator) and
a stored turn continued by previous_response_id through the stack's Redis."""

from __future__ import annotations

import openai
import pytest

FRANCE = "What is the capital of France?"


def test_create_and_stream_give_the_same_greedy_answer(client, model_name):
    created = client.responses.create(model=model_name, input=FRANCE, max_output_tokens=16, temperature=0.0)
    assert created.status == "completed" and "Paris" in created.output_text
    assert created.usage.output_tokens > 0 and created.usage.total_tokens == (created.usage.input_tokens
                                                                              + created.usage.output_tokens)
    with client.responses.stream(model=model_name, input=FRANCE, max_output_tokens=16, temperature=0.0) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.output_text == "".join(deltas) == created.output_text
    assert final.usage.output_tokens == created.usage.output_tokens


def test_previous_response_id_continues_a_stored_conversation(client, model_name, stack):
    first = client.responses.create(model=model_name, input="My name is Ada. Say hello.", max_output_tokens=16,
                                    temperature=0.0, instructions="You are a helpful assistant.")
    second = client.responses.create(model=model_name, input="What is my name?", previous_response_id=first.id,
                                     max_output_tokens=16, temperature=0.0)
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens  # the earlier turn
    assert client.responses.retrieve(second.id).output_text == second.output_text
    redis = stack.redis.client()
    assert redis.exists(f"pagedserve:response:{second.id}") and 0 < redis.ttl(f"pagedserve:response:{second.id}")
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError, match="web_search"):
        client.responses.create(model=model_name, input="Search the web", tools=[{"type": "web_search"}])
