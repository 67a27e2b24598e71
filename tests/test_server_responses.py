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
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from serving import serving

from vllm_inline.engine import Delta, Engine
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
        out = []
        with httpx.stream(
            "POST", f"{self.url}/v1/responses", json={**body, "stream": True}, timeout=120
        ) as r:
            assert r.status_code == 200, r.read()
            name = None
            for line in r.iter_lines():
                if line.startswith("event: "):
                    name = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    event = json.loads(line.removeprefix("data: "))
                    assert event["type"] == name
                    out.append(event)
        return out


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
    store = SQLiteResponseStore(tmp_path_factory.mktemp("responses") / "store.sqlite3")
    server = OpenAIServer(
        chat=engines, responses_store=store, reasoning_parser={"reasoning": "qwen3"}
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
