"""Structured outputs of ``VLLM``: answers decoded under vLLM's JSON-schema constraint.

:class:`SchemaConstrainedLLM` is the ``FunctionCallingLLM`` layer ``VLLM`` builds on, as
LlamaIndex layers ``FunctionCallingLLM`` on ``LLM``: its ``structured_predict`` (and the async
and streaming forms) asks the chat methods for an answer that follows ``output_cls``'s JSON
schema (:func:`schema_kwargs`), then reads it back: :func:`parse_structured` validates a whole
answer, :class:`PartialParser` (through :func:`partial_objects` / :func:`apartial_objects`)
turns a streaming one into partial objects with LlamaIndex's own partial-JSON parsing. Another
``pydantic_program_mode`` than the default goes to LlamaIndex's programs, as on any LLM.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable, Generator, Iterable, Sequence
from typing import Any, Generic, TypeAlias, cast

import llama_index.core.instrumentation as instrument
from llama_index.core.base.llms.types import ChatResponse
from llama_index.core.bridge.pydantic import BaseModel, ValidationError
from llama_index.core.instrumentation.events.llm import (
    LLMStructuredPredictEndEvent,
    LLMStructuredPredictStartEvent,
)
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import LLM
from llama_index.core.program.utils import FlexibleModel, process_streaming_objects
from llama_index.core.prompts import PromptTemplate
from llama_index.core.types import Model, PydanticProgramMode

__all__ = [
    "PartialObject",
    "PartialParser",
    "SchemaConstrainedLLM",
    "apartial_objects",
    "parse_structured",
    "partial_objects",
    "schema_kwargs",
]

# llama_index.core.instrumentation re-exports get_dispatcher (from llama_index_instrumentation)
# without __all__ or an `as` alias, which mypy's no-implicit-reexport reads as not exported.
dispatcher = instrument.get_dispatcher(__name__)  # type: ignore[attr-defined]

PartialObject: TypeAlias = Model | list[Model] | FlexibleModel | list[FlexibleModel]
"""What a streaming structured answer yields, as ``LLM.stream_structured_predict`` has it."""


class SchemaConstrainedLLM(FunctionCallingLLM):
    """A ``FunctionCallingLLM`` whose chat methods take vLLM's ``structured_outputs`` option:
    its structured predictions are decoded under the output class's JSON schema, so they
    validate (unless cut off by ``max_tokens``)."""

    @dispatcher.span
    def structured_predict(
        self,
        output_cls: type[Model],
        prompt: PromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Model:
        """An ``output_cls`` instance, generated under vLLM's JSON-schema constraint."""
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            # LLM.structured_predict returns a Model; its dispatcher.span decorator hides that.
            other: Model = super().structured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
            return other
        dispatcher.event(
            LLMStructuredPredictStartEvent(
                output_cls=output_cls, template=prompt, template_args=prompt_args
            )
        )
        messages = self._get_messages(prompt, **prompt_args)
        response = self.chat(messages, **schema_kwargs(output_cls, llm_kwargs))
        result = parse_structured(output_cls, response)
        dispatcher.event(LLMStructuredPredictEndEvent(output=result))
        return result

    @dispatcher.span
    async def astructured_predict(
        self,
        output_cls: type[Model],
        prompt: PromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Model:
        """Async :meth:`structured_predict`."""
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            # As in structured_predict: the decorator hides LLM.astructured_predict's type.
            other: Model = await super().astructured_predict(
                output_cls, prompt, llm_kwargs, **prompt_args
            )
            return other
        dispatcher.event(
            LLMStructuredPredictStartEvent(
                output_cls=output_cls, template=prompt, template_args=prompt_args
            )
        )
        messages = self._get_messages(prompt, **prompt_args)
        response = await self.achat(messages, **schema_kwargs(output_cls, llm_kwargs))
        result = parse_structured(output_cls, response)
        dispatcher.event(LLMStructuredPredictEndEvent(output=result))
        return result

    def _structured_stream_call(
        self,
        output_cls: type[Model],
        prompt: PromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Generator[PartialObject[Model], None, None]:
        """Partial objects as the constrained JSON streams (used by ``stream_structured_predict``)."""
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            return super()._structured_stream_call(output_cls, prompt, llm_kwargs, **prompt_args)
        messages = self._get_messages(prompt, **prompt_args)
        responses = self.stream_chat(messages, **schema_kwargs(output_cls, llm_kwargs))
        return partial_objects(self, output_cls, responses)

    async def _structured_astream_call(
        self,
        output_cls: type[Model],
        prompt: PromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> AsyncGenerator[PartialObject[Model], None]:
        """Async form of :meth:`_structured_stream_call`."""
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            return await super()._structured_astream_call(
                output_cls, prompt, llm_kwargs, **prompt_args
            )
        messages = self._get_messages(prompt, **prompt_args)
        responses = await self.astream_chat(messages, **schema_kwargs(output_cls, llm_kwargs))
        return apartial_objects(self, output_cls, responses)


def schema_kwargs(output_cls: type[BaseModel], llm_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """``llm_kwargs`` plus the engine's JSON-schema constraint for ``output_cls``."""
    return {**(llm_kwargs or {}), "structured_outputs": {"json": output_cls.model_json_schema()}}


def parse_structured(output_cls: type[Model], response: ChatResponse) -> Model:
    """``output_cls`` validated from the answer's JSON; a clear ``ValueError`` otherwise."""
    text = response.message.content or ""
    try:
        return output_cls.model_validate_json(text)
    except ValidationError as e:
        finish = response.additional_kwargs.get("finish_reason")
        hint = " Raise max_tokens." if finish == "length" else ""
        msg = f"The model's JSON does not validate as {output_cls.__name__} (finish_reason={finish!r}).{hint} Output: {text[:200]!r}"
        raise ValueError(msg) from e


class PartialParser(Generic[Model]):
    """LlamaIndex's partial-JSON parsing of a streaming structured answer."""

    def __init__(self, llm: LLM, output_cls: type[Model]) -> None:
        self._llm = llm
        self._output_cls = output_cls
        self._objects: Sequence[Model | FlexibleModel] | None = None
        self.last: ChatResponse | None = None

    def __call__(self, response: ChatResponse) -> PartialObject[Model]:
        self.last = response
        # What it returned before goes back in, FlexibleModel objects included, although its
        # signature calls them output_cls objects.
        previous = cast("Sequence[Model] | None", self._objects)
        obj = process_streaming_objects(
            response, self._output_cls, cur_objects=previous, flexible_mode=True, llm=self._llm
        )
        self._objects = obj if isinstance(obj, list) else [obj]
        return obj

    def finish(self) -> list[Model]:
        """The validated object, if the last partial one was not complete yet (raises if the
        whole answer does not validate)."""
        if self.last is None:
            return []
        final = parse_structured(self._output_cls, self.last)
        done = self._objects is not None and isinstance(self._objects[0], self._output_cls)
        return [] if done else [final]


def partial_objects(
    llm: LLM, output_cls: type[Model], responses: Iterable[ChatResponse]
) -> Generator[PartialObject[Model], None, None]:
    """A partial object per streamed response, then the validated whole one if the last
    partial object was not it."""
    parse = PartialParser(llm, output_cls)
    for response in responses:
        yield parse(response)
    yield from parse.finish()


async def apartial_objects(
    llm: LLM, output_cls: type[Model], responses: AsyncIterable[ChatResponse]
) -> AsyncGenerator[PartialObject[Model], None]:
    """The async form of :func:`partial_objects`."""
    parse = PartialParser(llm, output_cls)
    async for response in responses:
        yield parse(response)
    for final in parse.finish():
        yield final
