"""The least a LangChain chat model and a LlamaIndex LLM can do over ``Engine.astream``, streaming
(``astream``, ``astream_chat``) and in bulk (``ainvoke``/``abatch``, ``achat``).

A BENCHMARK BASELINE, NOT PART OF THE PACKAGE. :class:`BareChatModel` and :class:`BareLLM` wrap
each engine delta in the framework's message type and nothing else: no converters, no tool or
reasoning parts, no usage (but the token count in bulk), no callbacks of their own. The framework's own streaming entry point
(``BaseChatModel.astream``, LlamaIndex's ``llm_chat_callback``) still runs around them, as it
runs around every integration. ``gpu_sim.py`` (streams) and ``bulk.py`` (one final-only request
per input) measure them next to ``ChatVLLM`` and ``VLLM``:
what they cost over ``Engine.astream`` is the framework's own per-chunk work, which no
integration can avoid; what ``ChatVLLM`` and ``VLLM`` cost over them is ours.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.llms.callbacks import llm_chat_callback
from llama_index.core.llms.llm import LLM

__all__ = ["BareChatModel", "BareLLM"]


class BareChatModel(BaseChatModel):
    """A LangChain chat model whose only work is one ``AIMessageChunk`` per engine delta."""

    engine: Any
    """The ``vllm_inline.engine.Engine`` to stream from."""

    @property
    def _llm_type(self) -> str:
        return "bare-benchmark-baseline"

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        raise NotImplementedError("a baseline: use astream, ainvoke or abatch")

    async def _agenerate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        """One final-only request (``bulk.py``'s bulk baseline): the answer as one message."""
        wire = [{"role": "user", "content": str(m.content)} for m in messages]
        text, usage = "", None
        async for delta in self.engine.astream(wire, stream=False, **kwargs):
            text += delta.text
            usage = delta.usage or usage
        message = AIMessage(
            content=text,
            usage_metadata=UsageMetadata(
                input_tokens=usage.prompt_tokens,
                output_tokens=usage.completion_tokens,
                total_tokens=usage.prompt_tokens + usage.completion_tokens,
            ),
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _astream(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> AsyncIterator[ChatGenerationChunk]:
        wire = [{"role": "user", "content": str(m.content)} for m in messages]
        async for delta in self.engine.astream(wire, **kwargs):
            yield ChatGenerationChunk(message=AIMessageChunk(content=delta.text))


def _unused(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError("a streaming baseline: use astream_chat")


class BareLLM(LLM):
    """A LlamaIndex LLM whose only work is one cumulative ``ChatResponse`` per engine delta."""

    engine: Any = None
    """The ``vllm_inline.engine.Engine`` to stream from."""

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(is_chat_model=True, model_name="bare-benchmark-baseline")

    @llm_chat_callback()
    async def astream_chat(
        self, messages: Sequence[ChatMessage], **kwargs: Any
    ) -> ChatResponseAsyncGen:
        wire = [{"role": m.role.value, "content": m.content or ""} for m in messages]

        async def gen() -> ChatResponseAsyncGen:
            text = ""
            async for delta in self.engine.astream(wire, **kwargs):
                text += delta.text
                yield ChatResponse(
                    message=ChatMessage(role=MessageRole.ASSISTANT, content=text),
                    delta=delta.text,
                )

        return gen()

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """One final-only request (``bulk.py``'s bulk baseline): the answer as one response."""
        wire = [{"role": m.role.value, "content": m.content or ""} for m in messages]
        text, tokens = "", 0
        async for delta in self.engine.astream(wire, stream=False, **kwargs):
            text += delta.text
            tokens += len(delta.token_ids)
        return ChatResponse(
            message=ChatMessage(role=MessageRole.ASSISTANT, content=text),
            additional_kwargs={"completion_tokens": tokens},
        )

    chat = complete = stream_chat = stream_complete = _unused
    acomplete = astream_complete = _unused
