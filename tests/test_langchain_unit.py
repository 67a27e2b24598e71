"""``ChatVLLM`` without an engine: imports, converters, the request builder and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.language_models.chat_models import generate_from_stream
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatGenerationChunk
from pydantic import BaseModel, ValidationError

import vllm_inline.integrations.langchain as lc
from vllm_inline.engine import BadRequestError, Delta, TokenLogprob, ToolCallDelta, Usage
from vllm_inline.integrations.langchain import ChatVLLM
from vllm_inline.integrations.langchain.convert import (
    convert_message_to_dict,
    delta_to_chunk,
    delta_to_generation_chunk,
    request_kwargs,
)
from vllm_inline.integrations.langchain.streaming import aggregate

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"  # never started in this module


@pytest.mark.smoke
def test_all_is_pinned() -> None:
    assert lc.__all__ == ["ChatVLLM", "VLLMEmbeddings", "VLLMRerank"]


@pytest.mark.smoke
def test_import_loads_neither_vllm_nor_torch() -> None:
    code = (
        "import sys, vllm_inline.integrations.langchain; "
        "assert 'vllm' not in sys.modules and 'torch' not in sys.modules, "
        "sorted(m for m in sys.modules if m in ('vllm', 'torch'))"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_construction_starts_nothing_and_shares_the_engine() -> None:
    a = ChatVLLM(model=MODEL, vllm_kwargs={"dtype": "float32"})
    b = ChatVLLM(model=MODEL, vllm_kwargs={"dtype": "float32"}, temperature=0.3)
    assert a.engine is b.engine
    assert not a.engine.started
    assert ChatVLLM(model=MODEL).engine is not a.engine


def test_identity_and_tracing_params() -> None:
    chat = ChatVLLM(
        model=MODEL, temperature=0.5, max_tokens=7, stop=["\n"], reasoning_parser="qwen3"
    )
    assert chat._llm_type == "vllm-inline"
    assert chat._identifying_params == {
        "model": MODEL,
        "vllm_kwargs": {},
        "temperature": 0.5,
        "max_tokens": 7,
        "stop": ["\n"],
        "reasoning_parser": "qwen3",
    }
    assert chat._get_ls_params() == {
        "ls_provider": "vllm",
        "ls_model_name": MODEL,
        "ls_model_type": "chat",
        "ls_temperature": 0.5,
        "ls_max_tokens": 7,
        "ls_stop": ["\n"],
    }
    assert chat._get_ls_params(stop=["x"], temperature=0.1)["ls_stop"] == ["x"]


def test_request_merges_fields_and_call_values() -> None:
    chat = ChatVLLM(
        model=MODEL,
        temperature=0.5,
        top_k=3,
        stop=["a"],
        extra_sampling={"min_p": 0.1},
        chat_template_kwargs={"enable_thinking": False},
        lora="adapter",
    )
    instance = {
        k: v for k, v in chat._identifying_params.items() if k not in ("model", "vllm_kwargs")
    }
    assert instance == {
        "temperature": 0.5,
        "top_k": 3,
        "stop": ["a"],
        "min_p": 0.1,
        "chat_template_kwargs": {"enable_thinking": False},
        "lora": "adapter",
    }
    request = request_kwargs(instance, ["b"], {"temperature": 0.0, "tools": None, "lora": None})
    assert request == {
        "temperature": 0.0,
        "top_k": 3,
        "stop": ["b"],  # the call's stop replaces the instance's
        "min_p": 0.1,
        "chat_template_kwargs": {"enable_thinking": False},
    }  # and a call's lora=None is the base model
    assert request_kwargs(instance)["stop"] == ["a"]


def test_stop_both_ways_is_refused() -> None:
    with pytest.raises(ValueError, match="stop"):
        request_kwargs({}, ["a"], {"stop": ["b"]})


@pytest.mark.parametrize(
    ("name", "value"),
    [("stop", ["b"]), ("temperature", 0.3), ("max_tokens", 400), ("top_k", 5), ("timeout", 2.0)],
)
def test_a_fields_name_in_extra_sampling_is_refused(name: str, value: Any) -> None:
    """Not silently dropped: an unset field would otherwise hide the value."""
    with pytest.raises(ValidationError, match=rf"extra_sampling\['{name}'\]=.*ChatVLLM\({name}="):
        ChatVLLM(model=MODEL, extra_sampling={name: value})
    assert ChatVLLM(model=MODEL, extra_sampling={"min_p": 0.1})._identifying_params["min_p"] == 0.1


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", -1.0), ("top_p", 0.0), ("max_tokens", 0), ("n", 0), ("stop", [""])],
)
def test_bad_field_is_refused_at_construction(field: str, value: Any) -> None:
    with pytest.raises(ValidationError, match=field):
        ChatVLLM(model=MODEL, **{field: value})


def test_unknown_field_is_refused() -> None:
    with pytest.raises(ValidationError, match="temprature"):
        ChatVLLM(model=MODEL, temprature=0.1)


class _Weather(BaseModel):
    """Weather in a city."""

    city: str


@pytest.mark.parametrize(
    ("tool_choice", "expected"),
    [
        ("auto", "auto"),
        ("none", "none"),
        ("any", "required"),
        (True, "required"),
        (False, "none"),
        ("required", "required"),
        ("_Weather", "_Weather"),
        ({"type": "function", "function": {"name": "_Weather"}}, "_Weather"),
    ],
)
def test_bind_tools_normalizes_tool_choice(tool_choice: Any, expected: str) -> None:
    bound = ChatVLLM(model=MODEL).bind_tools([_Weather], tool_choice=tool_choice)
    assert bound.kwargs["tool_choice"] == expected  # type: ignore[attr-defined]
    assert bound.kwargs["tools"][0]["function"]["name"] == "_Weather"  # type: ignore[attr-defined]


@pytest.mark.parametrize("tool_choice", ["get_time", {"function": {"name": "nope"}}, 3])
def test_bind_tools_refuses_unknown_tool_choice(tool_choice: Any) -> None:
    with pytest.raises(BadRequestError, match="tool_choice"):
        ChatVLLM(model=MODEL).bind_tools([_Weather], tool_choice=tool_choice)


def test_with_structured_output_refuses_unknown_method() -> None:
    with pytest.raises(BadRequestError, match="method"):
        ChatVLLM(model=MODEL).with_structured_output(
            _Weather,
            method="xml",  # type: ignore[arg-type]
        )


# -- converters ------------------------------------------------------------------------------


def test_messages_convert_to_openai_dicts() -> None:
    messages = [
        SystemMessage("Be brief."),
        HumanMessage([{"type": "text", "text": "Weather"}, "in Oslo?"], name="ann"),
        AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Oslo"}, "id": "c1"}]),
        ToolMessage("sunny", tool_call_id="c1"),
        AIMessage([{"type": "reasoning", "reasoning": "hm"}, {"type": "text", "text": "Sunny."}]),
    ]
    assert [convert_message_to_dict(m) for m in messages] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather\nin Oslo?", "name": "ann"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps({"city": "Oslo"})},
                }
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
        {"role": "assistant", "content": "Sunny."},
    ]


@pytest.mark.parametrize(
    "message",
    [
        HumanMessage([{"type": "image", "file_id": "file-123"}]),
        SystemMessage([{"type": "image", "base64": "AA", "mime_type": "image/png"}]),
        HumanMessage([{"type": "audio", "base64": "AA", "mime_type": "audio/wav"}]),
        ToolMessage(
            [{"type": "file", "base64": "AA", "mime_type": "application/pdf"}], tool_call_id="c"
        ),
        FunctionMessage("x", name="f"),
    ],
)
def test_messages_the_model_cannot_take_are_refused(message: Any) -> None:
    with pytest.raises(BadRequestError, match="messages\\[0\\]"):
        ChatVLLM(model=MODEL)._prepare([message], None, {})


_PNG = "iVBORw0KGgo="


@pytest.mark.parametrize(
    "block",
    [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{_PNG}"}},
        {"type": "image", "base64": _PNG, "mime_type": "image/png"},
        {"type": "image", "source_type": "base64", "data": _PNG, "mime_type": "image/png"},
        {"type": "image", "url": f"data:image/png;base64,{_PNG}"},
    ],
)
def test_image_blocks_become_openai_image_url_parts(block: dict[str, Any]) -> None:
    """Every LangChain image form reaches the engine as OpenAI's image_url part (the engine
    decodes and checks it: tests/test_images.py)."""
    for message in (HumanMessage(["look", block]), ToolMessage([block], tool_call_id="c")):
        content = convert_message_to_dict(message, "messages[0]")["content"]
        image = content[-1]
        assert image == {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{_PNG}"}}


def test_delta_to_chunk_text_reasoning_and_tools() -> None:
    chunk = delta_to_chunk(Delta(text="Hi", reasoning="think"), "m")
    assert chunk.content == "Hi"
    assert chunk.additional_kwargs == {"reasoning_content": "think"}
    assert chunk.content_blocks[0] == {"type": "reasoning", "reasoning": "think"}
    assert chunk.chunk_position is None and chunk.usage_metadata is None

    call = delta_to_chunk(
        Delta(tool_calls=(ToolCallDelta(index=0, id="c1", name="f", arguments='{"a"'),)), "m"
    )
    assert call.tool_call_chunks == [
        {"type": "tool_call_chunk", "name": "f", "args": '{"a"', "id": "c1", "index": 0}
    ]


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(),
    reasoning=st.sampled_from(["", "think"]),
    finish=st.sampled_from([None, "stop", "length"]),
    usage=st.sampled_from([None, Usage(prompt_tokens=5, completion_tokens=3)]),
)
def test_generation_chunk_fast_path_equals_the_validated_chunk(
    text: str, reasoning: str, finish: str | None, usage: Usage | None
) -> None:
    """Plain-text deltas skip pydantic validation; the result must be the very same chunk."""
    delta = Delta(text=text, reasoning=reasoning, finish_reason=finish, usage=usage)
    fast = delta_to_generation_chunk(delta, "m")
    validated = ChatGenerationChunk(message=delta_to_chunk(delta, "m"))
    assert fast == validated
    assert type(fast.message) is AIMessageChunk
    assert fast.message.model_dump() == validated.message.model_dump()
    assert fast.text == validated.text == text
    assert (fast + fast).message == (validated + validated).message


_FINAL_DELTAS = [
    Delta(text="Hello.", finish_reason="stop", usage=Usage(prompt_tokens=5, completion_tokens=3)),
    Delta(text="", reasoning="think", finish_reason="length"),
    Delta(
        tool_calls=(
            ToolCallDelta(index=0, id="call_0", name="get_weather", arguments='{"city": '),
            ToolCallDelta(index=0, arguments='"Paris"}'),
            ToolCallDelta(index=1, id="call_1", name="broken", arguments="{not json"),
        ),
        finish_reason="tool_calls",
    ),
    Delta(
        text=".",
        logprobs=(TokenLogprob(".", 7, -0.5, ((",", -1.5),)),),
        finish_reason="stop",
        stop_reason="###",
    ),
]


@pytest.mark.parametrize("delta", _FINAL_DELTAS)
def test_aggregate_of_one_chunk_equals_langchains_fold(delta: Delta) -> None:
    """A final-only answer (one chunk) skips LangChain's fold of one chunk with nothing; the
    generation must be the one ``generate_from_stream`` gives."""
    chunk = delta_to_generation_chunk(delta, "m")
    (mine,) = aggregate([(0, chunk)], "m").generations
    (langchains,) = generate_from_stream(iter([chunk])).generations
    assert mine == langchains
    assert type(mine.message) is AIMessage
    assert mine.message.model_dump() == langchains.message.model_dump()
    two = aggregate([(1, chunk), (0, delta_to_generation_chunk(Delta(text="a"), "m"))], "m")
    assert two.generations[1] == langchains


def test_generation_chunk_fast_path_hands_out_fresh_containers() -> None:
    first = delta_to_generation_chunk(Delta(text="a"), "m")
    first.message.additional_kwargs["x"] = 1
    first.message.response_metadata["y"] = 2
    first.message.tool_call_chunks.append({"name": "f", "args": "", "id": "1", "index": 0})
    second = delta_to_generation_chunk(Delta(text="b"), "m")
    assert second.message.additional_kwargs == {}
    assert second.message.response_metadata == {}
    assert second.message.tool_call_chunks == [] and second.message.tool_calls == []


def test_last_delta_carries_usage_and_metadata() -> None:
    last = delta_to_chunk(
        Delta(
            text=".",
            finish_reason="stop",
            stop_reason=None,
            usage=Usage(prompt_tokens=5, completion_tokens=3),
            logprobs=(TokenLogprob(".", 7, -0.5, ((",", -1.5),)),),
        ),
        "m",
    )
    assert last.chunk_position == "last"
    assert last.usage_metadata == {
        "input_tokens": 5,
        "output_tokens": 3,
        "total_tokens": 8,
        "input_token_details": {"cache_read": 0},
    }
    assert last.response_metadata == {
        "finish_reason": "stop",
        "model_name": "m",
        "stop_reason": None,
        "logprobs": {
            "content": [
                {
                    "token": ".",
                    "token_id": 7,
                    "logprob": -0.5,
                    "top_logprobs": [{"token": ",", "logprob": -1.5}],
                }
            ]
        },
    }


def test_serializes_and_loads_back() -> None:
    """``dumpd``/``load`` round-trip; the loaded model shares the original's engine."""
    from langchain_core.load import dumpd, dumps, load, loads

    chat = ChatVLLM(model=MODEL, vllm_kwargs={"dtype": "float32"}, temperature=0.1, stop=["x"])
    data = dumpd(chat)
    assert data["id"] == ["vllm_inline", "integrations", "langchain", "ChatVLLM"]
    assert data["kwargs"] == {
        "model": MODEL,
        "vllm_kwargs": {"dtype": "float32"},
        "temperature": 0.1,
        "stop": ["x"],
    }
    kwargs = {"valid_namespaces": ["vllm_inline"], "allowed_objects": [ChatVLLM]}
    for loaded in (load(data, **kwargs), loads(dumps(chat), **kwargs)):
        assert isinstance(loaded, ChatVLLM) and loaded == chat
        assert loaded.engine is chat.engine
