"""The Responses converters without an engine (vllm_inline.server.responses: inputs, params,
output): input items to chat messages, body fields to the engine's arguments, deltas to output
items and stream events. The same paths on real engines, and against vllm serve, are in
tests/test_server_responses*.py."""

from __future__ import annotations

import itertools

import pytest

from vllm_inline.engine import BadRequestError, Delta, ToolCallDelta, Usage
from vllm_inline.server.errors import InvalidBodyError
from vllm_inline.server.responses.inputs import conversation, output_messages
from vllm_inline.server.responses.output import OutputFold
from vllm_inline.server.responses.params import engine_kwargs
from vllm_inline.server.responses.tools import chat_tools

CALL = {"type": "function_call", "call_id": "c1", "name": "get_weather",
        "arguments": '{"city": "Oslo"}'}  # fmt: skip


def test_items_become_chat_messages() -> None:
    items = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "Weather "}, {"type": "input_text", "text": "now?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "Need the tool"}]},
        CALL,
        {**CALL, "call_id": "c2"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2",
         "output": [{"type": "input_text", "text": "warm"}]},
        {"type": "message", "role": "assistant", "id": "m", "status": "completed",
         "content": [{"type": "output_text", "text": "Sunny.", "annotations": []}]},
    ]  # fmt: skip
    messages, new = conversation(items, "Answer in English.")
    calls = [{"id": c, "type": "function",
              "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
             for c in ("c1", "c2")]  # fmt: skip
    assert messages == [
        {"role": "system", "content": "Answer in English."},
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Weather now?"},
        {"role": "assistant", "content": None, "reasoning": "Need the tool", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "warm"},
        {"role": "assistant", "content": "Sunny."},
    ]
    assert new == messages[1:]  # the instructions are not part of the conversation kept


def test_history_continues_and_instructions_do_not_carry_over() -> None:
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None,
               "tool_calls": [{"id": "c1", "type": "function",
                               "function": {"name": "f", "arguments": "{}"}}]}]  # fmt: skip
    output = [{"type": "function_call_output", "call_id": "c1", "output": "done"}]
    messages, new = conversation(output, None, history)
    assert messages == [*history, {"role": "tool", "tool_call_id": "c1", "content": "done"}]
    assert new == messages[2:]
    with pytest.raises(InvalidBodyError, match="no function_call of this conversation"):
        conversation(output, None, history[:1])


@pytest.mark.parametrize(
    ("given", "place"),
    [
        (None, "body.input"),
        (3, "body.input"),
        ([3], "body.input.0"),
        ([{"type": "item_reference", "id": "x"}], "body.input.0.type"),
        ([{"type": "message", "role": "robot", "content": "x"}], "body.input.0.role"),
        ([{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}],
         "body.input.0.content.0.type"),
        ([{**CALL, "name": None}], "body.input.0.name"),
        ([{"type": "reasoning", "encrypted_content": "x"}], "body.input.0.encrypted_content"),
    ],
)  # fmt: skip
def test_bad_items_name_their_place(given: object, place: str) -> None:
    with pytest.raises(InvalidBodyError) as e:
        conversation(given, None)
    assert e.value.parameter == place


def test_a_response_output_continues_as_one_assistant_message() -> None:
    output = [
        {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Think"}]},
        {"type": "message", "content": [{"type": "output_text", "text": "Calling."}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    ]
    assert output_messages(output) == [
        {"role": "assistant", "content": "Calling.", "reasoning": "Think",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "f", "arguments": "{}"}}]},
    ]  # fmt: skip


def test_body_fields_become_engine_arguments() -> None:
    tools, _ = chat_tools([{"type": "function", "name": "f", "parameters": {"type": "object"}}])
    assert tools == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    body = {
        "max_output_tokens": 9, "temperature": 0.5, "top_k": 3, "tool_choice": "required",
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        "reasoning": {"effort": "low"}, "include": ["message.output_text.logprobs"],
        "top_logprobs": 2, "metadata": {"a": "b"}, "store": True,
    }  # fmt: skip
    assert engine_kwargs(body, tools) == {
        "temperature": 0.5, "top_k": 3, "max_tokens": 9, "tools": tools,
        "tool_choice": "required", "structured_outputs": {"json": {"type": "object"}},
        "logprobs": 2,
        "chat_template_kwargs": {"reasoning_effort": "low", "enable_thinking": True},
    }  # fmt: skip
    assert engine_kwargs({"text": {"format": {"type": "json_object"}}}, []) == {
        "structured_outputs": {"json_object": True}
    }
    assert (
        engine_kwargs({"tool_choice": {"type": "function", "name": "f"}}, tools)["tool_choice"]
        == "f"
    )


@pytest.mark.parametrize(
    ("body", "name"),
    [
        ({"background": True, "store": False}, "background"),
        ({"prompt": {"id": "p"}}, "prompt"),
        ({"conversation": "c"}, "conversation"),
        ({"truncation": "auto"}, "truncation"),
        ({"include": ["nope"]}, "include"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}}},
          "structured_outputs": {"json": {}}}, "structured_outputs"),
        ({"text": {"format": {"type": "xml"}}}, "body.text.format.type"),
        ({"reasoning": "high"}, "body.reasoning"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
    ],
)  # fmt: skip
def test_fields_that_cannot_be_honoured_are_refused(body: dict[str, object], name: str) -> None:
    with pytest.raises(BadRequestError) as e:
        engine_kwargs(body, [])
    assert e.value.parameter == name


def ids() -> object:
    counter = itertools.count()
    return lambda prefix: f"{prefix}_{next(counter)}"


def test_the_fold_opens_and_closes_items_as_vllm_serve_streams_them() -> None:
    fold = OutputFold(new_id=ids())  # type: ignore[arg-type]
    deltas = [
        Delta(reasoning="Need", token_ids=(1,)),
        Delta(reasoning=" it", text="Call", token_ids=(2,)),
        Delta(tool_calls=(ToolCallDelta(0, "c1", "f", '{"a"'),)),
        Delta(tool_calls=(ToolCallDelta(0, arguments=": 1}"), ToolCallDelta(1, "c2", "g", "{}"))),
        Delta(finish_reason="tool_calls", usage=Usage(5, 6)),
    ]
    events = [e for d in deltas for e in fold.feed(d)] + fold.close()
    assert [(e["type"], e.get("output_index")) for e in events] == [
        ("response.output_item.added", 0), ("response.content_part.added", 0),
        ("response.reasoning_text.delta", 0), ("response.reasoning_text.delta", 0),
        ("response.reasoning_text.done", 0), ("response.content_part.done", 0),
        ("response.output_item.done", 0),
        ("response.output_item.added", 1), ("response.content_part.added", 1),
        ("response.output_text.delta", 1), ("response.output_text.done", 1),
        ("response.content_part.done", 1), ("response.output_item.done", 1),
        ("response.output_item.added", 2), ("response.function_call_arguments.delta", 2),
        ("response.function_call_arguments.delta", 2),
        ("response.function_call_arguments.done", 2), ("response.output_item.done", 2),
        ("response.output_item.added", 3), ("response.function_call_arguments.delta", 3),
        ("response.function_call_arguments.done", 3), ("response.output_item.done", 3),
    ]  # fmt: skip
    assert [item["type"] for item in fold.output] == [
        "reasoning", "message", "function_call", "function_call"
    ]  # fmt: skip
    assert fold.output[0]["content"] == [{"text": "Need it", "type": "reasoning_text"}]
    assert fold.output[2]["arguments"] == '{"a": 1}' and fold.output[2]["call_id"] == "c1"
    assert fold.reasoning == "Need it" and fold.usage == Usage(5, 6)
    assert fold.finish_reason == "tool_calls"


def test_the_fold_leaves_out_what_the_request_turned_off() -> None:
    fold = OutputFold(include_reasoning=False, parallel_tool_calls=False)
    fold.feed(Delta(reasoning="hidden"))
    fold.feed(
        Delta(tool_calls=(ToolCallDelta(0, "c1", "f", "{}"), ToolCallDelta(1, "c2", "g", "{}")))
    )
    fold.close()
    assert [item["type"] for item in fold.output] == ["function_call"]
    assert fold.reasoning == "hidden"  # generated, counted, not sent


def test_a_reasoning_parser_for_a_model_the_server_lacks_is_refused() -> None:
    from vllm_inline.engine import Engine
    from vllm_inline.server import OpenAIServer

    engine = Engine("some/model")  # never started, in no registry: no engine work here
    with pytest.raises(ValueError, match=r"\['typo'\], which are not chat models"):
        OpenAIServer(chat={"m": engine}, reasoning_parser={"typo": "qwen3"})
    server = OpenAIServer(chat={"m": engine}, reasoning_parser="qwen3")
    assert server.models.find("chat", "m").reasoning_parser == "qwen3"


def test_parallel_tool_calls_false_reaches_the_engine() -> None:
    """As on the chat route: vLLM's parser constrains the calls to one (the fold keeps one)."""
    tools, _ = chat_tools([{"type": "function", "name": "get_weather"}])
    assert engine_kwargs({"parallel_tool_calls": False}, tools)["parallel_tool_calls"] is False
    assert "parallel_tool_calls" not in engine_kwargs({"parallel_tool_calls": True}, tools)
    with pytest.raises(InvalidBodyError) as raised:
        engine_kwargs({"parallel_tool_calls": "no"}, tools)
    assert raised.value.parameter == "body.parallel_tool_calls"
