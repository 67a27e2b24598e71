"""Fuzzed message lists against the validator and the real renderer (the model's template on a
running engine): the only errors allowed are the engine's typed request errors."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_inline.engine import BadRequestError, VLLMInlineError
from vllm_inline.engine.request.messages import ROLES, validate_messages

pytestmark = pytest.mark.engine

_text = st.text(max_size=12)
_roles = st.one_of(
    st.sampled_from(ROLES),
    st.sampled_from(["wizard", "", "USER", "function"]),
    st.none(),
    st.integers(),
)
_parts = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, _text),
    _text,
    st.just({"type": "image_url", "image_url": {"url": "http://x/y.png"}}),
    st.just({"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}}),
    st.builds(lambda t: {"type": "text", "text": t}, st.none() | st.integers()),
    st.just({"text": "no type"}),
    st.integers(),
    st.none(),
)
_content = st.one_of(
    _text,
    st.none(),
    st.lists(_parts, max_size=3),
    st.integers(),
    st.just({"type": "text", "text": "a mapping, not a list"}),
    st.just(b"bytes"),
)
_arguments = st.one_of(
    st.just('{"city": "Oslo"}'),
    st.just("{not json"),
    st.dictionaries(st.text(max_size=3), st.integers() | _text, max_size=2),
    st.integers(),
    st.none(),
)
_tool_call = st.one_of(
    st.fixed_dictionaries(
        {
            "function": st.fixed_dictionaries(
                {"name": st.sampled_from(["get_weather", "", "x y"]), "arguments": _arguments}
            )
        },
        optional={"id": st.one_of(_text, st.none()), "type": st.just("function")},
    ),
    st.fixed_dictionaries({"name": st.sampled_from(["get_weather", "f"]), "arguments": _arguments}),
    st.integers(),
    st.none(),
    _text,
)
_message = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "role": _roles,
            "content": _content,
            "tool_calls": st.one_of(st.lists(_tool_call, max_size=2), st.none(), _text),
            "tool_call_id": st.one_of(_text, st.none(), st.integers()),
            "name": st.one_of(_text, st.integers()),
        },
    ),
    _text,
    st.integers(),
    st.none(),
)
_messages = st.one_of(st.lists(_message, max_size=5), _text, st.none(), st.integers())

# Mostly well-formed chats, so that many of them reach the template.
_good_message = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "developer", "user", "assistant"]), "content": _text}
    ),
    st.fixed_dictionaries(
        {
            "role": st.just("assistant"),
            "content": st.one_of(st.none(), _text),
            "tool_calls": st.lists(
                st.fixed_dictionaries(
                    {
                        "id": st.just("call_1"),
                        "type": st.just("function"),
                        "function": st.fixed_dictionaries(
                            {
                                "name": st.just("get_weather"),
                                "arguments": st.just('{"city": "Oslo"}'),
                            }
                        ),
                    }
                ),
                min_size=1,
                max_size=2,
            ),
        }
    ),
    st.fixed_dictionaries(
        {"role": st.just("tool"), "content": _text, "tool_call_id": st.just("call_1")}
    ),
    st.fixed_dictionaries(
        {
            "role": st.just("user"),
            "content": st.lists(
                st.builds(lambda t: {"type": "text", "text": t}, _text), max_size=2
            ),
        }
    ),
)
_good_messages = st.lists(_good_message, min_size=1, max_size=5)


def _send(engine: Any, messages: Any) -> str:
    """Stream one token; returns "answered" or the typed error's class name."""
    try:
        deltas = list(engine.stream(messages, max_tokens=1))
    except BadRequestError as e:  # ChatTemplateError and ContextLengthExceededError included
        assert e.parameter, f"{type(e).__name__} without a parameter: {e}"
        assert str(e)
        return type(e).__name__
    assert deltas and deltas[-1].finish_reason is not None
    return "answered"


@given(messages=st.lists(_message, max_size=6))
@settings(max_examples=300, deadline=None)
def test_validator_returns_clean_messages_or_a_typed_error(messages):
    try:
        clean = validate_messages(messages)
    except BadRequestError as e:
        assert e.parameter is not None and e.parameter.startswith("messages")
        return
    assert len(clean) == len(messages) > 0
    for m in clean:
        assert m["role"] in ROLES and isinstance(m["content"], str)


@given(messages=_messages)
@settings(max_examples=40, deadline=None)
def test_fuzzed_messages_through_the_engine(scripted, messages):
    engine = scripted("chatml").engine
    try:
        _send(engine, messages)
    except VLLMInlineError as e:  # a typed error other than a request error: the engine broke
        pytest.fail(f"{type(e).__name__} for {messages!r}: {e}")
    assert engine.num_unfinished_requests() == 0


@given(messages=_good_messages)
@settings(max_examples=30, deadline=None)
def test_fuzzed_wellformed_chats_render_or_fail_typed(scripted, messages):
    engine = scripted("chatml").engine
    outcome = _send(engine, messages)
    assert outcome in ("answered", "ChatTemplateError")


def test_engine_answers_after_fuzzing(scripted):
    s = scripted("chatml")
    assert (
        "".join(d.text for d in s.engine.stream([{"role": "user", "content": "hi"}]))
        == s.scenario.answer
    )
