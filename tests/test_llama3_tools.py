"""Llama 3.1's JSON tool calls through the engine, ``ChatVLLM`` and ``VLLM``.

The scripted ``llama3_tools`` model answers a question with ``<|python_tag|>`` and then
``{"name": "get_weather", "parameters": {"city": "Oslo"}}`` (split inside the arguments), which
``llama3_json`` (the llama3 family's default tool parser) turns into a call. vLLM 0.34 replaced
that parser: the new one needs special tokens kept in the text (``<|python_tag|>`` is one) and
sends a call's arguments whole once the call ends, where 0.30-0.33's streamed them in fragments.
What each release does is read from its source (``LLAMA3_JSON`` in ``tests/vllm_contract.py``,
checked by ``test_llama3_json_is_as_expected`` on every tree ``make check-vllm`` is given); these
tests hold the installed release to it, and hold the user's result to the same on both: the
same call, the same empty text, no special token in it whatever ``skip_special_tokens`` says.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.tools import tool
from llama_index.core.tools import FunctionTool
from tool_schemas import WEATHER
from vllm_contract import llama3_json

from vllm_inline.engine.seam.versions import installed_vllm
from vllm_inline.integrations.langchain import ChatVLLM
from vllm_inline.integrations.llama_index import VLLM

pytestmark = pytest.mark.engine

USER = [{"role": "user", "content": "What is the weather in Oslo?"}]
QUESTION = USER[0]["content"]
SKIP = [{}, {"skip_special_tokens": False}, {"skip_special_tokens": True}]
SKIP_IDS = ["default", "keep-specials", "skip-specials"]
PYTHON_TAG = "<|python_tag|>"


def expected() -> Any:
    found = installed_vllm()
    assert found is not None
    return llama3_json(found[1])


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return f"It is sunny in {city}."


@pytest.mark.parametrize("skip", SKIP, ids=SKIP_IDS)
def test_the_call_streams_with_no_text(scripted: Any, skip: dict[str, Any]) -> None:
    s = scripted("llama3_tools")
    assert s.scenario.tool_parser == "llama3_json"  # the family's default: not passed below
    deltas = list(s.engine.stream(USER, tools=[WEATHER], **skip))
    fragments = [f for d in deltas for f in d.tool_calls]
    name, arguments = s.scenario.tool_call
    assert fragments[0].name == name and fragments[0].id  # the name first, with the call's id
    assert {f.index for f in fragments} == {0}
    pieces = [f.arguments for f in fragments if f.arguments]
    assert json.loads("".join(pieces)) == json.loads(arguments)
    # 0.30-0.33: the arguments as they grow; 0.34: whole, when the call ends
    assert (len(pieces) > 1) == expected().arguments_in_fragments, pieces
    assert "".join(d.text for d in deltas) == ""  # neither <|python_tag|> nor the JSON
    assert deltas[-1].finish_reason == "tool_calls"
    (whole,) = list(s.engine.stream(USER, tools=[WEATHER], stream=False, **skip))
    assert [(c.name, json.loads(c.arguments)) for c in whole.tool_calls] == [
        (name, json.loads(arguments))
    ]
    assert whole.text == "" and whole.finish_reason == "tool_calls"


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "final-only"])
def test_special_tokens_a_parser_needs_stay_out_of_the_callers_text(
    scripted: Any, stream: bool
) -> None:
    # hermes needs skip_special_tokens=False, as 0.34's llama3_json does, and finds no
    # <tool_call> here: the whole output is text. The engine kept <|python_tag|> for the
    # parser; the caller sees it only when it asked for special tokens.
    s = scripted("llama3_tools")

    def text(**skip: Any) -> str:
        deltas = s.engine.stream(USER, tools=[WEATHER], tool_parser="hermes", stream=stream, **skip)
        return "".join(d.text for d in deltas)

    assert text() == text(skip_special_tokens=True) == s.scenario.answer
    assert PYTHON_TAG not in s.scenario.answer
    assert text(skip_special_tokens=False) == PYTHON_TAG + s.scenario.answer


@pytest.mark.parametrize("skip", SKIP, ids=SKIP_IDS)
async def test_chatvllm_streams_and_returns_the_call(scripted: Any, skip: dict[str, Any]) -> None:
    s = scripted("llama3_tools")
    chat = ChatVLLM(model=s.path, vllm_kwargs=s.engine_kwargs, extra_sampling=skip)
    bound = chat.bind_tools([get_weather])
    message = bound.invoke(QUESTION)
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [
        ("get_weather", {"city": "Oslo"})
    ]
    assert message.content == "" and message.tool_calls[0]["id"]
    assert message.response_metadata["finish_reason"] == "tool_calls"
    chunks = [c async for c in bound.astream(QUESTION)]
    with_calls = [c for c in chunks if c.tool_call_chunks]
    assert with_calls and with_calls[0].tool_call_chunks[0]["name"] == "get_weather"
    assert "".join(str(c.content) for c in chunks) == ""
    full = chunks[0]
    for c in chunks[1:]:
        full += c
    assert [(c["name"], c["args"]) for c in full.tool_calls] == [("get_weather", {"city": "Oslo"})]
    assert full.response_metadata["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("skip", SKIP, ids=SKIP_IDS)
async def test_vllm_streams_and_returns_the_call(scripted: Any, skip: dict[str, Any]) -> None:
    s = scripted("llama3_tools")
    llm = VLLM(model=s.path, vllm_kwargs=s.engine_kwargs, additional_kwargs=skip)
    weather = FunctionTool.from_defaults(lambda city: f"Sunny in {city}.", name="get_weather")
    streamed = list(llm.stream_chat_with_tools([weather], QUESTION))
    for response in (
        llm.chat_with_tools([weather], QUESTION),
        streamed[-1],
        [r async for r in await llm.astream_chat_with_tools([weather], QUESTION)][-1],
    ):
        (selection,) = llm.get_tool_calls_from_response(response)
        assert (selection.tool_name, selection.tool_kwargs) == ("get_weather", {"city": "Oslo"})
        assert not response.message.content
        assert response.additional_kwargs["finish_reason"] == "tool_calls"
    assert all(PYTHON_TAG not in (r.delta or "") for r in streamed)
