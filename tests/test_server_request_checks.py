"""``vllm_inline/server/requests.py``'s checks that need no engine: the request shapes that
``vllm serve``'s request models refuse are refused here too, naming the field, before any work
(tests/test_server_requests.py sends the fields that reach the engine)."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_inline.engine import BadRequestError
from vllm_inline.server.requests import chat_kwargs, completion_kwargs

HELLO = [{"role": "user", "content": "Hello"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}


@pytest.mark.parametrize("choice", ["auto", "required", {"type": "function", "function": {}}])
def test_a_tool_choice_without_tools_is_refused(choice: Any) -> None:
    with pytest.raises(BadRequestError, match="`tools` must be set") as raised:
        chat_kwargs({"messages": HELLO, "tool_choice": choice})
    assert raised.value.parameter == "tool_choice"


@pytest.mark.parametrize("tools", [[], [TOOL]])
def test_a_tool_choice_with_tools_or_none_is_taken(tools: list[Any]) -> None:
    kwargs = chat_kwargs({"messages": HELLO, "tools": tools, "tool_choice": "auto"})
    assert kwargs.get("tool_choice") == ("auto" if tools else None)
    assert "tool_choice" not in chat_kwargs({"messages": HELLO, "tool_choice": "none"})


@pytest.mark.parametrize("kwargs_of", [chat_kwargs, completion_kwargs])
def test_stream_options_without_stream_are_refused(kwargs_of: Any) -> None:
    body = {"messages": HELLO, "prompt": "Hi", "stream_options": {"include_usage": True}}
    with pytest.raises(BadRequestError, match="stream=True") as raised:
        kwargs_of(body)
    assert raised.value.parameter == "stream_options"
    kwargs_of({**body, "stream": True})  # taken with stream
