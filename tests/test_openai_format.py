"""Unit tests of the pure converters in ``vllm_inline.engine.stream.openai_format``.

The chunks and completions are also validated against the official ``openai`` SDK's response
types, which is what its clients parse them into. The end-to-end proof (a real engine behind a
real socket) is ``test_openai_server.py``.
"""

from __future__ import annotations

import json

from openai.types.chat import ChatCompletion, ChatCompletionChunk

from vllm_inline.engine.stream.deltas import Delta, TokenLogprob, ToolCallDelta, Usage
from vllm_inline.engine.stream.openai_format import (
    __all__ as exported,
)
from vllm_inline.engine.stream.openai_format import (
    chunk_from_delta,
    completion_from_deltas,
    logprobs_dict,
    usage_chunk,
    usage_dict,
)

META = {"id": "chatcmpl-1", "model": "m", "created": 1700000000}


def test_exports() -> None:
    assert sorted(exported) == [
        "chunk_from_delta",
        "completion_from_deltas",
        "logprobs_dict",
        "text_chunk_from_delta",
        "text_completion_from_deltas",
        "usage_chunk",
        "usage_dict",
    ]


def test_first_chunk_has_the_role_and_later_ones_only_new_text() -> None:
    first = chunk_from_delta(Delta(text="The"), first=True, **META)
    later = chunk_from_delta(Delta(text=" answer"), **META)
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": "The"},
            "logprobs": None,
            "finish_reason": None,
        }
    ]
    assert later["choices"][0]["delta"] == {"content": " answer"}
    for chunk in (first, later):
        ChatCompletionChunk.model_validate(chunk)
        assert "usage" not in chunk


def test_last_chunk_carries_finish_reason_and_an_empty_delta() -> None:
    last = chunk_from_delta(Delta(finish_reason="stop", usage=Usage(5, 3)), **META)
    assert last["choices"][0]["delta"] == {}
    assert last["choices"][0]["finish_reason"] == "stop"
    assert ChatCompletionChunk.model_validate(last).choices[0].finish_reason == "stop"


def test_first_chunk_with_no_text_still_sends_role_and_empty_content() -> None:
    chunk = chunk_from_delta(
        Delta(tool_calls=(ToolCallDelta(0, "call_1", "f", ""),)), first=True, **META
    )
    assert chunk["choices"][0]["delta"]["role"] == "assistant"
    assert chunk["choices"][0]["delta"]["content"] == ""


def test_tool_call_fragments() -> None:
    head = chunk_from_delta(
        Delta(tool_calls=(ToolCallDelta(0, "call_1", "get_weather", ""),)), **META
    )
    tail = chunk_from_delta(
        Delta(tool_calls=(ToolCallDelta(0, arguments='{"city": "Oslo"}'),)), **META
    )
    assert head["choices"][0]["delta"]["tool_calls"] == [
        {
            "index": 0,
            "id": "call_1",
            "type": "function",
            "function": {"arguments": "", "name": "get_weather"},
        }
    ]
    assert tail["choices"][0]["delta"]["tool_calls"] == [
        {"index": 0, "function": {"arguments": '{"city": "Oslo"}'}}
    ]
    for chunk in (head, tail):
        ChatCompletionChunk.model_validate(chunk)


def test_fragments_of_one_call_in_one_delta_are_one_entry() -> None:
    # vLLM's parser can report a call's name and its arguments in the same step; LangChain's
    # ChatOpenAI would read two entries of one chunk as two calls.
    delta = Delta(
        tool_calls=(
            ToolCallDelta(0, "call_1", "get_weather", ""),
            ToolCallDelta(0, arguments='{"city": "Oslo"}'),
            ToolCallDelta(1, "call_2", "get_time", "{}"),
        )
    )
    assert chunk_from_delta(delta, **META)["choices"][0]["delta"]["tool_calls"] == [
        {
            "index": 0,
            "id": "call_1",
            "type": "function",
            "function": {"arguments": '{"city": "Oslo"}', "name": "get_weather"},
        },
        {
            "index": 1,
            "id": "call_2",
            "type": "function",
            "function": {"arguments": "{}", "name": "get_time"},
        },
    ]


def test_reasoning_field_name_is_configurable() -> None:
    delta = Delta(reasoning="Need to think")
    assert chunk_from_delta(delta, **META)["choices"][0]["delta"] == {
        "reasoning_content": "Need to think"
    }
    assert chunk_from_delta(delta, reasoning_field="reasoning", **META)["choices"][0]["delta"] == {
        "reasoning": "Need to think"
    }


def test_usage() -> None:
    usage = Usage(prompt_tokens=12, completion_tokens=5)
    assert usage_dict(usage) == {
        "prompt_tokens": 12,
        "completion_tokens": 5,
        "total_tokens": 17,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    chunk = usage_chunk(usage, **META)
    assert chunk["choices"] == [] and chunk["usage"]["total_tokens"] == 17
    assert ChatCompletionChunk.model_validate(chunk).usage.completion_tokens == 5


def test_logprobs() -> None:
    lp = TokenLogprob(token="é", token_id=7, logprob=-0.5, top_logprobs=(("a", -1.0),))
    assert logprobs_dict([lp]) == {
        "content": [
            {
                "token": "é",
                "logprob": -0.5,
                "bytes": [195, 169],
                "top_logprobs": [{"token": "a", "logprob": -1.0, "bytes": [97]}],
            }
        ]
    }
    chunk = chunk_from_delta(Delta(text="é", logprobs=(lp,)), **META)
    ChatCompletionChunk.model_validate(chunk)


def test_completion_joins_text_and_takes_finish_and_usage_from_the_last_delta() -> None:
    deltas = [
        Delta(text="The"),
        Delta(text=" answer"),
        Delta(text=".", finish_reason="stop", usage=Usage(9, 4)),
    ]
    completion = completion_from_deltas(deltas, **META)
    assert completion["object"] == "chat.completion"
    assert completion["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "The answer."},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    assert completion["usage"] == {
        "prompt_tokens": 9,
        "completion_tokens": 4,
        "total_tokens": 13,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    ChatCompletion.model_validate(completion)


def test_streamed_chunks_and_the_completion_say_the_same() -> None:
    deltas = [
        Delta(text="Hel", index=0),
        Delta(text="Bon", index=1),
        Delta(text="lo", index=0, finish_reason="length"),
        Delta(text="jour", index=1, finish_reason="stop", usage=Usage(3, 4)),
    ]
    streamed: dict[int, str] = {}
    for d in deltas:
        choice = chunk_from_delta(d, **META)["choices"][0]
        streamed[choice["index"]] = streamed.get(choice["index"], "") + choice["delta"].get(
            "content", ""
        )
    completion = completion_from_deltas(deltas, **META)
    assert {c["index"]: c["message"]["content"] for c in completion["choices"]} == streamed
    assert [c["finish_reason"] for c in completion["choices"]] == ["length", "stop"]


def test_completion_merges_tool_call_fragments() -> None:
    deltas = [
        Delta(tool_calls=(ToolCallDelta(0, "call_1", "get_weather", ""),)),
        Delta(tool_calls=(ToolCallDelta(0, arguments='{"city": '),)),
        Delta(
            tool_calls=(
                ToolCallDelta(0, arguments='"Oslo"}'),
                ToolCallDelta(1, "call_2", "f", "{}"),
            )
        ),
        Delta(finish_reason="tool_calls", usage=Usage(30, 8)),
    ]
    completion = completion_from_deltas(deltas, **META)
    message = completion["choices"][0]["message"]
    assert message["content"] is None  # only tool calls, as OpenAI has it
    assert message["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
        },
        {"id": "call_2", "type": "function", "function": {"name": "f", "arguments": "{}"}},
    ]
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"city": "Oslo"}
    assert completion["choices"][0]["finish_reason"] == "tool_calls"
    ChatCompletion.model_validate(completion)


def test_completion_keeps_reasoning_apart() -> None:
    deltas = [
        Delta(reasoning="Need"),
        Delta(reasoning=" to think"),
        Delta(text="42", finish_reason="stop"),
    ]
    message = completion_from_deltas(deltas, **META)["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "42", "reasoning_content": "Need to think"}
