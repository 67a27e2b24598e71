"""Tools on the server as ``vllm serve`` handles them, on the suite's shared engines (scripted
models): calls parsed only with the parser the server was started with (``--tool-call-parser``
and ``--enable-auto-tool-choice``), otherwise an ``auto`` choice refused on chat completions
and the model's text back as text on ``/v1/responses`` (Codex's case: a Llama 3 model whose
tokenizer lacks ``<|python_tag|>``); custom and hosted tools on
``/v1/responses``; a parser that cannot start on the model's tokenizer refused at the server's
start; the command line's own checks. The pure conversions: tests/test_responses_tools.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from serving import serving, sse_events

from vllm_inline.engine import Engine, start_engines
from vllm_inline.server import OpenAIServer
from vllm_inline.server.responses import MemoryResponseStore

pytestmark = pytest.mark.engine

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a given city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CHAT_WEATHER = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
ASK = [{"role": "user", "content": "What is the weather like in Oslo today?"}]


def engine_text(engine: Engine, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    async def run() -> str:
        return "".join([d.text async for d in engine.astream(messages, **kwargs)])

    return asyncio.run(run())


@pytest.fixture(scope="module")
def app(scripted: Any) -> Iterator[tuple[str, dict[str, Engine]]]:
    from fastapi import FastAPI

    engines = {"tools": scripted("chatml_tools").engine, "llama3": scripted("llama3").engine}
    start_engines(*engines.values())  # the suite's shared engines: not the lifespan's to stop
    server = OpenAIServer(
        chat={
            "tools": engines["tools"],
            "no_parser": engines["tools"],
            "llama3": engines["llama3"],
        },
        tool_parser={"tools": "hermes"},
        enable_auto_tool_choice=True,
        responses_store=MemoryResponseStore(),
    )
    fastapi_app = FastAPI(lifespan=server.lifespan)
    server.install(fastapi_app)
    with serving(fastapi_app) as url:
        yield url, engines


@pytest.mark.parametrize("model", ["no_parser", "llama3"])
@pytest.mark.parametrize("stream", [False, True])
def test_without_the_server_s_tool_parser_the_answer_is_text(
    app: tuple[str, dict[str, Engine]], model: str, stream: bool
) -> None:
    """As vllm serve without --tool-call-parser: on chat completions an `auto` choice among
    tools is a 400 naming the options to start with, and `none` shows the tools and answers
    the text; on /v1/responses the answer is not parsed for calls (the `<tool_call>` markup
    comes back as the model wrote it)."""
    url, engines = app
    engine = engines["tools" if model == "no_parser" else "llama3"]
    expected = engine_text(engine, ASK, tools=[CHAT_WEATHER], tool_choice="none")
    assert expected and ("<tool_call>" in expected) == (model == "no_parser")
    body = {"model": model, "messages": ASK, "tools": [CHAT_WEATHER], "stream": stream}
    refused = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == "tool_choice" and "--tool-call-parser" in error["message"]
    body["tool_choice"] = "none"
    if stream:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as r:
            chunks = [json.loads(e[6:]) for e in r.iter_lines() if e.startswith("data: {")]
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        assert not any(d.get("tool_calls") for d in deltas)
        assert "".join(d.get("content") or "" for d in deltas) == expected
    else:
        answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()
        message = answer["choices"][0]["message"]
        assert message["content"] == expected and not message.get("tool_calls")
        assert answer["choices"][0]["finish_reason"] == "stop"
    responses = {"model": model, "input": ASK, "tools": [WEATHER, {"type": "web_search"}]}
    answer = httpx.post(f"{url}/v1/responses", json=responses, timeout=60).json()
    assert [item["type"] for item in answer["output"]] == ["message"]
    assert answer["output"][0]["content"][0]["text"] == expected


def test_a_custom_tool_call_and_its_output_with_hosted_tools_dropped(
    app: tuple[str, dict[str, Engine]],
) -> None:
    """The scripted model calls `get_weather`: served as a custom tool (Codex's apply_patch
    kind), the call is a custom_tool_call whose input is what the model wrote; its output
    continues the conversation to the engine's own answer."""
    url, engines = app
    tools = [{"type": "web_search"}, {"type": "custom", "name": "get_weather"},
             {"type": "namespace", "name": "files", "tools": [WEATHER]}]  # fmt: skip
    body = {"model": "tools", "input": ASK, "tools": tools}
    with httpx.stream("POST", f"{url}/v1/responses", json={**body, "stream": True}) as r:
        events = sse_events(r.iter_lines())
    whole = httpx.post(f"{url}/v1/responses", json=body, timeout=60).json()
    (call,) = whole["output"]
    assert call["type"] == "custom_tool_call" and call["name"] == "get_weather"
    assert json.loads(call["input"]) == {"city": "Oslo"}  # no `input` key: passed through
    done = [e for e in events if e["type"] == "response.custom_tool_call_input.done"]
    assert [e["input"] for e in done] == [call["input"]]
    follow = {"model": "tools", "tools": tools, "input": [
        *ASK, call, {"type": "custom_tool_call_output", "call_id": call["call_id"],
                     "output": "sunny"}]}  # fmt: skip
    answer = httpx.post(f"{url}/v1/responses", json=follow, timeout=60).json()
    shim = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"input": {"type": "string", "description":
            "The freeform text payload for this tool."}}, "required": ["input"],
        "additionalProperties": False}}}  # fmt: skip
    flat = {
        "type": "function",
        "function": {**CHAT_WEATHER["function"], "name": "files__get_weather"},
    }
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call["call_id"], "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"input": call["input"]})}}]},
        {"role": "tool", "tool_call_id": call["call_id"], "content": "sunny"}]  # fmt: skip
    expected = engine_text(engines["tools"], messages, tools=[shim, flat], tool_parser="hermes")
    assert answer["output"][-1]["content"][0]["text"] == expected == "The weather in Oslo is sunny."


def test_a_tool_parser_the_tokenizer_cannot_serve_is_refused_at_start(
    app: tuple[str, dict[str, Engine]],
) -> None:
    from fastapi import FastAPI

    _, engines = app
    server = OpenAIServer(
        chat=engines["llama3"], tool_parser="mistral", enable_auto_tool_choice=True
    )

    async def start() -> None:
        async with server.lifespan(FastAPI()):
            pass

    with pytest.raises(ValueError, match="tool_parser 'mistral' cannot start on the tokenizer"):
        asyncio.run(start())
    assert engines["llama3"].started  # a shared engine: left running for its other users
    with pytest.raises(ValueError, match="enable_auto_tool_choice needs tool_parser"):
        OpenAIServer(chat=engines["llama3"], enable_auto_tool_choice=True)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--enable-auto-tool-choice"], "--enable-auto-tool-choice requires --tool-call-parser"),
        (["a/model", "--model", "b/model"], "the model is given twice"),
        (["--tool-parser-plugin", "/no/such/plugin.py"], "--tool-parser-plugin"),
        (["--tool-call-parsr", "hermes"], "unrecognized arguments: --tool-call-parsr"),
    ],
)
def test_the_command_line_is_checked_before_anything_starts(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from vllm_inline.cli import main

    with pytest.raises(SystemExit) as raised:
        main(["serve", *argv])
    assert raised.value.code == 2 and message in capsys.readouterr().err
