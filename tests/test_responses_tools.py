"""The Responses API's tools as vllm serve handles them (vllm_inline.server.responses.tools): the
pure conversions, namespaces flattened and their calls named back, custom tools as vLLM's
one-string shim and their calls as ``custom_tool_call`` items, hosted tools dropped. Served on a
real engine in tests/test_server_tools.py."""

from __future__ import annotations

import json

import pytest

from vllm_inline.engine import Delta, ToolCallDelta, Usage
from vllm_inline.server.errors import InvalidBodyError
from vllm_inline.server.responses.inputs import conversation, output_messages
from vllm_inline.server.responses.output import OutputFold
from vllm_inline.server.responses.params import engine_kwargs
from vllm_inline.server.responses.tools import (
    HOSTED,
    CallName,
    chat_tools,
    custom_arguments,
    custom_input,
)

FORECAST = {"type": "function", "name": "forecast", "parameters": {"type": "object"}}
TOOLS = [
    {"type": "web_search"},
    {"type": "namespace", "name": "weather", "description": "Weather tools",
     "tools": [FORECAST, {"type": "custom", "name": "inside"}]},
    {"type": "custom", "name": "apply_patch", "description": "Patch files"},
    {"type": "function", "name": "plain"},
    {"type": "code_interpreter", "container": {"type": "auto"}},
]  # fmt: skip


def test_tools_flattened_shimmed_and_dropped_as_vllm_serve() -> None:
    tools, names = chat_tools(TOOLS)
    assert [t["function"]["name"] for t in tools] == ["weather__forecast", "apply_patch", "plain"]
    assert tools[1]["function"]["parameters"] == {
        "type": "object",
        "properties": {
            "input": {"type": "string", "description": "The freeform text payload for this tool."}
        },
        "required": ["input"],
        "additionalProperties": False,
    }  # vLLM's custom_tool_parameters()
    assert list(tools[1]["function"]) == ["name", "description", "parameters"]  # vLLM's order
    assert tools[1]["function"]["description"] == "Patch files"
    assert names == {
        "weather__forecast": CallName("forecast", "weather"),
        "apply_patch": CallName("apply_patch", custom=True),
        "plain": CallName("plain"),
    }


def test_hosted_tools_are_openai_s_own_list() -> None:
    """Every tool type of the openai SDK's ``Tool`` union is handled: shown or dropped."""
    import typing

    from openai.types.responses import tool

    union = typing.get_args(typing.get_args(tool.Tool)[0])
    kinds = {k for c in union for k in typing.get_args(c.model_fields["type"].annotation)}
    assert kinds - HOSTED == {"function", "namespace", "custom"}


@pytest.mark.parametrize(
    ("tools", "place"),
    [
        ([{"type": "nope"}], "body.tools.0.type"),
        ([{"type": "namespace", "name": "n"}], "body.tools.0.tools"),
        ([{"type": "namespace", "tools": []}], "body.tools.0.name"),
        ([{"type": "custom"}], "body.tools.0.name"),
        ([{"type": "namespace", "name": "n", "tools": [{"type": "function"}]}],
         "body.tools.0.tools.0.name"),
    ],
)  # fmt: skip
def test_a_bad_tool_is_named(tools: list[dict[str, object]], place: str) -> None:
    with pytest.raises(InvalidBodyError) as raised:
        chat_tools(tools)
    assert raised.value.parameter == place


def test_tool_choice_names_a_namespaced_or_custom_tool_by_its_flat_name() -> None:
    tools, _ = chat_tools(TOOLS)
    choice = {"type": "function", "name": "forecast", "namespace": "weather"}
    assert engine_kwargs({"tool_choice": choice}, tools)["tool_choice"] == "weather__forecast"
    custom = {"type": "custom", "name": "apply_patch"}
    assert engine_kwargs({"tool_choice": custom}, tools)["tool_choice"] == "apply_patch"


def test_calls_come_back_under_the_names_the_client_gave() -> None:
    _, names = chat_tools(TOOLS)
    fold = OutputFold(tool_names=names)
    deltas = [
        Delta(tool_calls=(ToolCallDelta(0, "c1", "weather__forecast", '{"d'),)),
        Delta(tool_calls=(ToolCallDelta(0, arguments='ay": 1}'),)),
        Delta(tool_calls=(ToolCallDelta(1, "c2", "apply_patch", '{"input": "*** Be'),)),
        Delta(tool_calls=(ToolCallDelta(1, arguments='gin Patch\\n"}'),)),
        Delta(tool_calls=(ToolCallDelta(2, "c3", "unknown", "{}"),)),
        Delta(finish_reason="tool_calls", usage=Usage(5, 6)),
    ]
    events = [e for d in deltas for e in fold.feed(d)] + fold.close()
    forecast, patch, unknown = fold.output
    assert (forecast["type"], forecast["name"], forecast["namespace"]) == (
        "function_call", "forecast", "weather"
    )  # fmt: skip
    assert forecast["arguments"] == '{"day": 1}'
    assert patch == {
        "call_id": "c2", "input": "*** Begin Patch\n", "name": "apply_patch",
        "type": "custom_tool_call", "id": patch["id"], "caller": None, "namespace": None,
    }  # fmt: skip
    assert patch["id"].startswith("ctc_")
    assert (unknown["name"], unknown["namespace"]) == ("unknown", None)  # as vLLM: unmapped
    custom = [e for e in events if e.get("item_id") == patch["id"]]
    assert [e["type"] for e in custom] == [
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
    ]
    assert custom[0]["delta"] == custom[1]["input"] == "*** Begin Patch\n"
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    assert [i["type"] for i in added] == ["function_call", "custom_tool_call", "function_call"]


def test_custom_input_passes_what_is_not_the_shim_through() -> None:
    assert custom_input(custom_arguments('a "quoted" ü')) == 'a "quoted" ü'
    assert custom_input('{"city": "Oslo"}') == '{"city": "Oslo"}'
    assert custom_input("not json") == "not json"


def test_custom_and_namespaced_calls_continue_the_conversation() -> None:
    items = [
        {"role": "user", "content": "Fix it"},
        {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "P"},
        {"type": "function_call", "call_id": "c2", "name": "forecast", "namespace": "weather",
         "arguments": "{}"},
        {"type": "custom_tool_call_output", "call_id": "c1", "output": "done"},
        {"type": "function_call_output", "call_id": "c2", "output": "sunny"},
    ]  # fmt: skip
    messages, _ = conversation(items, None, [])
    calls = messages[1]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["apply_patch", "weather__forecast"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"input": "P"}
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    stored = output_messages([{**items[1], "id": "ctc_1"}, {**items[2], "id": "fc_1"}])
    assert stored[0]["tool_calls"] == calls
