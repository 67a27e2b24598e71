"""Tool calls, reasoning and structured outputs through the engine, with vLLM's own parsers."""

from __future__ import annotations

import json
import time

import pytest
from tool_schemas import WEATHER

from vllm_inline.engine import BadRequestError

USER = [{"role": "user", "content": "What is the weather in Oslo?"}]


def _calls(deltas) -> list[dict]:
    """Join tool-call fragments the way OpenAI clients do."""
    calls: dict[int, dict] = {}
    for d in deltas:
        for f in d.tool_calls:
            call = calls.setdefault(f.index, {"id": None, "name": None, "arguments": ""})
            call["id"] = call["id"] or f.id
            call["name"] = call["name"] or f.name
            call["arguments"] += f.arguments
    return [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_tool_call_is_parsed_and_streamed(scripted, mode):
    s = scripted("chatml_tools")
    if mode == "sync":
        deltas = list(s.engine.stream(USER, tools=[WEATHER]))
    else:
        deltas = [d async for d in s.engine.astream(USER, tools=[WEATHER])]
    (call,) = _calls(deltas)
    name, arguments = s.scenario.tool_call
    assert call["name"] == name and call["id"]
    assert json.loads(call["arguments"]) == json.loads(arguments)
    assert "".join(d.text for d in deltas).strip() == ""  # no <tool_call> markup in the text
    assert deltas[-1].finish_reason == "tool_calls"


def test_tool_result_goes_back_through_the_template(scripted):
    s = scripted("chatml_tools")
    messages = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    for _ in range(2):  # the same messages again: vLLM's renderer must not have changed them
        deltas = list(s.engine.stream(messages, tools=[WEATHER]))
        assert "".join(d.text for d in deltas) == s.scenario.after_tool.answer
        assert deltas[-1].finish_reason == "stop"
        assert messages[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo"}'


def test_without_tools_the_markup_is_plain_text(scripted):
    s = scripted("chatml_tools")
    assert "".join(d.text for d in s.engine.stream(USER)) == s.scenario.answer


@pytest.mark.parametrize("tool_choice", ["required", "get_weather"])
def test_forced_tool_call_is_valid_even_when_the_model_would_not_call(scripted, tool_choice):
    s = scripted("chatml")  # a model that only ever says hello
    deltas = list(s.engine.stream(USER, tools=[WEATHER], tool_choice=tool_choice, max_tokens=80))
    (call,) = _calls(deltas)
    assert call["name"] == "get_weather"
    assert json.loads(call["arguments"])["city"] in ("Oslo", "Paris")
    assert deltas[-1].finish_reason == "tool_calls"


def test_tool_choice_none_keeps_tools_out_of_the_parse(scripted):
    s = scripted("chatml_tools")
    deltas = list(s.engine.stream(USER, tools=[WEATHER], tool_choice="none"))
    assert not _calls(deltas)
    assert "".join(d.text for d in deltas) == s.scenario.answer


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_reasoning_never_lands_in_the_text(scripted, mode):
    s = scripted("chatml_reasoning")
    kwargs = {"reasoning_parser": s.scenario.reasoning_parser}
    if mode == "sync":
        deltas = list(s.engine.stream(USER, **kwargs))
    else:
        deltas = [d async for d in s.engine.astream(USER, **kwargs)]
    reasoning = "".join(d.reasoning for d in deltas)
    text = "".join(d.text for d in deltas)
    assert reasoning.strip() == s.scenario.reasoning
    assert text.strip() == s.scenario.content
    assert "<think>" not in text and "</think>" not in text
    assert sum(1 for d in deltas if d.reasoning) > 1  # reasoning streams too
    assert deltas[-1].finish_reason == "stop"


def _lagging(stream) -> list:
    """Take the first delta, then wait: the engine keeps going and vLLM merges its outputs
    until this consumer asks again (the bridge holds the request back meanwhile)."""
    deltas = []
    for delta in stream:
        deltas.append(delta)
        if len(deltas) == 1:
            time.sleep(1.0)
    return deltas


def test_a_lagging_consumer_gets_the_same_tool_call_and_reasoning(scripted):
    """Merged outputs (several tokens per delta) go through the same parsers."""
    s = scripted("chatml_tools")
    steady = list(s.engine.stream(USER, tools=[WEATHER]))
    late = _lagging(s.engine.stream(USER, tools=[WEATHER]))
    assert [{**c, "id": None} for c in _calls(late)] == [{**c, "id": None} for c in _calls(steady)]
    assert late[-1].finish_reason == steady[-1].finish_reason == "tool_calls"
    u, v = late[-1].usage, steady[-1].usage  # (the second one finds the prompt in the cache)
    assert (u.prompt_tokens, u.completion_tokens) == (v.prompt_tokens, v.completion_tokens)

    r = scripted("chatml_reasoning")
    kwargs = {"reasoning_parser": r.scenario.reasoning_parser}
    steady = list(r.engine.stream(USER, **kwargs))
    late = _lagging(r.engine.stream(USER, **kwargs))
    assert len(late) < len(steady)
    assert "".join(d.reasoning for d in late).strip() == r.scenario.reasoning
    assert "".join(d.text for d in late).strip() == r.scenario.content


def test_reasoning_off_by_template_kwargs(scripted):
    s = scripted("chatml_reasoning")
    deltas = list(
        s.engine.stream(
            USER, reasoning_parser="qwen3", chat_template_kwargs={"enable_thinking": False}
        )
    )
    assert "".join(d.text for d in deltas).strip() == s.scenario.no_think.answer.strip()
    assert "".join(d.reasoning for d in deltas) == ""


def test_reasoning_effort_and_include_reasoning(scripted):
    """vLLM's request fields: ``reasoning_effort="none"`` turns thinking off through the template
    (``enable_thinking=False``) unless ``chat_template_kwargs`` says otherwise;
    ``include_reasoning=False`` parses the reasoning out and drops it."""
    s = scripted("chatml_reasoning")
    off = list(s.engine.stream(USER, reasoning_parser="qwen3", reasoning_effort="none"))
    assert "".join(d.text for d in off).strip() == s.scenario.no_think.answer.strip()
    on = list(s.engine.stream(USER, reasoning_parser="qwen3", reasoning_effort="high"))
    assert "".join(d.reasoning for d in on).strip() == s.scenario.reasoning
    kept = list(
        s.engine.stream(
            USER,
            reasoning_parser="qwen3",
            reasoning_effort="none",
            chat_template_kwargs={"enable_thinking": True},
        )
    )
    assert "".join(d.reasoning for d in kept).strip() == s.scenario.reasoning
    for stream in (True, False):
        hidden = list(
            s.engine.stream(USER, reasoning_parser="qwen3", include_reasoning=False, stream=stream)
        )
        assert "".join(d.reasoning for d in hidden) == ""
        assert "".join(d.text for d in hidden).strip() == s.scenario.content
    with pytest.raises(BadRequestError) as e:
        s.engine.stream(USER, reasoning_effort="extreme")
    assert e.value.parameter == "reasoning_effort"


def test_structured_output_always_validates(scripted):
    s = scripted("chatml")
    schema = {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "n": {"type": "integer", "minimum": 0, "maximum": 9},
        },
        "required": ["ok", "n"],
        "additionalProperties": False,
    }
    for _ in range(5):
        text = "".join(
            d.text
            for d in s.engine.stream(USER, structured_outputs={"json": schema}, max_tokens=64)
        )
        value = json.loads(text)
        assert set(value) == {"ok", "n"} and isinstance(value["ok"], bool) and 0 <= value["n"] <= 9
