"""``ChatVLLM`` on real engines with scripted models: the answers are known in advance.

Every model here follows a fixed script (``vllm_inline.testing``), so the tests can check exact
content, stops, reasoning separation, tool-call parsing and token counts, streaming and not.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from typing import Any, Literal

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.tools import tool
from pydantic import BaseModel
from streams import assert_token_pieces
from typing_extensions import TypedDict

from vllm_inline.engine import BadRequestError
from vllm_inline.integrations.langchain import ChatVLLM

pytestmark = pytest.mark.engine

QUESTION = "What is the weather in Oslo?"


def chat_for(s: Any, **kwargs: Any) -> ChatVLLM:
    """A ``ChatVLLM`` on the session's shared engine for scripted model ``s``."""
    return ChatVLLM(model=s.path, vllm_kwargs=s.engine_kwargs, **kwargs)


def script_tokens(chain: Any) -> int:
    """Tokens generated for a chain: the answer pieces plus the stop token."""
    return chain.script.index(chain.stop) + 1


def prompt_tokens(s: Any, messages: list[dict[str, Any]], **template: Any) -> int:
    text = s.engine.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False, **template
    )
    return len(s.engine.tokenizer.encode(text, add_special_tokens=False))


class Tokens(BaseCallbackHandler):
    """Records every ``on_llm_new_token`` call: (time, run id, token, chunk)."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, Any, str, Any]] = []
        self._lock = threading.Lock()

    def on_llm_new_token(
        self, token: str, *, chunk: Any = None, run_id: Any = None, **_: Any
    ) -> None:
        with self._lock:
            self.calls.append((time.monotonic(), run_id, token, chunk))


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return f"It is sunny in {city}."


# -- plain answers and stops -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["llama3", "chatml", "gemma"])
def test_invoke_stops_at_end_of_turn(scripted: Any, name: str) -> None:
    s = scripted(name)
    message = chat_for(s).invoke(QUESTION)
    assert message.content == s.scenario.answer
    assert not any(t in message.content for t in s.scenario.special_tokens)
    assert s.scenario.hallucinated_tail.strip() not in message.content
    assert message.response_metadata["finish_reason"] == "stop"
    assert message.response_metadata["model_name"] == s.path
    usage = dict(message.usage_metadata)
    cached = usage.pop("input_token_details")["cache_read"]  # vLLM's prefix cache: runs vary
    assert usage == {
        "input_tokens": prompt_tokens(s, [{"role": "user", "content": QUESTION}]),
        "output_tokens": script_tokens(s.scenario.chat),
        "total_tokens": message.usage_metadata["input_tokens"] + script_tokens(s.scenario.chat),
    }
    assert 0 <= cached < usage["input_tokens"]


@pytest.mark.smoke
def test_llama3_stream_has_no_eot_and_no_invented_turn(scripted: Any) -> None:
    s = scripted("llama3")
    tokens = Tokens()
    chunks = list(chat_for(s).stream(QUESTION, config={"callbacks": [tokens]}))
    text = "".join(c.content for c in chunks)
    assert text == s.scenario.answer == "The answer is complete."
    assert "<|eot_id|>" not in text and "User:" not in text
    assert len(chunks) > 1
    # One callback per chunk, with that chunk; no chunk repeats earlier text.
    assert [c[3].message for c in tokens.calls] == chunks
    assert_token_pieces([c.content for c in chunks[:-1]], s.scenario.script[:5])
    last = chunks[-1]
    assert last.chunk_position == "last"
    assert last.response_metadata["finish_reason"] == "stop"
    assert last.usage_metadata["output_tokens"] == script_tokens(s.scenario.chat)
    assert all(c.usage_metadata is None for c in chunks[:-1])


@pytest.mark.smoke
async def test_astream_matches_invoke(scripted: Any) -> None:
    s = scripted("llama3")
    chat = chat_for(s)
    chunks = [c async for c in chat.astream([HumanMessage(QUESTION)])]
    full = chunks[0]
    for c in chunks[1:]:
        full += c
    ainvoked = await chat.ainvoke(QUESTION)
    assert full.content == ainvoked.content == s.scenario.answer
    assert full.usage_metadata == ainvoked.usage_metadata


async def test_sync_calls_work_inside_a_running_event_loop(scripted: Any) -> None:
    # The sync path goes through the engine's bridge, not asyncio.run: it works even in a
    # thread whose event loop is running (as in Jupyter).
    s = scripted("llama3")
    assert asyncio.get_running_loop().is_running()
    chat = chat_for(s)
    assert chat.invoke(QUESTION).content == s.scenario.answer
    assert "".join(c.content for c in chat.stream(QUESTION)) == s.scenario.answer


def test_multi_turn_with_system_and_text_blocks(scripted: Any) -> None:
    s = scripted("llama3")
    messages = [
        SystemMessage("You are terse."),
        HumanMessage([{"type": "text", "text": "Hi"}]),
        AIMessage("Hello."),
        HumanMessage(QUESTION),
    ]
    message = chat_for(s).invoke(messages)
    assert message.content == s.scenario.answer
    wire = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": QUESTION},
    ]
    assert message.usage_metadata["input_tokens"] == prompt_tokens(s, wire)


# -- token counts ----------------------------------------------------------------------------


def test_token_counts_are_the_prompt_a_call_sends(scripted: Any) -> None:
    s = scripted("llama3")
    chat = chat_for(s)
    messages = [
        SystemMessage("You are terse."),
        HumanMessage("Hi"),
        AIMessage("Hello."),
        HumanMessage(QUESTION),
    ]
    counted = chat.get_num_tokens_from_messages(messages)
    assert counted == chat.invoke(messages).usage_metadata["input_tokens"]
    text = "The capital of France is Paris."
    assert chat.get_token_ids(text) == s.engine.tokenizer.encode(text, add_special_tokens=False)
    assert chat.get_num_tokens(text) == len(chat.get_token_ids(text))


def test_a_template_that_refuses_the_messages_fails_the_count_clearly(scripted: Any) -> None:
    from vllm_inline.engine import ChatTemplateError

    s = scripted("llama3")
    strict = chat_for(s, chat_template="{{ raise_exception('Conversation roles must alternate') }}")
    with pytest.raises(ChatTemplateError, match="roles must alternate") as info:
        strict.get_num_tokens_from_messages([AIMessage("a"), AIMessage("b")])
    assert info.value.parameter == "messages"
    assert chat_for(s).get_num_tokens_from_messages([AIMessage("a"), AIMessage("b")]) > 0


def test_token_counts_include_the_bound_tools(scripted: Any) -> None:
    s = scripted("chatml_tools")
    chat = chat_for(s)
    plain = chat.get_num_tokens_from_messages([HumanMessage(QUESTION)])
    counted = chat.get_num_tokens_from_messages([HumanMessage(QUESTION)], tools=[get_weather])
    assert counted > plain  # the template lists the tool in the prompt
    sent = chat.bind_tools([get_weather]).invoke(QUESTION).usage_metadata["input_tokens"]
    assert counted == sent


def test_trim_messages_counts_with_the_model(scripted: Any) -> None:
    from langchain_core.messages import trim_messages

    s = scripted("llama3")
    chat = chat_for(s)
    history = [SystemMessage("You are terse.")]
    for i in range(6):
        history += [HumanMessage(f"Question {i}?"), AIMessage(f"Answer {i}.")]
    history.append(HumanMessage(QUESTION))
    budget = chat.get_num_tokens_from_messages(history) // 2
    trimmed = trim_messages(
        history,
        max_tokens=budget,
        token_counter=chat,
        strategy="last",
        include_system=True,
        start_on="human",
    )
    assert trimmed[0] == history[0] and trimmed[-1] == history[-1] and len(trimmed) < len(history)
    assert chat.get_num_tokens_from_messages(trimmed) <= budget
    assert chat.invoke(trimmed).content == s.scenario.answer


# -- per-call values -------------------------------------------------------------------------


def test_call_values_override_the_instance(scripted: Any) -> None:
    s = scripted("long")
    chat = chat_for(s, max_tokens=200, stop=["zulu"])
    short = chat.invoke(QUESTION, max_tokens=3)
    assert short.response_metadata["finish_reason"] == "length"
    assert short.usage_metadata["output_tokens"] == 3
    assert short.content == "Alpha bravo charlie"
    stopped = chat.invoke(QUESTION, stop=[" delta"])
    assert stopped.content == "Alpha bravo charlie"
    assert stopped.response_metadata["finish_reason"] == "stop"
    assert stopped.response_metadata["stop_reason"] == " delta"
    default = chat.invoke(QUESTION)
    assert default.content.endswith("yankee ") and "zulu" not in default.content


def test_logprobs_in_response_metadata(scripted: Any) -> None:
    s = scripted("llama3")
    message = chat_for(s, logprobs=True).invoke(QUESTION)
    content = message.response_metadata["logprobs"]["content"]
    assert len(content) == message.usage_metadata["output_tokens"]
    assert [lp["token"] for lp in content[:5]] == list(s.scenario.script[:5])
    assert all(lp["logprob"] <= 0 for lp in content)
    assert "logprobs" not in chat_for(s).invoke(QUESTION).response_metadata


def test_n_choices_are_separate_generations(scripted: Any) -> None:
    s = scripted("llama3")
    result = chat_for(s, n=2).generate([[HumanMessage(QUESTION)]])
    texts = [g.text for g in result.generations[0]]
    assert texts == [s.scenario.answer, s.scenario.answer]


# -- concurrency -----------------------------------------------------------------------------


def _overlapping(tokens: Tokens) -> bool:
    """True if some run produced a token while another run was between its first and last."""
    spans: dict[Any, list[float]] = {}
    for t, run, _, _ in tokens.calls:
        spans.setdefault(run, []).append(t)
    ranges = sorted((min(v), max(v)) for v in spans.values())
    return len(ranges) > 1 and any(b[0] < a[1] for a, b in itertools.pairwise(ranges))


def test_batch_runs_concurrently(scripted: Any) -> None:
    s = scripted("long")
    tokens = Tokens()
    out = chat_for(s, max_tokens=40).batch([QUESTION] * 3, config={"callbacks": [tokens]})
    assert len({m.content for m in out}) == 1
    assert _overlapping(tokens)


async def test_abatch_and_astreams_run_concurrently(scripted: Any) -> None:
    s = scripted("long")
    chat = chat_for(s, max_tokens=40)
    tokens = Tokens()
    out = await chat.abatch([QUESTION] * 3, config={"callbacks": [tokens]})
    assert len({m.content for m in out}) == 1
    assert _overlapping(tokens)

    streams = [chat.astream(QUESTION) for _ in range(2)]
    firsts = await asyncio.gather(*(anext(st) for st in streams))
    assert all(isinstance(f, AIMessageChunk) for f in firsts)
    assert s.engine.num_unfinished_requests() == 2
    for st in streams:
        await st.aclose()  # leaving a stream aborts its request in the engine
    for _ in range(100):
        if s.engine.num_unfinished_requests() == 0:
            break
        await asyncio.sleep(0.05)
    assert s.engine.num_unfinished_requests() == 0


# -- reasoning -------------------------------------------------------------------------------


def test_reasoning_is_separated(scripted: Any) -> None:
    s = scripted("chatml_reasoning")
    chat = chat_for(s, reasoning_parser=s.scenario.reasoning_parser)
    message = chat.invoke(QUESTION)
    assert message.content.strip() == s.scenario.content
    assert message.additional_kwargs["reasoning_content"].strip() == s.scenario.reasoning
    assert "<think>" not in message.content and "Need" not in message.content
    blocks = message.content_blocks
    assert blocks[0]["type"] == "reasoning"
    assert blocks[0]["reasoning"].strip() == s.scenario.reasoning

    chunks = list(chat.stream(QUESTION))
    assert sum(1 for c in chunks if c.additional_kwargs.get("reasoning_content")) > 1
    assert all(not (c.content and c.additional_kwargs) for c in chunks)
    full = chunks[0]
    for c in chunks[1:]:
        full += c
    assert full.content == message.content
    reasoning = message.additional_kwargs["reasoning_content"]
    assert full.additional_kwargs["reasoning_content"] == reasoning


def test_thinking_can_be_turned_off_through_the_template(scripted: Any) -> None:
    s = scripted("chatml_reasoning")
    chat = chat_for(
        s,
        reasoning_parser=s.scenario.reasoning_parser,
        chat_template_kwargs={"enable_thinking": False},
    )
    message = chat.invoke(QUESTION)
    assert message.content == s.scenario.no_think.answer == s.scenario.content
    assert "reasoning_content" not in message.additional_kwargs


def test_reasoning_effort_is_a_field_and_a_call_option(scripted: Any) -> None:
    s = scripted("chatml_reasoning")
    chat = chat_for(s, reasoning_parser=s.scenario.reasoning_parser, reasoning_effort="none")
    message = chat.invoke(QUESTION)
    assert message.content == s.scenario.content
    assert "reasoning_content" not in message.additional_kwargs
    thinking = chat.invoke(QUESTION, reasoning_effort="high")
    assert thinking.additional_kwargs["reasoning_content"].strip() == s.scenario.reasoning
    hidden = chat.invoke(QUESTION, reasoning_effort="high", include_reasoning=False)
    assert hidden.content.strip() == s.scenario.content
    assert "reasoning_content" not in hidden.additional_kwargs


# -- tools -----------------------------------------------------------------------------------


def test_tool_call_is_parsed(scripted: Any) -> None:
    s = scripted("chatml_tools")
    bound = chat_for(s).bind_tools([get_weather])
    name, arguments = s.scenario.tool_call
    message = bound.invoke(QUESTION)
    calls = [(c["name"], c["args"]) for c in message.tool_calls]
    assert calls == [("get_weather", {"city": "Oslo"})]
    assert name == "get_weather" and arguments == '{"city": "Oslo"}'
    assert message.content == ""
    assert message.response_metadata["finish_reason"] == "tool_calls"
    assert message.tool_calls[0]["id"]


async def test_tool_call_streams_as_chunks(scripted: Any) -> None:
    s = scripted("chatml_tools")
    bound = chat_for(s).bind_tools([get_weather])
    chunks = [c async for c in bound.astream(QUESTION)]
    assert any(c.tool_call_chunks for c in chunks)
    assert "<tool_call>" not in "".join(c.content for c in chunks)
    full = chunks[0]
    for c in chunks[1:]:
        full += c
    assert [(c["name"], c["args"]) for c in full.tool_calls] == [("get_weather", {"city": "Oslo"})]
    assert full.response_metadata["finish_reason"] == "tool_calls"


def test_tool_result_leads_to_the_final_answer(scripted: Any) -> None:
    s = scripted("chatml_tools")
    bound = chat_for(s).bind_tools([get_weather])
    first = bound.invoke(QUESTION)
    call = first.tool_calls[0]
    answer = bound.invoke(
        [
            HumanMessage(QUESTION),
            first,
            ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"]),
        ]
    )
    assert answer.content == s.scenario.after_tool.answer == "The weather in Oslo is sunny."
    assert answer.tool_calls == []


class SetLight(BaseModel):
    """Switch the light."""

    state: Literal["on", "off"]
    dim: bool


@pytest.mark.parametrize("tool_choice", ["required", "any", "SetLight"])
def test_tool_choice_is_enforced(scripted: Any, tool_choice: str) -> None:
    s = scripted("chatml")  # would answer "Hello from ChatML!" without the constraint
    bound = chat_for(s).bind_tools([SetLight], tool_choice=tool_choice, strict=True)
    message = bound.invoke(QUESTION)
    assert len(message.tool_calls) >= 1
    call = message.tool_calls[0]
    assert call["name"] == "SetLight"
    SetLight.model_validate(call["args"])


# -- structured output -----------------------------------------------------------------------


class Mood(BaseModel):
    """How the model feels."""

    mood: Literal["happy", "sad", "calm"]
    sunny: bool
    stars: Literal[1, 2, 3]


class MoodDict(TypedDict):
    """How the model feels."""

    mood: Literal["happy", "sad", "calm"]
    sunny: bool


async def test_structured_output_validates_20_times(scripted: Any) -> None:
    s = scripted("chatml")
    structured = chat_for(s, temperature=1.0).with_structured_output(Mood)
    results = await structured.abatch([f"How do you feel, take {i}?" for i in range(20)])
    assert len(results) == 20
    assert all(isinstance(r, Mood) for r in results)


def test_structured_output_streams(scripted: Any) -> None:
    s = scripted("chatml")
    parts = list(chat_for(s).with_structured_output(MoodDict).stream(QUESTION))
    assert parts
    assert set(parts[-1]) == {"mood", "sunny"}
    assert parts[-1]["mood"] in ("happy", "sad", "calm")


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
@pytest.mark.parametrize("schema", [Mood, MoodDict, Mood.model_json_schema()])
def test_structured_output_methods(scripted: Any, method: str, schema: Any) -> None:
    s = scripted("chatml")
    structured = chat_for(s).with_structured_output(schema, method=method, include_raw=True)
    out = structured.invoke(QUESTION)
    assert out["parsing_error"] is None
    assert isinstance(out["raw"], AIMessage)
    parsed = out["parsed"]
    if schema is Mood:
        assert isinstance(parsed, Mood)
    else:
        assert parsed["mood"] in ("happy", "sad", "calm")
        assert isinstance(parsed["sunny"], bool)


def test_json_mode_returns_json(scripted: Any) -> None:
    s = scripted("chatml")
    out = (
        chat_for(s, max_tokens=64)
        .with_structured_output(None, method="json_mode", include_raw=True)
        .invoke("Answer in JSON.")
    )
    assert out["raw"].content.startswith("{")
    assert out["parsing_error"] is None
    assert isinstance(out["parsed"], dict)


# -- chains and agents -----------------------------------------------------------------------


def test_lcel_chain_streams_token_by_token(scripted: Any) -> None:
    s = scripted("llama3")
    prompt = ChatPromptTemplate.from_messages([("system", "Be brief."), ("human", "{question}")])
    chain = prompt | chat_for(s) | StrOutputParser()
    pieces = list(chain.stream({"question": QUESTION}))
    assert_token_pieces([p for p in pieces if p], s.scenario.script[:5])
    assert "".join(pieces) == s.scenario.answer


def test_agent_runs_the_tool_and_answers(scripted: Any) -> None:
    from langchain.agents import create_agent

    s = scripted("chatml_tools")
    agent = create_agent(chat_for(s), tools=[get_weather])
    result = agent.invoke({"messages": [HumanMessage(QUESTION)]})
    messages = result["messages"]
    kinds = [type(m).__name__ for m in messages]
    assert kinds == ["HumanMessage", "AIMessage", "ToolMessage", "AIMessage"]
    assert messages[1].tool_calls[0]["name"] == "get_weather"
    assert messages[2].content == "It is sunny in Oslo."
    assert messages[-1].content == "The weather in Oslo is sunny."


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "parameter"),
    [
        (lambda c: c.invoke(QUESTION, temperature=-0.5), "temperature"),
        (lambda c: c.invoke(QUESTION, max_tokens=0), "max_tokens"),
        (
            lambda c: c.bind(tools=[get_weather_tool()], tool_choice="get_time").invoke(QUESTION),
            "tool_choice",
        ),
        (
            lambda c: c.invoke(
                [HumanMessage([{"type": "image_url", "image_url": {"url": "http://x/y.png"}}])]
            ),
            "messages[0].content[0]",
        ),
        (
            lambda c: c.invoke([HumanMessage(QUESTION), ToolMessage("x", tool_call_id="")]),
            "messages[1].tool_call_id",
        ),
        (lambda c: c.invoke(QUESTION, tool_parser="no_such_parser"), "tool_parser"),
        (lambda c: c.invoke(QUESTION, temprature=0.1), "temprature"),
    ],
)
def test_bad_input_is_refused_with_a_typed_error(scripted: Any, call: Any, parameter: str) -> None:
    s = scripted("llama3")
    with pytest.raises(BadRequestError) as info:
        call(chat_for(s))
    assert info.value.parameter == parameter


def get_weather_tool() -> dict[str, Any]:
    from langchain_core.utils.function_calling import convert_to_openai_tool

    return convert_to_openai_tool(get_weather)


async def test_engine_keeps_serving_after_bad_input(scripted: Any) -> None:
    s = scripted("llama3")
    chat = chat_for(s)
    with pytest.raises(BadRequestError):
        await chat.ainvoke(QUESTION, top_p=5)
    assert (await chat.ainvoke(QUESTION)).content == s.scenario.answer
