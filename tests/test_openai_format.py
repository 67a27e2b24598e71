"""Unit tests of the pure converters in ``vllm_inline.engine.stream.openai_format``.

The chunks and completions are also validated against the official ``openai`` SDK's response
types, which is what its clients parse them into. The end-to-end proof (a real engine behind a
real socket) is ``test_server.py``; ``test_server_parity.py`` compares them with ``vllm serve``'s.
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
    role_chunk,
    text_chunk_from_delta,
    text_completion_from_deltas,
    usage_chunk,
    usage_dict,
)

META = {"id": "chatcmpl-1", "model": "m", "created": 1700000000}


def test_exports() -> None:
    assert sorted(exported) == [
        "EMPTY_FIELDS_LEFT_OUT_SINCE",
        "LOWEST_LOGPROB",
        "chunk_from_delta",
        "completion_from_deltas",
        "empty_fields_left_out",
        "logprobs_dict",
        "pooling_usage",
        "role_chunk",
        "text_chunk_from_delta",
        "text_completion_from_deltas",
        "usage_chunk",
        "usage_dict",
    ]


def test_the_role_chunk_comes_first_and_later_ones_carry_only_new_text() -> None:
    # vLLM's server: the role with empty content on its own, then the text, token by token.
    first = role_chunk(1, **META)
    later = chunk_from_delta(Delta(text=" answer", index=1), **META)
    assert first == {
        **META,
        "object": "chat.completion.chunk",
        "choices": [
            {
                "index": 1,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
        "prompt_token_ids": None,
        "prompt_text": None,
    }
    assert later["choices"] == [
        {
            "index": 1,
            "delta": {"content": " answer"},
            "logprobs": None,
            "finish_reason": None,
            "token_ids": None,
        }
    ]
    for chunk in (first, later):
        ChatCompletionChunk.model_validate(chunk)
        assert "usage" not in chunk and "system_fingerprint" not in chunk


def test_last_chunk_carries_finish_and_stop_reason_and_the_fingerprint() -> None:
    delta = Delta(finish_reason="stop", stop_reason=724, usage=Usage(5, 3))
    last = chunk_from_delta(delta, system_fingerprint="vllm-x", **META)
    assert last["choices"][0]["delta"] == {"content": ""}
    assert last["choices"][0]["finish_reason"] == "stop"
    assert last["choices"][0]["stop_reason"] == 724
    assert last["system_fingerprint"] == "vllm-x"
    assert ChatCompletionChunk.model_validate(last).choices[0].finish_reason == "stop"
    # Once a choice has streamed tool calls, an empty delta is empty (vLLM's parser path).
    after = chunk_from_delta(Delta(finish_reason="tool_calls"), after_tool_calls=True, **META)
    assert after["choices"][0]["delta"] == {}
    assert "system_fingerprint" not in after


def test_a_tool_call_delta_has_null_content() -> None:
    chunk = chunk_from_delta(Delta(tool_calls=(ToolCallDelta(0, "call_1", "f", ""),)), **META)
    assert chunk["choices"][0]["delta"]["content"] is None
    ChatCompletionChunk.model_validate(chunk)


def test_tool_call_fragments() -> None:
    head = chunk_from_delta(
        Delta(tool_calls=(ToolCallDelta(0, "call_1", "get_weather", ""),)), **META
    )
    tail = chunk_from_delta(
        Delta(tool_calls=(ToolCallDelta(0, arguments='{"city": "Oslo"}'),)),
        after_tool_calls=True,
        **META,
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
    assert chunk_from_delta(delta, **META)["choices"][0]["delta"] == {"reasoning": "Need to think"}
    named = chunk_from_delta(delta, reasoning_field="reasoning_content", **META)
    assert named["choices"][0]["delta"] == {"reasoning_content": "Need to think"}


def test_usage() -> None:
    usage = Usage(prompt_tokens=12, completion_tokens=5, cached_tokens=4)
    assert usage_dict(usage) == {
        "prompt_tokens": 12,
        "total_tokens": 17,
        "completion_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 4},
        "completion_tokens_details": None,
    }
    chunk = usage_chunk(usage, system_fingerprint="vllm-x", **META)
    assert chunk["choices"] == [] and chunk["usage"]["total_tokens"] == 17
    assert "completion_tokens_details" not in chunk["usage"]  # vLLM leaves nulls out there
    assert chunk["system_fingerprint"] == "vllm-x"
    assert ChatCompletionChunk.model_validate(chunk).usage.completion_tokens == 5


def test_logprobs_list_the_generated_token_first_as_vllm_serve_does() -> None:
    alternatives = (("a", -1.0), ("b", float("-inf")))
    lp = TokenLogprob(token="é", token_id=7, logprob=-0.5, top_logprobs=alternatives)
    chosen = {"token": "é", "logprob": -0.5, "bytes": [195, 169]}
    assert logprobs_dict([lp], top=2) == {
        "content": [
            {**chosen, "top_logprobs": [chosen, {"token": "a", "logprob": -1.0, "bytes": [97]}]}
        ]
    }
    everything = logprobs_dict([lp])["content"][0]["top_logprobs"]
    assert [e["token"] for e in everything] == ["é", "a", "b"]
    assert everything[-1]["logprob"] == -9999.0  # clamped, as vLLM's server does: JSON has no inf
    assert logprobs_dict([lp], top=0)["content"][0]["top_logprobs"] == []
    chunk = chunk_from_delta(Delta(text="é", logprobs=(lp,)), **META)
    ChatCompletionChunk.model_validate(chunk)


def test_null_fields_follow_the_installed_vllms_server(monkeypatch) -> None:
    """``annotations`` and a pooling answer's ``prompt_tokens_details``: null up to vLLM 0.33,
    left out from 0.34 (``exclude_if`` in its ChatMessage and UsageInfo), as ``vllm serve``."""
    from vllm_inline.engine.seam import versions
    from vllm_inline.engine.stream.openai_format import pooling_usage

    deltas = [Delta(text="Hi.", finish_reason="stop", usage=Usage(3, 1))]
    for version, left_out in [("0.32.0", False), ("0.33.0", False), ("0.34.0", True)]:
        versions.installed_at_least.cache_clear()
        monkeypatch.setattr(versions, "installed_vllm", lambda v=version: ("vllm", v))
        message = completion_from_deltas(deltas, **META)["choices"][0]["message"]
        assert ("annotations" in message) is not left_out, version
        ChatCompletion.model_validate(completion_from_deltas(deltas, **META))
        usage = pooling_usage(5)
        assert ("prompt_tokens_details" in usage) is not left_out, version
        assert usage["completion_tokens_details"] is None
        # ours always reports cached prompt tokens (a difference kept on purpose)
        assert usage_dict(Usage(3, 1, 2))["prompt_tokens_details"] == {"cached_tokens": 2}
    versions.installed_at_least.cache_clear()


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
            "message": {
                "role": "assistant",
                "content": "The answer.",
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "reasoning": None,
            },
            "logprobs": None,
            "finish_reason": "stop",
            "stop_reason": None,
            "token_ids": None,
        }
    ]
    assert completion["usage"]["total_tokens"] == 13
    assert completion["usage"]["completion_tokens_details"] is None
    for field in ("service_tier", "prompt_logprobs", "prompt_token_ids", "prompt_text"):
        assert completion[field] is None
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
    assert message["content"] == "42" and message["reasoning"] == "Need to think"
    named = completion_from_deltas(deltas, reasoning_field="reasoning_content", **META)
    assert named["choices"][0]["message"]["reasoning_content"] == "Need to think"


def test_text_completion_chunks_and_whole() -> None:
    deltas = [Delta(text=" there"), Delta(text=".", finish_reason="stop", usage=Usage(4, 2))]
    chunks = [text_chunk_from_delta(d, system_fingerprint="vllm-x", **META) for d in deltas]
    keys = {"index", "text", "logprobs", "finish_reason", "stop_reason", "token_ids"}
    assert [set(c["choices"][0]) for c in chunks] == [keys | {"prompt_token_ids"}] * 2
    assert ["system_fingerprint" in c for c in chunks] == [False, True]
    whole = text_completion_from_deltas([deltas], system_fingerprint="vllm-x", **META)
    assert whole["choices"][0]["text"] == " there."
    assert whole["system_fingerprint"] == "vllm-x" and whole["service_tier"] is None
    assert whole["usage"]["total_tokens"] == 6
