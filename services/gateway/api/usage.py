"""A response's token usage, as OpenAI reports it: prompts counted once each, with their cached tokens."""

from __future__ import annotations

from pagedserve.services.gateway.api.generation import ChoiceDelta, ChoiceResult


class UsageTracker:
    """Usage of a response: prompts counted once each (with the cached tokens of their first choice)."""

    def __init__(self) -> None:
        self._last: dict[int, ChoiceDelta] = {}

    def add(self, delta: ChoiceDelta) -> None:
        self._last[delta.index] = delta

    def usage(self) -> dict:
        first_of_prompt: dict[int, ChoiceDelta] = {}
        for index in sorted(self._last):
            first_of_prompt.setdefault(self._last[index].prompt_index, self._last[index])
        num_prompt = sum(d.num_prompt_tokens for d in first_of_prompt.values())
        num_output = sum(d.num_output_tokens for d in self._last.values())
        return {"prompt_tokens": num_prompt, "completion_tokens": num_output, "total_tokens": num_prompt + num_output,
                "prompt_tokens_details": {"cached_tokens": sum(d.num_cached_tokens for d in first_of_prompt.values())}}


def usage_of(results: list[ChoiceResult]) -> dict:
    tracker = UsageTracker()
    for r in results:
        tracker.add(ChoiceDelta(r.index, r.prompt_index, "", [], r.finish_reason, r.num_prompt_tokens,
                                r.num_cached_tokens, r.num_output_tokens))
    return tracker.usage()
