"""``/v1/responses`` (vllm_inline.server.responses) over a real socket, read by the ``openai``
SDK's ``client.responses`` and by raw HTTP, on the suite's shared engines (scripted models):
text and message input, instructions, a function tool through ``function_call`` /
``function_call_output`` items and through ``previous_response_id``, reasoning items, structured
output, the stream's events in order with their sequence numbers, usage, ``GET`` and ``cancel``,
and bad input (a 400 or 404 naming the field, nothing stored). Every answer is compared with
the engine's own (``Engine.astream`` on the same messages). The store itself is tested in
tests/test_responses_store.py; vLLM's own server in tests/test_server_parity.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest
from serving import serving, sse_events

from vllm_inline.engine import Delta, Engine, start_engines
from vllm_inline.server import OpenAIServer
from vllm_inline.server.responses import SQLiteResponseStore

pytestmark = pytest.mark.engine

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a given city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
CHAT_WEATHER = {
    "type": "function",
    "function": {k: v for k, v in WEATHER.items() if k != "type"},
}
ASK = "What is the weather like in Oslo today?"


class App:
    def __init__(self, url: str, engines: dict[str, Engine], store: SQLiteResponseStore) -> None:
        self.url = url
        self.engines = engines
        self.store = store
        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

    def post(self, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(f"{self.url}/v1/responses", json=body, timeout=120)

    def events(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The SSE events of a streamed request, checked: ``event:`` names its data's type."""
        with httpx.stream(
            "POST", f"{self.url}/v1/responses", json={**body, "stream": True}, timeout=120
        ) as r:
            assert r.status_code == 200, r.read()
            return sse_events(r.iter_lines())


def engine_answer(engine: Engine, messages: list[dict[str, Any]], **kwargs: Any) -> list[Delta]:
    async def run() -> list[Delta]:
        return [d async for d in engine.astream(messages, **kwargs)]

    return asyncio.run(run())


@pytest.fixture(scope="module")
def app(scripted: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    from fastapi import FastAPI

    engines = {
        "llama3": scripted("llama3").engine,
        "tools": scripted("chatml_tools").engine,
        "reasoning": scripted("chatml_reasoning").engine,
    }
    # Started here, not by the server's lifespan, which would stop them with the module: they
    # are the suite's shared engines (stopped at the session's end).
    start_engines(*engines.values())
    store = SQLiteResponseStore(tmp_path_factory.mktemp("responses") / "store.sqlite3")
    server = OpenAIServer(
        chat=engines,
        responses_store=store,
        reasoning_parser={"reasoning": "qwen3"},
        tool_parser={"tools": "hermes"},
        enable_auto_tool_choice=True,
    )
    fastapi_app = FastAPI(lifespan=server.lifespan)
    server.install(fastapi_app)
    with serving(fastapi_app) as url:
        yield App(url, engines, store)


def test_text_input_answers_as_the_engine_does(app: App) -> None:
    expected = engine_answer(app.engines["llama3"], [{"role": "user", "content": "Hello"}])
    text = "".join(d.text for d in expected)
    response = app.client.responses.create(model="llama3", input="Hello")
    assert response.output_text == text == "The answer is complete."
    assert response.status == "completed" and response.object == "response"
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant"
    assert response.usage is not None
    assert response.usage.input_tokens == expected[-1].usage.prompt_tokens
    assert response.usage.output_tokens == expected[-1].usage.completion_tokens
    assert app.client.responses.retrieve(response.id).output_text == text


def test_streamed_events_in_order(app: App) -> None:
    events = app.events({"model": "llama3", "input": "Hello"})
    types = [e["type"] for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == "The answer is complete."
    final = events[-1]["response"]
    assert final["status"] == "completed"
    assert final["output"][0]["content"][0]["text"] == "The answer is complete."


def test_a_function_tool_loop_with_items_and_with_previous_response_id(app: App) -> None:
    """Turn 1 calls the tool; turn 2 sends the call and its output back as items (how the
    Agents SDK does it), or only the output with ``previous_response_id``: same answer, the
    engine's own on the same chat messages."""
    first = app.client.responses.create(model="tools", input=ASK, tools=[WEATHER])
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Oslo"} and call.call_id
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    by_items = app.client.responses.create(
        model="tools",
        tools=[WEATHER],
        input=[
            {"role": "user", "content": ASK},
            {"type": "function_call", "call_id": call.call_id, "name": call.name,
             "arguments": call.arguments},
            output,
        ],
    )  # fmt: skip
    by_id = app.client.responses.create(
        model="tools", tools=[WEATHER], previous_response_id=first.id, input=[output]
    )
    messages = [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.call_id, "type": "function",
             "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"},
    ]  # fmt: skip
    expected = "".join(
        d.text for d in engine_answer(app.engines["tools"], messages, tools=[CHAT_WEATHER])
    )
    assert by_items.output_text == by_id.output_text == expected == "The weather in Oslo is sunny."
    assert by_id.previous_response_id == first.id


def test_streamed_function_call_events(app: App) -> None:
    events = app.events({"model": "tools", "input": ASK, "tools": [WEATHER]})
    types = [e["type"] for e in events]
    assert types[2] == "response.output_item.added"
    assert events[2]["item"]["type"] == "function_call"
    assert events[2]["item"]["name"] == "get_weather"
    assert "response.function_call_arguments.delta" in types
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert json.loads(done["arguments"]) == {"city": "Oslo"}
    arguments = "".join(
        e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"
    )
    assert arguments == done["arguments"]
    assert types[-2:] == ["response.output_item.done", "response.completed"]
    assert events[-1]["response"]["output"][0]["arguments"] == done["arguments"]


def test_reasoning_items_from_the_reasoning_parser(app: App) -> None:
    expected = engine_answer(
        app.engines["reasoning"], [{"role": "user", "content": "Hi"}], reasoning_parser="qwen3"
    )
    response = app.client.responses.create(model="reasoning", input="Hi")
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and message.type == "message"
    assert reasoning.content is not None
    assert reasoning.content[0].text == "".join(d.reasoning for d in expected)
    assert reasoning.content[0].text.strip() == "Need to think"
    assert response.output_text == "".join(d.text for d in expected)
    assert response.output_text.strip() == "The answer is 42."
    assert response.usage is not None and response.usage.output_tokens_details.reasoning_tokens > 0
    events = app.events({"model": "reasoning", "input": "Hi"})
    said = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    assert said == reasoning.content[0].text
    assert [e["item"]["type"] for e in events if e["type"] == "response.output_item.done"] == [
        "reasoning",
        "message",
    ]
    # reasoning.effort "none" turns thinking off in the template, as vllm serve does.
    quiet = app.client.responses.create(model="reasoning", input="Hi", reasoning={"effort": "none"})
    assert [item.type for item in quiet.output] == ["message"]


def test_the_reasoning_parser_serves_the_chat_route_too(app: App) -> None:
    """As vllm serve's --reasoning-parser: the chat answer's reasoning is message.reasoning."""
    hi = [{"role": "user", "content": "Hi"}]
    expected = engine_answer(app.engines["reasoning"], hi, reasoning_parser="qwen3")
    body = {"model": "reasoning", "messages": hi}
    answer = httpx.post(f"{app.url}/v1/chat/completions", json=body, timeout=60).json()
    message = answer["choices"][0]["message"]
    assert message["reasoning"] == "".join(d.reasoning for d in expected)
    assert message["content"] == "".join(d.text for d in expected)
    plain = {"model": "llama3", "messages": hi}  # no parser for this one: the text as it is
    answer = httpx.post(f"{app.url}/v1/chat/completions", json=plain, timeout=60).json()
    assert answer["choices"][0]["message"]["content"] == "The answer is complete."


def test_instructions_and_message_items(app: App) -> None:
    input_items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello"}]}
    ]
    response = app.client.responses.create(
        model="llama3",
        instructions="Be brief.",
        input=input_items,  # type: ignore[arg-type]
    )
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    expected = engine_answer(app.engines["llama3"], messages)
    assert response.output_text == "".join(d.text for d in expected)
    assert response.instructions == "Be brief."
    assert response.usage is not None
    assert response.usage.input_tokens == expected[-1].usage.prompt_tokens


def test_structured_output_and_max_output_tokens(app: App) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    fmt = {"format": {"type": "json_schema", "name": "place", "schema": schema}}
    response = app.client.responses.create(
        model="llama3",
        input="Hello",
        text=fmt,
        max_output_tokens=8,
        temperature=0,  # type: ignore[arg-type]
    )
    expected = engine_answer(
        app.engines["llama3"], [{"role": "user", "content": "Hello"}],
        structured_outputs={"json": schema}, max_tokens=8, temperature=0,
    )  # fmt: skip
    assert response.output_text == "".join(d.text for d in expected)
    assert response.output_text.startswith("{")  # the constraint, not the script
    short = app.client.responses.create(model="llama3", input="Hello", max_output_tokens=3)
    assert short.status == "incomplete" and short.output_text == "The answer is"
    assert short.incomplete_details is not None
    assert short.incomplete_details.reason == "max_output_tokens"
    events = app.events({"model": "llama3", "input": "Hello", "max_output_tokens": 3})
    assert events[-1]["type"] == "response.incomplete"


def test_the_openai_sdk_stream_helper(app: App) -> None:
    with app.client.responses.stream(model="llama3", input="Hello") as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(texts) == final.output_text == "The answer is complete."


class _WithDeadline:
    """A shared engine whose every request has a deadline and a consumer that lags (a quarter
    second after each delta): the engine's own timeout then ends the stream after its first
    delta (RequestTimeoutError, the request aborted in vLLM), an engine error the route meets
    after the headers went out. A lagging consumer holds the request open on the engine loop
    (tests/test_engine_streaming.py), so the deadline passes however fast the host is."""

    def __init__(self, engine: Engine, timeout: float) -> None:
        self._engine = engine
        self._timeout = timeout

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def astream(self, *args: Any, **kwargs: Any) -> AsyncIterator[Delta]:
        async for delta in self._engine.astream(*args, timeout=self._timeout, **kwargs):
            yield delta
            await asyncio.sleep(0.25)


def test_an_engine_error_mid_stream_ends_with_response_failed(scripted: Any, tmp_path: Any) -> None:
    from fastapi import FastAPI

    engine = scripted("long").engine
    start_engines(engine)
    store = SQLiteResponseStore(tmp_path / "store.sqlite3")
    server = OpenAIServer(chat={"long": _WithDeadline(engine, 0.5)}, responses_store=store)
    fastapi_app = FastAPI()  # no lifespan: the engine is the suite's
    server.install(fastapi_app)
    with serving(fastapi_app) as url:
        events = App(url, {}, store).events(
            {"model": "long", "input": "Hello", "max_output_tokens": 400, "ignore_eos": True}
        )
    types = [e["type"] for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert "response.output_text.delta" in types  # it failed mid-stream, not before
    assert types[-1] == "response.failed" and "response.completed" not in types
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["id"] == events[0]["response"]["id"]
    assert failed["error"]["code"] == "server_error"  # a 504 had the headers not gone out
    assert "0.5" in failed["error"]["message"]  # the engine's message, naming the deadline
    assert store.get(failed["id"]) is None  # a failed response is not stored
    deadline = time.monotonic() + 10
    while engine.num_unfinished_requests() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.num_unfinished_requests() == 0  # the engine stopped generating it


def test_store_false_keeps_nothing(app: App) -> None:
    response = app.client.responses.create(model="llama3", input="Hello", store=False)
    assert app.store.get(response.id) is None
    with pytest.raises(openai.NotFoundError):
        app.client.responses.retrieve(response.id)


# -- bad input: a 400 or 404 naming the field, nothing stored ------------------------------

BAD = {
    "not JSON": (b"{", 400, "body"),
    "no input": ({"model": "llama3"}, 400, "body.input"),
    "input of the wrong type": ({"input": 3}, 400, "body.input"),
    "an item type not handled": (
        {"input": [{"type": "web_search_call", "id": "x", "status": "completed"}]},
        400,
        "body.input.0.type",
    ),
    "a message without a role": ({"input": [{"type": "message", "content": "x"}]}, 400,
                                 "body.input.0.role"),
    "an output for a call never made": (
        {"input": [{"type": "function_call_output", "call_id": "call_x", "output": "sunny"}]},
        400,
        "body.input",
    ),
    "an unknown previous response": ({"input": "Hi", "previous_response_id": "resp_nope"}, 404,
                                     "previous_response_id"),
    "a tool type OpenAI has not": ({"input": "Hi", "tools": [{"type": "nope"}]}, 400,
                                   "body.tools.0.type"),
    "a bad temperature": ({"input": "Hi", "temperature": 7}, 400, "temperature"),
    "a temperature that is no number": ({"input": "Hi", "temperature": "hot"}, 400,
                                        "temperature"),
    "reasoning that is no object": ({"input": "Hi", "reasoning": "high"}, 400, "body.reasoning"),
    "an unknown model": ({"input": "Hi", "model": "nope"}, 404, "model"),
    # As vLLM's request model: a 400, not an ignored field or a 404.
    "a request_id that is no string": ({"input": "Hi", "request_id": 5}, 400, "body.request_id"),
    "a previous_response_id that is no string": ({"input": "Hi", "previous_response_id": 5}, 400,
                                                 "body.previous_response_id"),
    "parallel_tool_calls that is no boolean": ({"input": "Hi", "parallel_tool_calls": "no"}, 400,
                                               "body.parallel_tool_calls"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_refused_naming_the_field_and_stores_nothing(app: App, case: str) -> None:
    body, status, param = BAD[case]
    before = app.store.total_bytes()
    if isinstance(body, bytes):
        answer = httpx.post(f"{app.url}/v1/responses", content=body, timeout=30)
    else:
        answer = app.post({"model": "llama3", **body})
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and error["code"] == status and error["message"]
    assert app.store.total_bytes() == before


def test_get_and_cancel(app: App) -> None:
    response = app.client.responses.create(model="llama3", input="Hello")
    got = httpx.get(f"{app.url}/v1/responses/{response.id}", timeout=30).json()
    assert got["id"] == response.id and got["output"][0]["content"][0]["text"]
    missing = httpx.get(f"{app.url}/v1/responses/resp_nope", timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "response_id"
    cancel = httpx.post(f"{app.url}/v1/responses/{response.id}/cancel", timeout=30)
    assert cancel.status_code == 400  # a finished response: vllm serve's rule
    cancel_missing = httpx.post(f"{app.url}/v1/responses/resp_nope/cancel", timeout=30)
    assert cancel_missing.status_code == 404
