"""An agent framework's own tool loop against `pagedserve serve`: the OpenAI Agents SDK (PyPI `openai-agents`), its
chat-completions model class pointed at the server, runs a two-tool conversation to its final answer.

The default model (SmolLM2-135M) is too small to choose tools on its own, so the agent's model settings name the
tool each turn asks for (the grammar forces that call, with arguments matching the tool's strict schema) and then
tool_choice "none" lets it answer in text; the SDK's loop does the rest: it parses each call, runs the Python
function, sends the result back as a tool turn and calls the model again. A hook steers tool_choice turn by turn, as
an application that wants a fixed tool order would (the SDK's own reset_tool_choice only knows "once")."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any, Literal

from agents import Agent, AgentHooks, ModelSettings, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool
from openai import AsyncOpenAI

CITIES = Literal["Paris", "Tokyo", "Lima"]
PLAN = ["get_weather", "get_local_time", "none"]  # the tool_choice of each model turn, in order


@dataclasses.dataclass
class ToolRuns:
    calls: list[tuple[str, dict]] = dataclasses.field(default_factory=list)


RUNS = ToolRuns()


@function_tool
def get_weather(city: CITIES) -> str:
    """The current weather in a city."""
    RUNS.calls.append(("get_weather", {"city": city}))
    return json.dumps({"city": city, "sky": "sunny", "celsius": 21})


@function_tool
def get_local_time(city: CITIES) -> str:
    """The local time in a city."""
    RUNS.calls.append(("get_local_time", {"city": city}))
    return json.dumps({"city": city, "time": "14:05"})


class ToolOrder(AgentHooks[Any]):
    """After each tool ran, the next turn's tool_choice: the next tool of PLAN, then none (answer in text)."""

    def __init__(self) -> None:
        self.turns_planned = 1  # the agent starts with PLAN[0]

    async def on_tool_end(self, context, agent, tool, result) -> None:
        choice = PLAN[self.turns_planned]
        agent.model_settings = dataclasses.replace(agent.model_settings, tool_choice=choice)
        self.turns_planned += 1


def test_the_agents_sdk_runs_a_two_tool_conversation(stack, model_name):
    client = AsyncOpenAI(base_url=stack.base_url + "/v1", api_key="unused", max_retries=3, timeout=300)
    agent = Agent(
        name="travel helper", instructions="You help travellers. Use the tools, then answer in one sentence.",
        model=OpenAIChatCompletionsModel(model=model_name, openai_client=client),
        tools=[get_weather, get_local_time], hooks=ToolOrder(), reset_tool_choice=False,
        model_settings=ModelSettings(tool_choice=PLAN[0], temperature=0.0, max_tokens=60,
                                     parallel_tool_calls=False))
    RUNS.calls.clear()
    result = asyncio.run(Runner.run(agent, "What is the weather in Tokyo, and what time is it there?", max_turns=5,
                                    run_config=RunConfig(tracing_disabled=True)))

    assert [name for name, _ in RUNS.calls] == ["get_weather", "get_local_time"]  # each ran once, in order
    for _, arguments in RUNS.calls:
        assert arguments["city"] in ("Paris", "Tokyo", "Lima")  # parsed by the SDK against the tool's schema
    assert isinstance(result.final_output, str) and result.final_output.strip()
    items = [item.type for item in result.new_items]
    assert items == ["tool_call_item", "tool_call_output_item"] * 2 + ["message_output_item"], items
    assert len(result.raw_responses) == 3  # three model turns: two forced calls, one answer
    outputs = [item.output for item in result.new_items if item.type == "tool_call_output_item"]
    assert json.loads(outputs[0])["sky"] == "sunny" and json.loads(outputs[1])["time"] == "14:05"
    print("final answer:", result.final_output, "calls:", RUNS.calls)
