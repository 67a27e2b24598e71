"""Final-only requests (the engine's ``stream=False``, vLLM's FINAL_ONLY output) on real engines.

A final-only request must give the message its stream gives: text, reasoning, tool calls,
finish and stop reason, usage and token ids, through the same builders. ``ChatVLLM.invoke`` and
``batch`` use it when no callback wants tokens; LlamaIndex's non-streaming methods always.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.tools import FunctionTool
from tool_schemas import WEATHER

from vllm_inline.engine import BadRequestError
from vllm_inline.integrations.langchain import ChatVLLM
from vllm_inline.integrations.langchain.token_callbacks import wants_tokens
from vllm_inline.integrations.llama_index import VLLM

pytestmark = pytest.mark.engine

QUESTION = "What is the weather in Oslo?"
USER = [{"role": "user", "content": QUESTION}]


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return f"It is sunny in {city}."


def summary(deltas: list[Any]) -> dict[str, Any]:
    """What a stream adds up to, per choice, with the request's usage."""
    choices: dict[int, dict[str, Any]] = {}
    for d in deltas:
        c = choices.setdefault(
            d.index, {"text": "", "reasoning": "", "ids": (), "calls": {}, "finish": None}
        )
        c["text"] += d.text
        c["reasoning"] += d.reasoning
        c["ids"] += d.token_ids
        for f in d.tool_calls:
            call = c["calls"].setdefault(f.index, {"name": None, "arguments": ""})
            call["name"] = call["name"] or f.name
            call["arguments"] += f.arguments
        if d.finish_reason:
            c["finish"] = (d.finish_reason, d.stop_reason)
    for c in choices.values():
        c["calls"] = [
            (v["name"], json.loads(v["arguments"])) for _, v in sorted(c["calls"].items())
        ]
    usage = [d.usage for d in deltas if d.usage]
    assert len(usage) == 1, "usage rides on the request's last delta only"
    return {
        "choices": choices,
        "usage": (usage[0].prompt_tokens, usage[0].completion_tokens),
    }


# -- the engine ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scenario", "options"),
    [
        ("llama3", {}),
        ("chatml", {}),
        ("gemma", {}),
        ("llama3", {"stop": [" complete", "zzz"]}),  # stop strings: vLLM cuts them either way
        ("long", {"max_tokens": 5}),
        ("chatml_tools", {"tools": [WEATHER]}),
        ("chatml_tools", {"tools": [WEATHER], "tool_choice": "required"}),
        ("chatml_reasoning", {"reasoning_parser": "qwen3"}),
        (
            "chatml_reasoning",
            {"reasoning_parser": "qwen3", "chat_template_kwargs": {"enable_thinking": False}},
        ),
    ],
)
def test_final_only_gives_what_the_stream_adds_up_to(
    scripted: Any, scenario: str, options: dict[str, Any]
) -> None:
    s = scripted(scenario)
    streamed = list(s.engine.stream(USER, **options))
    (final,) = list(s.engine.stream(USER, stream=False, **options))
    assert len(streamed) > 1
    assert summary([final]) == summary(streamed)
    assert final.metrics is not None and final.metrics.e2e_time > 0


async def test_final_only_async_with_n_and_logprobs(scripted: Any) -> None:
    s = scripted("chatml")
    kwargs = {"n": 2, "logprobs": 1, "temperature": 1.0}
    finals = [d async for d in s.engine.astream(USER, stream=False, **kwargs)]
    streamed = [d async for d in s.engine.astream(USER, **kwargs)]
    assert sorted(d.index for d in finals) == [0, 1]
    assert summary(finals) == summary(streamed)
    assert finals[-1].usage is not None and finals[0].usage is None
    for d in finals:
        assert [lp.token_id for lp in d.logprobs] == list(d.token_ids)
    assert s.engine.num_unfinished_requests() == 0


def test_stream_must_be_a_bool(scripted: Any) -> None:
    s = scripted("llama3")
    with pytest.raises(BadRequestError) as e:
        s.engine.stream(USER, stream="no")
    assert e.value.parameter == "stream"


# -- ChatVLLM ----------------------------------------------------------------------------------


class Tokens(BaseCallbackHandler):
    def __init__(self) -> None:
        self.tokens: list[str] = []

    def on_llm_new_token(self, token: str, **_: Any) -> None:
        self.tokens.append(token)


class Ends(BaseCallbackHandler):
    """Implements no token method: does not make a run stream."""

    def __init__(self) -> None:
        self.ends = 0

    def on_llm_end(self, response: Any, **_: Any) -> None:
        self.ends += 1


class AsyncEnds(AsyncCallbackHandler):
    async def on_llm_end(self, response: Any, **_: Any) -> None:
        pass


class IgnoresLLM(Tokens):
    ignore_llm = True


class _Run:
    def __init__(self, *handlers: Any) -> None:
        self.handlers = list(handlers)


def test_wants_tokens_only_for_handlers_that_implement_on_llm_new_token() -> None:
    assert not wants_tokens(None)
    assert not wants_tokens(_Run())
    assert not wants_tokens(_Run(Ends(), AsyncEnds(), IgnoresLLM()))
    assert wants_tokens(_Run(Ends(), Tokens()))
    assigned = Ends()
    assigned.on_llm_new_token = lambda token, **_: None  # type: ignore[method-assign]
    assert wants_tokens(_Run(assigned))


def _message_view(m: AIMessage) -> dict[str, Any]:
    usage = dict(m.usage_metadata or {})
    usage.pop("input_token_details", None)  # vLLM's prefix cache hits vary between runs
    return {
        "content": m.content,
        "reasoning": m.additional_kwargs.get("reasoning_content"),
        "calls": [(c["name"], c["args"]) for c in m.tool_calls],
        "finish": m.response_metadata.get("finish_reason"),
        "usage": usage,
    }


class Spy:
    """Records the ``stream`` option of each request the real engine is given."""

    def __init__(self, engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[bool] = []
        real_stream, real_astream = engine.stream, engine.astream

        def stream(*args: Any, **kwargs: Any) -> Any:
            self.seen.append(kwargs.get("stream", True))
            return real_stream(*args, **kwargs)

        def astream(*args: Any, **kwargs: Any) -> Any:
            self.seen.append(kwargs.get("stream", True))
            return real_astream(*args, **kwargs)

        monkeypatch.setattr(engine, "stream", stream)
        monkeypatch.setattr(engine, "astream", astream)


@pytest.mark.parametrize(
    ("scenario", "tools", "fields"),
    [
        ("llama3", False, {}),
        ("chatml_tools", True, {}),
        ("chatml_reasoning", False, {"reasoning_parser": "qwen3"}),
    ],
)
def test_invoke_without_token_callbacks_is_final_only_and_the_same_message(
    scripted: Any,
    monkeypatch: pytest.MonkeyPatch,
    scenario: str,
    tools: bool,
    fields: dict[str, Any],
) -> None:
    s = scripted(scenario)
    chat = ChatVLLM(model=s.path, vllm_kwargs=s.engine_kwargs, **fields)
    model: Any = chat.bind_tools([get_weather]) if tools else chat
    spy = Spy(s.engine, monkeypatch)
    ends = Ends()
    final = model.invoke(QUESTION, config={"callbacks": [ends]})
    chunks = list(model.stream(QUESTION))
    tokens = Tokens()
    streamed_invoke = model.invoke(QUESTION, config={"callbacks": [tokens]})
    assert spy.seen == [False, True, True]
    assert ends.ends == 1
    assert len(tokens.tokens) > 1  # a token consumer still gets every chunk
    full = chunks[0]
    for c in chunks[1:]:
        full += c
    assert _message_view(final) == _message_view(full) == _message_view(streamed_invoke)
    if tools:
        assert _message_view(final)["calls"] == [("get_weather", {"city": "Oslo"})]
        assert final.tool_calls[0]["id"]
        assert final.response_metadata["finish_reason"] == "tool_calls"


def test_batch_without_token_callbacks_is_final_only(
    scripted: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = scripted("llama3")
    chat = ChatVLLM(model=s.path, vllm_kwargs=s.engine_kwargs)
    spy = Spy(s.engine, monkeypatch)
    sync = chat.batch([QUESTION] * 3)
    asynchronous = asyncio.run(chat.abatch([QUESTION] * 3))
    assert spy.seen == [False] * 6
    assert {m.content for m in sync + asynchronous} == {s.scenario.answer}
    assert all(m.response_metadata["finish_reason"] == "stop" for m in sync + asynchronous)
    # A call's stream=True (LangChain then streams) and stream=False are honoured.
    chat.invoke(QUESTION, stream=True)
    chat.invoke(QUESTION, stream=False, config={"callbacks": [Tokens()]})
    assert spy.seen[6:] == [True, False]


async def test_final_only_fires_no_token_event_that_no_handler_sees(
    scripted: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handler without a token method (``UsageMetadataCallbackHandler``, a cost tracker) is
    not sent ``on_llm_new_token`` at all: LangChain would hand a synchronous one's no-op to a
    thread-pool worker, once per input of an async batch."""
    from langchain_core.callbacks import manager

    events: list[str] = []
    real_handle, real_ahandle = manager.handle_event, manager.ahandle_event

    def handle_event(handlers: Any, event: str, *args: Any, **kwargs: Any) -> Any:
        events.append(event)
        return real_handle(handlers, event, *args, **kwargs)

    async def ahandle_event(handlers: Any, event: str, *args: Any, **kwargs: Any) -> Any:
        events.append(event)
        return await real_ahandle(handlers, event, *args, **kwargs)

    monkeypatch.setattr(manager, "handle_event", handle_event)
    monkeypatch.setattr(manager, "ahandle_event", ahandle_event)
    s = scripted("llama3")
    chat = ChatVLLM(model=s.path, vllm_kwargs=s.engine_kwargs)
    ends = Ends()
    config: Any = {"callbacks": [ends]}
    chat.invoke(QUESTION, config=config)
    await chat.ainvoke(QUESTION, config=config)
    answers = await chat.abatch([QUESTION] * 3, config=config)
    assert ends.ends == 5
    assert {m.content for m in answers} == {s.scenario.answer}
    assert "on_llm_new_token" not in events
    assert events.count("on_llm_end") == 5
    # A token handler on a forced final-only call still gets the answer as its one token.
    tokens = Tokens()
    await chat.ainvoke(QUESTION, stream=False, config={"callbacks": [tokens]})
    assert tokens.tokens == [s.scenario.answer]


# -- LlamaIndex --------------------------------------------------------------------------------


async def test_llama_index_non_streaming_calls_are_final_only_and_the_same(
    scripted: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = scripted("chatml_tools")
    llm = VLLM(model=s.path, vllm_kwargs=s.engine_kwargs)
    spy = Spy(s.engine, monkeypatch)
    messages = [ChatMessage(role="user", content=QUESTION)]
    weather = FunctionTool.from_defaults(get_weather.func)
    final = await llm.achat_with_tools([weather], chat_history=messages)
    last = None
    async for last in await llm.astream_chat_with_tools([weather], chat_history=messages):
        pass
    assert last is not None
    assert spy.seen == [False, True]
    calls = [(c.tool_name, c.tool_kwargs) for c in llm.get_tool_calls_from_response(final)]
    assert calls == [("get_weather", {"city": "Oslo"})]
    streamed = [(c.tool_name, c.tool_kwargs) for c in llm.get_tool_calls_from_response(last)]
    assert streamed == calls
    for key in ("prompt_tokens", "completion_tokens", "finish_reason"):
        assert final.additional_kwargs[key] == last.additional_kwargs[key]

    plain = scripted("llama3")
    li = VLLM(model=plain.path, vllm_kwargs=plain.engine_kwargs)
    completion = await li.acomplete(QUESTION)
    chat = li.chat(messages)
    assert completion.text == chat.message.content == plain.scenario.answer
