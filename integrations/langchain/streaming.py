"""The one streaming path of ``ChatVLLM``: one call's engine deltas as LangChain chunks.

:class:`EngineCall` is what ``ChatVLLM`` resolved for one call (the shared engine, the model's
name, the wire messages, the engine's keyword arguments). :meth:`EngineCall.chunks` iterates the
engine's synchronous bridge and :meth:`EngineCall.achunks` its async stream; both turn each
:class:`~vllm_inline.engine.Delta` into one ``ChatGenerationChunk`` as it arrives (the converter
of :mod:`.convert`) and fire ``on_llm_new_token`` for it. ``ChatVLLM._stream``/``_astream``
yield those chunks; ``_generate``/``_agenerate`` fold them with :func:`aggregate`, one
generation per choice.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import generate_from_stream
from langchain_core.messages.utils import message_chunk_to_message
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult

from vllm_inline.engine import Engine

from .convert import delta_to_generation_chunk

__all__ = ["EngineCall", "IndexedChunk", "aggregate"]

IndexedChunk = tuple[int, ChatGenerationChunk]
"""``(choice index, chunk)``: a request with ``n > 1`` interleaves its choices' chunks."""


@dataclass(frozen=True)
class EngineCall:
    """One call of a chat model, resolved: where it goes and what it sends."""

    engine: Engine
    """The shared engine of the call's model."""
    model: str
    """The model's name, as ``response_metadata["model_name"]`` reports it."""
    messages: list[dict[str, Any]]
    """The call's messages in the engine's (OpenAI-style) wire format."""
    request: dict[str, Any]
    """The engine's keyword arguments (sampling and request values, ``stream``, ...)."""

    def chunks(self, run_manager: CallbackManagerForLLMRun | None) -> Iterator[IndexedChunk]:
        """The sync stream: ``(choice index, chunk)`` per engine delta, callback fired (the
        engine's ``stream=False``, when in ``request``: one delta per choice)."""
        for delta in self.engine.stream(self.messages, **self.request):
            chunk = delta_to_generation_chunk(delta, self.model)
            if run_manager:
                run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield delta.index, chunk

    async def achunks(
        self, run_manager: AsyncCallbackManagerForLLMRun | None
    ) -> AsyncIterator[IndexedChunk]:
        """The async form of :meth:`chunks`."""
        async for delta in self.engine.astream(self.messages, **self.request):
            chunk = delta_to_generation_chunk(delta, self.model)
            if run_manager:
                await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield delta.index, chunk


def aggregate(chunks: Iterable[IndexedChunk], default_model: str) -> ChatResult:
    """One generation per choice, each aggregated from its chunks by LangChain;
    ``llm_output["model_name"]`` is the first choice's model name (else ``default_model``)."""
    by_choice: dict[int, list[ChatGenerationChunk]] = {}
    for index, chunk in chunks:
        by_choice.setdefault(index, []).append(chunk)
    generations = [_generation(by_choice[i]) for i in sorted(by_choice)]
    model_name = generations[0].message.response_metadata.get("model_name", default_model)
    return ChatResult(generations=generations, llm_output={"model_name": model_name})


def _generation(chunks: list[ChatGenerationChunk]) -> ChatGeneration:
    """One choice's chunks as LangChain's ``generate_from_stream`` folds them.

    A final-only call's answer is one chunk. ``generate_from_stream`` first adds that chunk to
    an empty list, which builds and validates a copy of it, and then converts the copy: 32 us
    of the caller's 1.1 ms per input of a 1,024-input ``batch`` here. One chunk is converted as
    LangChain converts the fold (``message_chunk_to_message``, the chunk's
    ``generation_info``); ``tests/test_langchain_unit.py`` checks that both give the same.
    """
    if len(chunks) != 1:
        return generate_from_stream(iter(chunks)).generations[0]
    (chunk,) = chunks
    return ChatGeneration(
        message=message_chunk_to_message(chunk.message),
        generation_info=chunk.generation_info or None,
    )
