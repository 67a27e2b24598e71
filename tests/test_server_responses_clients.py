"""Clients nobody here wrote, speaking the Responses API to ``vllm_inline.server``: the OpenAI
Agents SDK with its default Responses model running a function tool to the end (run and
streamed), LangChain's ``ChatOpenAI(use_responses_api=True)`` (streaming, tools, reasoning) and
LlamaIndex's ``OpenAIResponses`` with ``track_previous_responses=True`` over two turns. Each
answer is compared with the engine's own (``Engine.astream`` on the same messages). The same
LlamaIndex conversation on the two workers of ``serve --workers 2`` is in
tests/test_server_responses_workers.py.

One server holds three of the suite's engines (scripted models): ``llama3`` (a known answer),
``tools`` (calls ``get_weather``, then answers from its result), ``reasoning`` (a ``<think>``
block, read by the ``qwen3`` reasoning parser).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from serving import serving

from vllm_inline.engine import Engine, start_engines
from vllm_inline.server import OpenAIServer
from vllm_inline.server.responses import MemoryResponseStore

pytestmark = pytest.mark.engine

ASK = "What is the weather like in Oslo today?"
HELLO = [{"role": "user", "content": "Hello"}]


class App:
    def __init__(self, url: str, engines: dict[str, Engine]) -> None:
        self.url = url
        self.engines = engines

    def aclient(self) -> openai.AsyncOpenAI:
        """A new async client (one per event loop: its connections belong to the loop)."""
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)

    def answer(self, name: str, messages: list[dict[str, Any]], **kwargs: Any) -> tuple[str, str]:
        """The engine's own ``(text, reasoning)`` for ``messages``."""

        async def run() -> tuple[str, str]:
            deltas = [d async for d in self.engines[name].astream(messages, **kwargs)]
            return "".join(d.text for d in deltas), "".join(d.reasoning for d in deltas)

        return asyncio.run(run())


@pytest.fixture(scope="module")
def app(scripted: Any) -> Iterator[App]:
    from fastapi import FastAPI

    engines = {
        "llama3": scripted("llama3").engine,
        "tools": scripted("chatml_tools").engine,
        "reasoning": scripted("chatml_reasoning").engine,
    }
    # Started here, not by the server's lifespan, which would stop them with the module: they
    # are the suite's shared engines (stopped at the session's end).
    start_engines(*engines.values())
    server = OpenAIServer(
        chat=engines,
        responses_store=MemoryResponseStore(),  # one process: nothing on disk
        reasoning_parser={"reasoning": "qwen3"},
        tool_parser={"tools": "hermes"},
        enable_auto_tool_choice=True,
    )
    fastapi_app = FastAPI(lifespan=server.lifespan)
    server.install(fastapi_app)
    with serving(fastapi_app) as url:
        yield App(url, engines)


def after_the_tool(call_id: str, arguments: str, result: str) -> list[dict[str, Any]]:
    call = {"id": call_id, "type": "function",
            "function": {"name": "get_weather", "arguments": arguments}}  # fmt: skip
    return [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": result},
    ]


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_openai_agents_sdk_runs_a_tool_to_the_end(app: App, streamed: bool) -> None:
    from agents import Agent, RunConfig, Runner, function_tool, set_tracing_disabled
    from agents.items import ToolCallItem
    from agents.models.openai_provider import OpenAIProvider

    set_tracing_disabled(True)  # its traces would go to OpenAI's servers
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        calls.append(city)
        return f"It is sunny in {city}."

    # The SDK's default model for a name: OpenAIResponsesModel, on our server.
    provider = OpenAIProvider(openai_client=app.aclient(), use_responses=True)
    config = RunConfig(model_provider=provider, tracing_disabled=True)
    agent = Agent(name="weather", instructions="", model="tools", tools=[get_weather])

    async def run() -> Any:
        if not streamed:
            return await Runner.run(agent, ASK, run_config=config)
        result = Runner.run_streamed(agent, ASK, run_config=config)
        async for _ in result.stream_events():
            pass
        return result

    result = asyncio.run(run())
    assert calls == ["Oslo"]
    (call,) = [item.raw_item for item in result.new_items if isinstance(item, ToolCallItem)]
    messages = after_the_tool(call.call_id, call.arguments, "It is sunny in Oslo.")
    expected, _ = app.answer("tools", messages, tools=[WEATHER_CHAT])
    assert result.final_output == expected == "The weather in Oslo is sunny."


def test_openai_agents_sdk_chains_turns_through_the_store(app: App) -> None:
    """``auto_previous_response_id``: each turn sends only its new items and names the last
    response; the store holds the rest, the tool call and its output included."""
    from agents import Agent, RunConfig, Runner, function_tool
    from agents.models.openai_provider import OpenAIProvider

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return f"It is sunny in {city}."

    provider = OpenAIProvider(openai_client=app.aclient(), use_responses=True)
    config = RunConfig(model_provider=provider, tracing_disabled=True)
    agent = Agent(name="weather", instructions="", model="tools", tools=[get_weather])

    async def run() -> tuple[Any, Any]:
        first = await Runner.run(agent, ASK, run_config=config, auto_previous_response_id=True)
        second = await Runner.run(
            agent, "And tomorrow?", run_config=config,
            previous_response_id=first.last_response_id, auto_previous_response_id=True,
        )  # fmt: skip
        return first, second

    first, second = asyncio.run(run())
    history = [item.to_input_item() for item in first.new_items]
    call = next(i for i in history if i.get("type") == "function_call")
    messages = [
        *after_the_tool(call["call_id"], call["arguments"], "It is sunny in Oslo."),
        {"role": "assistant", "content": first.final_output},
        {"role": "user", "content": "And tomorrow?"},
    ]
    expected, _ = app.answer("tools", messages, tools=[WEATHER_CHAT])
    assert first.final_output == "The weather in Oslo is sunny."
    assert second.final_output == expected
    # The stored conversation held the tool's result: no second call (this model calls the tool
    # whenever no result is in its prompt).
    assert not [i for i in second.new_items if i.type == "tool_call_item"]
    assert [i.type for i in first.new_items].count("tool_call_item") == 1


WEATHER_CHAT = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def test_chat_openai_with_the_responses_api(app: App) -> None:
    from langchain_core.messages import ToolMessage
    from langchain_openai import ChatOpenAI

    def llm(model: str, **kwargs: Any) -> ChatOpenAI:
        return ChatOpenAI(
            model=model, base_url=f"{app.url}/v1", api_key="unused", max_retries=0,
            use_responses_api=True, **kwargs,
        )  # fmt: skip

    expected, _ = app.answer("llama3", HELLO)
    assert llm("llama3").invoke("Hello").text == expected
    chunks = list(llm("llama3", streaming=True).stream("Hello"))
    assert "".join(c.text for c in chunks) == expected and len(chunks) > 3
    assert chunks[-1].usage_metadata is not None

    tools = llm("tools").bind_tools([WEATHER_CHAT])
    called = tools.invoke(ASK)
    (call,) = called.tool_calls
    assert call["name"] == "get_weather" and call["args"] == {"city": "Oslo"}
    streamed = None
    for chunk in tools.stream(ASK):
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed is not None and streamed.tool_calls[0]["args"] == {"city": "Oslo"}
    result = ToolMessage("It is sunny in Oslo.", tool_call_id=call["id"])
    answer = tools.invoke([("user", ASK), called, result])
    # ChatOpenAI sends the call back with its arguments as it parsed them, dumped again.
    messages = after_the_tool(call["id"], json.dumps(call["args"]), "It is sunny in Oslo.")
    expected_after, _ = app.answer("tools", messages, tools=[WEATHER_CHAT])
    assert answer.text == expected_after

    text, reasoning = app.answer("reasoning", [{"role": "user", "content": "Hi"}],
                                 reasoning_parser="qwen3")  # fmt: skip
    thought = llm("reasoning", output_version="responses/v1").invoke("Hi")
    blocks = [b for b in thought.content if isinstance(b, dict) and b.get("type") == "reasoning"]
    assert [part["text"] for part in blocks[0]["content"]] == [reasoning]
    assert thought.text == text


def test_llama_index_openai_responses_tracks_previous_responses(app: App) -> None:
    from llama_index.core.llms import ChatMessage
    from llama_index.llms.openai import OpenAIResponses

    llm = OpenAIResponses(
        model="llama3", api_base=f"{app.url}/v1", api_key="unused", context_window=512,
        track_previous_responses=True, max_retries=0,
    )  # fmt: skip
    first = llm.chat([ChatMessage(role="user", content="Hello")])
    second = llm.chat([ChatMessage(role="user", content="And again?")])
    # The second turn named the first (it sent only its new message, the store held the rest).
    assert second.raw.previous_response_id == first.raw.id
    expected_1, _ = app.answer("llama3", HELLO)
    expected_2, _ = app.answer(
        "llama3",
        [*HELLO, {"role": "assistant", "content": expected_1},
         {"role": "user", "content": "And again?"}],
    )  # fmt: skip
    assert first.message.content == expected_1
    assert second.message.content == expected_2
    streamed = "".join(
        r.delta or "" for r in llm.stream_chat([ChatMessage(role="user", content="More?")])
    )
    assert streamed == expected_2
