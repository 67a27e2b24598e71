"""The chunks LangChain keeps while a chat model streams, folded as the stream goes.

``BaseChatModel.stream``/``astream`` (langchain-core 1.0 to 1.8 at least) append every
``ChatGenerationChunk`` of a stream to a local list, ``chunks``, and merge it only when the
stream ends (``merge_chat_generation_chunks``), for ``on_llm_end``'s message. A chunk is nine
objects the garbage collector tracks, so 256 live streams of a few hundred tokens each hold
hundreds of thousands of them, and each full collection walks them all: a pause of 90-150 ms
for every stream at once (docs/performance.md, "GPU-rate simulation"), at any rate a GPU
reaches. LangChain offers no hook to merge as it goes, so :class:`FoldedStreams` (``ChatVLLM``'s
``stream`` and ``astream``) runs LangChain's own methods and, every :data:`FOLD_EVERY` chunks, replace
the list's contents with their merge (LangChain's own function, on chunks nobody else was given:
the merge builds new objects). Merging is associative, so ``on_llm_end`` gets the same message;
what stays alive per stream is at most :data:`FOLD_EVERY` chunks and the merged text. Streams
started together fold at different chunks (:func:`first_fold`).

The list is found by name in the suspended generator's frame. Where it is not there (a future
langchain-core that keeps no list, or names it otherwise), nothing is folded and the stream is
LangChain's as before; ``tests/test_langchain_kept_chunks.py`` fails then, so the name is checked on
every langchain-core the package supports. What LangChain would need upstream: merge each chunk
into a running aggregate instead of keeping the list (docs/performance.md has a reproduction
with LangChain's own bare model).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing, closing
from types import FrameType
from typing import Any

from langchain_core.language_models import LanguageModelInput
from langchain_core.messages import AIMessageChunk, BaseMessageChunk
from langchain_core.outputs import ChatGenerationChunk
from langchain_core.outputs.chat_generation import merge_chat_generation_chunks
from langchain_core.runnables import RunnableConfig

__all__ = ["FOLD_EVERY", "FoldedStreams", "first_fold", "fold", "folded_astream", "folded_stream"]

FOLD_EVERY = 32
"""Chunks a stream keeps at most before they are merged into one (a fold costs about one chunk's
conversion per chunk folded; fewer kept chunks mean shorter collections)."""

_KEPT = "chunks"
"""The local of ``BaseChatModel.stream``/``astream`` that holds the stream's chunks."""

_STARTED = itertools.count()
"""Streams started in this process: each one's first fold comes after a different number of
chunks (:func:`first_fold`)."""


def first_fold() -> int:
    """Chunks a new stream keeps before its first fold, from 1 to :data:`FOLD_EVERY`, in turn.

    Streams that start together get their tokens at the same engine steps; were they all folded
    at the same chunk, every fold would fall on the same step (256 streams: 15 ms of merging
    added to one step's tokens, every 32 steps). Spread, each step folds 1/:data:`FOLD_EVERY`
    of them."""
    return FOLD_EVERY - next(_STARTED) % FOLD_EVERY


def fold(frame: FrameType | None) -> bool:
    """Merge the chunks LangChain kept in ``frame`` (a suspended ``stream``/``astream``) into
    one; whether the list was found there."""
    if frame is None:
        return False
    kept = frame.f_locals.get(_KEPT)
    if not isinstance(kept, list) or not all(isinstance(c, ChatGenerationChunk) for c in kept):
        return False
    if len(kept) > 1:
        kept[:] = [merge_chat_generation_chunks(kept)]
    return True


async def folded_astream(stream: AsyncIterator[BaseMessageChunk]) -> AsyncIterator[Any]:
    """``stream`` (what ``BaseChatModel.astream`` returned), its kept chunks folded every
    :data:`FOLD_EVERY` messages; closing this closes it."""
    left, foldable = first_fold(), True
    async with aclosing(stream) as messages:  # type: ignore[type-var]
        async for message in messages:
            yield message
            left -= 1
            if foldable and not left:
                left = FOLD_EVERY
                foldable = fold(getattr(messages, "ag_frame", None))


def folded_stream(stream: Iterator[BaseMessageChunk]) -> Iterator[Any]:
    """The synchronous form of :func:`folded_astream` (``BaseChatModel.stream``)."""
    left, foldable = first_fold(), True
    with closing(stream) as messages:  # type: ignore[type-var]
        for message in messages:
            yield message
            left -= 1
            if foldable and not left:
                left = FOLD_EVERY
                foldable = fold(getattr(messages, "gi_frame", None))


class FoldedStreams:
    """Mixin for a ``BaseChatModel`` (before it in the bases): ``stream`` and ``astream`` are
    LangChain's, with the chunks they keep for ``on_llm_end`` folded as the stream goes. It
    declares no attributes (an annotation here would become a pydantic field)."""

    def stream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> Iterator[AIMessageChunk]:
        return folded_stream(super().stream(input, config, stop=stop, **kwargs))  # type: ignore[misc]

    def astream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[AIMessageChunk]:
        return folded_astream(super().astream(input, config, stop=stop, **kwargs))  # type: ignore[misc]
