"""``ChatVLLM.stream``/``astream`` fold the chunks LangChain keeps for ``on_llm_end`` as the
stream goes (integrations/langchain/kept_chunks.py), on a real engine: a long stream keeps at
most ``FOLD_EVERY`` chunks alive, and every callback gets what LangChain's own ``astream`` gives
it (each token, ``on_llm_end``'s merged message with its usage and metadata, the last chunk).
If a langchain-core renames the list it keeps, the bound fails here."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest
from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler
from langchain_core.language_models import BaseChatModel
from langchain_core.outputs import ChatGenerationChunk, LLMResult

from vllm_inline.integrations.langchain import ChatVLLM
from vllm_inline.integrations.langchain.kept_chunks import FOLD_EVERY, first_fold

pytestmark = pytest.mark.engine

TOKENS = 5 * FOLD_EVERY + 3
CALL = {"max_tokens": TOKENS, "ignore_eos": True, "temperature": 0}


class Ends(BaseCallbackHandler):
    """What LangChain's callbacks get: each token's text, and ``on_llm_end``'s message."""

    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.end: LLMResult | None = None

    def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
        self.tokens.append(token)

    def on_llm_end(self, response: LLMResult, **kwargs: Any) -> None:
        self.end = response


class AsyncEnds(Ends, AsyncCallbackHandler):  # type: ignore[misc]
    async def on_llm_new_token(self, token: str, **kwargs: Any) -> None:  # type: ignore[override]
        self.tokens.append(token)

    async def on_llm_end(self, response: LLMResult, **kwargs: Any) -> None:  # type: ignore[override]
        self.end = response


def live_chunks() -> int:
    gc.collect()
    return sum(isinstance(o, ChatGenerationChunk) for o in gc.get_objects())


def ended(ends: Ends) -> dict[str, Any]:
    """``on_llm_end``'s message, less what differs from run to run: its id (the run's) and the
    timings in its metadata (the keys are kept)."""
    assert ends.end is not None
    message = ends.end.generations[0][0].message.model_dump(exclude={"id"})
    metadata = message["response_metadata"]
    for key, value in metadata.items():
        if isinstance(value, dict):
            metadata[key] = sorted(value)
    return message


@pytest.fixture
def chat(scripted: Any) -> ChatVLLM:
    s = scripted("llama3")
    return ChatVLLM(model=s.path, vllm_kwargs=s.engine_kwargs)


async def test_a_long_astream_keeps_few_chunks_and_ends_as_langchain_s(chat: ChatVLLM) -> None:
    before = live_chunks()
    ends, theirs = AsyncEnds(), AsyncEnds()
    config = {"callbacks": [ends]}
    texts = []
    peak = 0
    async for message in chat.astream("Hi", config, **CALL):  # type: ignore[arg-type]
        texts.append(message.content)
        if len(texts) in (2 * FOLD_EVERY + 1, 4 * FOLD_EVERY + 1):
            peak = max(peak, live_chunks() - before)
    assert peak <= FOLD_EVERY + 2, peak  # without folding: 2-4 x FOLD_EVERY
    # LangChain's own astream (no folding) on the same call gives every callback the same.
    async for _ in BaseChatModel.astream(chat, "Hi", {"callbacks": [theirs]}, **CALL):
        pass
    # The same text; not the same pieces: a consumer that lags gets deltas joined.
    assert "".join(ends.tokens) == "".join(theirs.tokens)
    assert ended(ends) == ended(theirs)
    assert ended(ends)["content"] == "".join(texts)
    assert ended(ends)["usage_metadata"]["output_tokens"] == TOKENS


def test_a_long_stream_keeps_few_chunks_and_ends_as_langchain_s(chat: ChatVLLM) -> None:
    before = live_chunks()
    ends, theirs = Ends(), Ends()
    texts = []
    peak = 0
    for message in chat.stream("Hi", {"callbacks": [ends]}, **CALL):
        texts.append(message.content)
        if len(texts) == 3 * FOLD_EVERY + 1:
            peak = live_chunks() - before
    assert peak <= FOLD_EVERY + 2, peak
    for _ in BaseChatModel.stream(chat, "Hi", {"callbacks": [theirs]}, **CALL):
        pass
    assert "".join(ends.tokens) == "".join(theirs.tokens)
    assert ended(ends) == ended(theirs)
    assert ended(ends)["content"] == "".join(texts)


def test_streams_started_together_fold_at_different_chunks() -> None:
    """Streams that start together get their tokens at the same engine steps: their first folds
    are spread over ``FOLD_EVERY`` chunks, so that no one step merges for all of them."""
    firsts = [first_fold() for _ in range(2 * FOLD_EVERY)]
    assert sorted(firsts[:FOLD_EVERY]) == list(range(1, FOLD_EVERY + 1))
    assert firsts[FOLD_EVERY:] == firsts[:FOLD_EVERY]


async def test_streams_started_together_each_end_as_langchain_s(chat: ChatVLLM) -> None:
    """Each stream of a burst folds at its own chunks; each ``on_llm_end`` is still LangChain's."""
    theirs = AsyncEnds()
    async for _ in BaseChatModel.astream(chat, "Hi", {"callbacks": [theirs]}, **CALL):
        pass

    async def one() -> AsyncEnds:
        ends = AsyncEnds()
        async for _ in chat.astream("Hi", {"callbacks": [ends]}, **CALL):  # type: ignore[arg-type]
            pass
        return ends

    burst = await asyncio.gather(*(one() for _ in range(5)))
    for ends in burst:
        assert "".join(ends.tokens) == "".join(theirs.tokens)
        assert ended(ends) == ended(theirs)


async def test_a_stream_left_early_is_closed_and_reported_as_langchain_s(chat: ChatVLLM) -> None:
    """Leaving the stream after a fold: LangChain's stream is closed (the engine request
    aborted), and a new one runs."""
    count = 0
    stream = chat.astream("Hi", **CALL)
    async for _ in stream:
        count += 1
        if count == FOLD_EVERY + 2:
            break
    await stream.aclose()  # type: ignore[attr-defined]
    assert "".join([m.content async for m in chat.astream("Hi", max_tokens=5)])  # type: ignore[misc]
