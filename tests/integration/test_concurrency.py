"""16 concurrent streamed greedy requests all complete, each identical to its solo run (or a batching near-tie)."""

from __future__ import annotations

import asyncio

from openai import AsyncOpenAI

QUESTIONS = ["What is the capital of France?", "Name a large animal.", "What is 2 + 2?", "Say hello in Spanish.",
             "What color is the sky?", "Name a planet.", "What is water made of?", "Who wrote Hamlet?",
             "What is the opposite of hot?", "Name a fruit.", "How many legs does a spider have?",
             "What is the largest ocean?", "Name a programming language.", "What do bees make?",
             "What is the freezing point of water?", "Name a musical instrument."]
MAX_TOKENS = 16
TOP_N = 5


async def run(client: AsyncOpenAI, model: str, question: str) -> list[tuple[str, set[str]]]:
    """(token, top-5 tokens) per generated token of a streamed greedy chat request."""
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": question}], max_tokens=MAX_TOKENS, temperature=0.0,
        logprobs=True, top_logprobs=TOP_N, stream=True)
    tokens, finish = [], None
    async for chunk in stream:
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for entry in (choice.logprobs.content if choice.logprobs else []) or []:
            tokens.append((entry.token, {alt.token for alt in entry.top_logprobs}))
    assert finish in ("stop", "length"), f"{question!r} did not finish: {finish}"
    return tokens


def compare(solo: list[tuple[str, set[str]]], batched: list[tuple[str, set[str]]]) -> str:
    """'identical', or 'near-tie at token i' when both sides' tokens are in each other's top-5 there."""
    for i, ((solo_token, solo_top), (batched_token, batched_top)) in enumerate(zip(solo, batched, strict=False)):
        if solo_token != batched_token:
            assert solo_token in batched_top and batched_token in solo_top, (
                f"token {i}: solo {solo_token!r} vs batched {batched_token!r} is not a near-tie")
            return f"near-tie at token {i}"
    assert len(solo) == len(batched), "same tokens but different lengths"
    return "identical"


def test_sixteen_concurrent_streams_match_their_solo_runs(stack, model_name, record_property):
    async def main() -> tuple[list, list]:
        client = AsyncOpenAI(base_url=stack.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)
        solo = [await run(client, model_name, q) for q in QUESTIONS]
        batched = await asyncio.gather(*(run(client, model_name, q) for q in QUESTIONS))
        await client.close()
        return solo, batched

    solo, batched = asyncio.run(main())
    outcomes = [compare(s, b) for s, b in zip(solo, batched, strict=True)]
    summary = f"{outcomes.count('identical')}/16 identical; " + "; ".join(
        f"{q!r}: {o}" for q, o in zip(QUESTIONS, outcomes, strict=True) if o != "identical")
    record_property("batching_outcome", summary)
    print(f"\nconcurrency: {summary}")
    assert all(tokens for tokens in batched)
