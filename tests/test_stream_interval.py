"""vLLM's ``stream_interval`` (tokens per streamed output) through every streaming path.

With ``stream_interval=N`` vLLM's output processor sends a request's first token, then one
output per N tokens, and the last; each path hands on what it gets, so a stream has about 1/N as
many chunks, the same text, usage and callbacks. docs/streaming.md recommends it where many
synchronous streams run at once. Real engine, scripted model: every token is a known word.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from llama_index.core.base.llms.types import ChatMessage

from vllm_inline.engine import BadRequestError, get_engine
from vllm_inline.integrations.langchain import ChatVLLM
from vllm_inline.integrations.llama_index import VLLM

pytestmark = pytest.mark.engine

QUESTION = "What is the weather in Oslo?"
TOKENS = 20
INTERVAL = 3
BEFORE_FOXTROT = "Alpha bravo charlie delta echo"


class _Ends(BaseCallbackHandler):
    """Records what LangChain's callbacks see: each token and the final message."""

    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.final = ""

    def on_llm_new_token(self, token: str, **_: Any) -> None:
        self.tokens.append(token)

    def on_llm_end(self, response: Any, **_: Any) -> None:
        self.final = response.generations[0][0].text


def assert_intervals(pieces: list[str], expected: str) -> None:
    """``pieces`` are ``expected`` (one word per token) cut after the first token and then every
    :data:`INTERVAL` tokens; a piece may hold several such runs (vLLM's collector merges the
    outputs a busy consumer has not taken yet)."""
    assert "".join(pieces) == expected, pieces
    word_ends = list(itertools.accumulate(len(w) for w in _words(expected)))
    # Token counts 1, 1 + N, 1 + 2N, ... and the last: what vLLM's output processor sends.
    cuts = {word_ends[i] for i in range(0, len(word_ends), INTERVAL)} | {word_ends[-1]}
    assert set(itertools.accumulate(len(p) for p in pieces)) <= cuts, pieces
    assert 1 < len(pieces) <= len(cuts), pieces


def _words(text: str) -> list[str]:
    first, *rest = text.split(" ")
    return [first, *(f" {w}" for w in rest)]


def _chat(s: Any, **kwargs: Any) -> ChatVLLM:
    return ChatVLLM(model=s.path, vllm_kwargs=s.engine_kwargs, max_tokens=TOKENS, **kwargs)


def test_langchain_stream_gets_a_chunk_per_interval(scripted: Any) -> None:
    s = scripted("long")
    expected = _chat(s).invoke(QUESTION).content
    assert len(_words(expected)) == TOKENS
    ends = _Ends()
    chat = _chat(s, extra_sampling={"stream_interval": INTERVAL})
    chunks = list(chat.stream(QUESTION, config={"callbacks": [ends]}))
    pieces = [c.content for c in chunks if c.content]
    assert_intervals(pieces, expected)
    assert [t for t in ends.tokens if t] == pieces
    assert ends.final == expected
    last = chunks[-1]
    assert last.usage_metadata["output_tokens"] == TOKENS
    assert last.response_metadata["finish_reason"] == "length"


async def test_langchain_astream_per_call_interval(scripted: Any) -> None:
    s = scripted("long")
    chat = _chat(s)
    expected = (await chat.ainvoke(QUESTION)).content
    pieces = [
        c.content async for c in chat.astream(QUESTION, stream_interval=INTERVAL) if c.content
    ]
    assert_intervals(pieces, expected)


async def test_astream_events_and_the_last_chunk(scripted: Any) -> None:
    s = scripted("long")
    expected = (await _chat(s).ainvoke(QUESTION)).content
    chat = _chat(s, extra_sampling={"stream_interval": INTERVAL})
    streamed, end = [], None
    async for event in chat.astream_events(QUESTION, version="v2"):
        if event["event"] == "on_chat_model_stream":
            streamed.append(event["data"]["chunk"])
        elif event["event"] == "on_chat_model_end":
            end = event["data"]["output"]
    assert_intervals([c.content for c in streamed if c.content], expected)
    assert streamed[-1].chunk_position == "last"
    assert streamed[-1].usage_metadata["output_tokens"] == TOKENS
    assert end is not None and end.content == expected
    assert end.usage_metadata["output_tokens"] == TOKENS


def test_stop_string_inside_an_interval(scripted: Any) -> None:
    """A stop string in the middle of a held run ends the text there, as without it."""
    s = scripted("long")
    chat = _chat(s, extra_sampling={"stream_interval": INTERVAL})
    chunks = list(chat.stream(QUESTION, stop=[" foxtrot"]))
    assert "".join(c.content for c in chunks) == BEFORE_FOXTROT
    assert chunks[-1].response_metadata["finish_reason"] == "stop"
    assert chunks[-1].response_metadata["stop_reason"] == " foxtrot"


def test_llama_index_and_engine_streams(scripted: Any) -> None:
    s = scripted("long")
    expected = _chat(s).invoke(QUESTION).content
    li = VLLM(
        model=s.path,
        vllm_kwargs=s.engine_kwargs,
        max_tokens=TOKENS,
        additional_kwargs={"stream_interval": INTERVAL},
    )
    responses = list(li.stream_chat([ChatMessage(role="user", content=QUESTION)]))
    assert_intervals([r.delta for r in responses if r.delta], expected)
    assert responses[-1].message.content == expected

    engine = get_engine(s.path, **s.engine_kwargs)
    messages = [{"role": "user", "content": QUESTION}]
    deltas = list(engine.stream(messages, max_tokens=TOKENS, stream_interval=INTERVAL))
    assert_intervals([d.text for d in deltas if d.text], expected)


@pytest.mark.parametrize("value", [0, -1, "2", 1.5])
def test_bad_interval_is_refused_naming_it(scripted: Any, value: Any) -> None:
    s = scripted("long")
    chat = _chat(s)
    with pytest.raises(BadRequestError, match=f"stream_interval.*{value!r}"):
        list(chat.stream(QUESTION, stream_interval=value))
    with pytest.raises(ValueError, match="stream_interval"):  # pydantic's, at construction
        _chat(s, extra_sampling={"stream_interval": value})
    with pytest.raises(ValueError, match="stream_interval"):
        VLLM(
            model=s.path, vllm_kwargs=s.engine_kwargs, additional_kwargs={"stream_interval": value}
        )
    assert chat.invoke(QUESTION, max_tokens=3).content == "Alpha bravo charlie"
