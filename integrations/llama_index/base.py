"""``VLLM``: a LlamaIndex ``FunctionCallingLLM`` on the shared in-process vLLM engine.

One streaming path per side: :meth:`VLLM.stream_chat` iterates :meth:`Engine.stream` and
:meth:`VLLM.astream_chat` iterates :meth:`Engine.astream`; every other method (non-streaming
chat, completions, tools, structured outputs) is built on those two, the non-streaming ones
with the engine's ``stream=False`` (the final answer as one delta: no per-token work).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import llama_index.core.instrumentation as instrument
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
    ToolCallBlock,
)
from llama_index.core.bridge.pydantic import BaseModel, Field, PrivateAttr
from llama_index.core.instrumentation.events.llm import (
    LLMStructuredPredictEndEvent,
    LLMStructuredPredictStartEvent,
)
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.prompts import PromptTemplate
from llama_index.core.types import Model, PydanticProgramMode

from vllm_inline.engine import BadRequestError, Engine, get_engine
from vllm_inline.engine.request.sampling import DEFAULTS, check_sampling, layer_sampling

from .utils import (
    MultimodalLLMMetadata,
    PartialParser,
    ResponseBuilder,
    aaggregate,
    aggregate,
    parse_structured,
    takes_images,
    to_completion_response,
    to_engine_messages,
    tool_selections,
)

if TYPE_CHECKING:
    from llama_index.core.tools.types import BaseTool

__all__ = ["VLLM"]

dispatcher = instrument.get_dispatcher(__name__)

_SAMPLING_FIELDS = ("temperature", "max_tokens", "top_p", "repetition_penalty", "stop")
_REQUEST_OPTIONS = (
    "tools",
    "tool_choice",
    "structured_outputs",
    "chat_template",
    "chat_template_kwargs",
    "tool_parser",
    "reasoning_parser",
    "lora",
    "timeout",
    "priority",
)


class VLLM(FunctionCallingLLM):
    """vLLM running inside this process, as a LlamaIndex LLM (chat, completion, tools).

    Objects on the same ``model`` and ``vllm_kwargs`` (including LangChain ``ChatVLLM`` ones)
    share one engine, which starts on first use.

    >>> llm = VLLM(model="Qwen/Qwen3-0.6B", vllm_kwargs={"dtype": "bfloat16"}, max_tokens=256)
    >>> for r in llm.stream_complete("Tell me a joke"):
    ...     print(r.delta, end="")

    Sampling values left ``None`` fall back to the model's ``generation_config`` and then to
    vllm-inline's defaults.
    """

    model: str = Field(description="Model path or hub id.")
    vllm_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Options for vLLM's AsyncEngineArgs (dtype, max_model_len, ...). Default: {}.",
    )
    temperature: float | None = Field(
        default=None, description="Sampling temperature. Default: None (model's default)."
    )
    max_tokens: int | None = Field(
        default=None, description="Most tokens to generate. Default: None (engine default, 512)."
    )
    top_p: float | None = Field(default=None, description="Nucleus sampling share. Default: None.")
    repetition_penalty: float | None = Field(
        default=None, description="Repetition penalty. Default: None (model's default or 1.1)."
    )
    stop: list[str] | None = Field(
        default=None, description="Extra stop strings (the model's stop tokens always apply)."
    )
    chat_template: str | None = Field(
        default=None, description="Jinja chat template replacing the model's. Default: None."
    )
    chat_template_kwargs: dict[str, Any] | None = Field(
        default=None,
        description="Extra chat-template variables, e.g. {'enable_thinking': False}. Default: None.",
    )
    tool_parser: str | None = Field(
        default=None,
        description="vLLM tool parser ('hermes', 'llama3_json', ...). Set it to mark the model "
        "as function calling. Default: None (family default when tools are sent).",
    )
    reasoning_parser: str | None = Field(
        default=None,
        description="vLLM reasoning parser ('qwen3', 'deepseek_r1', ...): reasoning is kept out "
        "of the content and returned as a ThinkingBlock. Default: None.",
    )
    lora: str | tuple[str, str] | dict[str, str] | None = Field(
        default=None,
        description="LoRA adapter for every call: a local PEFT adapter directory, a (name, path) "
        "pair, or the name of an adapter the engine has seen; a call's lora=... replaces it "
        "(lora=None: the base model). "
        "Needs vllm_kwargs={'enable_lora': True, 'max_lora_rank': ...}. Default: None (base model).",
    )
    timeout: float | None = Field(
        default=None,
        description="Seconds a call may run; then it is aborted in the engine and raises "
        "RequestTimeoutError (a stream, after the responses it delivered). A call's timeout=... "
        "replaces it. Default: None (no deadline).",
    )
    priority: int | None = Field(
        default=None,
        description="vLLM's scheduling priority, lower first (a call's priority=... replaces "
        "it). Needs vllm_kwargs={'scheduling_policy': 'priority'}. Default: None (0).",
    )
    additional_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Other vLLM sampling values (seed, top_k, min_p, ...). Default: {}.",
    )

    _engine: Engine | None = PrivateAttr(default=None)
    _context_window: int | None = PrivateAttr(default=None)

    def __init__(self, model: str | None = None, **data: Any) -> None:
        if model is not None:
            data["model"] = model
        # Refuse bad sampling values with the engine's typed error, before anything starts.
        check_sampling({k: data[k] for k in _SAMPLING_FIELDS if data.get(k) is not None})
        check_sampling(data.get("additional_kwargs") or {})
        super().__init__(**data)

    @classmethod
    def class_name(cls) -> str:
        return "VLLMInline"

    # -- engine and metadata ---------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        """The shared engine for ``model`` and ``vllm_kwargs`` (not started by reading this)."""
        if self._engine is None:
            self._engine = get_engine(self.model, **self.vllm_kwargs)
        return self._engine

    def _known_context_window(self) -> int | None:
        """The context window if it is known without starting the engine."""
        if self._context_window is None:
            configured = self.vllm_kwargs.get("max_model_len")
            if self.engine.started:
                self._context_window = self.engine.max_model_len
            elif (
                isinstance(configured, int) and not isinstance(configured, bool) and configured > 0
            ):
                self._context_window = configured
        return self._context_window

    @property
    def context_window(self) -> int:
        """The engine's ``max_model_len``: read from a running engine, else from
        ``vllm_kwargs["max_model_len"]``, else by starting the engine (once). Cached."""
        window = self._known_context_window()
        if window is None:
            window = self._context_window = self.engine.max_model_len
        return window

    @property
    def metadata(self) -> LLMMetadata:
        """LLM metadata. ``num_output`` is ``max_tokens``, or when unset the engine default
        capped at a quarter of the context window (the engine clamps to what fits anyway)."""
        window = self.context_window
        num_output = self.max_tokens
        if num_output is None:
            num_output = min(int(DEFAULTS["max_tokens"]), max(1, window // 4))
        return MultimodalLLMMetadata(
            context_window=window,
            num_output=num_output,
            model_name=self.model,
            is_chat_model=True,
            is_function_calling_model=self.tool_parser is not None,
            is_multimodal=takes_images(self.engine, self.model),
        )

    def to_payload(self) -> dict[str, Any]:
        """What callbacks and instrumentation events show of this LLM (read on every call).

        Unlike :attr:`metadata` it never starts the engine, so the first ``achat`` does not
        block the event loop here: ``context_window`` is left out until it is known.
        """
        payload: dict[str, Any] = {
            "class_name": self.class_name(),
            "model_name": self.model,
            "is_chat_model": True,
            "is_function_calling_model": self.tool_parser is not None,
        }
        if self._known_context_window() is not None:
            payload.update(self.metadata.model_dump())
        return payload

    # -- requests ----------------------------------------------------------------------------

    def _request(
        self,
        kwargs: dict[str, Any],
        messages: Sequence[ChatMessage] | None = None,
        prompt: str | None = None,
        stream: bool = True,
    ) -> dict[str, Any]:
        """Engine arguments for one call: fields under call kwargs (the engine checks them when
        :meth:`_stream` or :meth:`_astream` hands them over, before anything starts)."""
        kwargs = dict(kwargs)
        if kwargs.get("stop") is not None and self.stop is not None:
            raise BadRequestError(
                "stop was given both to VLLM(...) and to this call; pass it one way.",
                parameter="stop",
                value=kwargs["stop"],
            )
        options = {k: kwargs.pop(k) for k in _REQUEST_OPTIONS if k in kwargs}
        fields = {k: getattr(self, k) for k in _SAMPLING_FIELDS}
        sampling = layer_sampling(fields, self.additional_kwargs, kwargs)
        if sampling.get("n", 1) != 1:
            raise BadRequestError.invalid(
                "n", sampling["n"], "VLLM returns one answer: n must be 1"
            )
        request = layer_sampling(
            {
                "chat_template": self.chat_template,
                "chat_template_kwargs": self.chat_template_kwargs,
                "tool_parser": self.tool_parser,
                "reasoning_parser": self.reasoning_parser,
                "lora": self.lora,
                "timeout": self.timeout,
                "priority": self.priority,
            },
            options,
            sampling,
        )
        if "lora" in options and options["lora"] is None:
            request.pop("lora", None)  # a call's lora=None: the base model, whatever the field
        request["stream"] = stream
        if prompt is not None:
            request["prompt"] = prompt
        else:
            request["messages"] = to_engine_messages(messages or [])
        return request

    def _stream(self, request: dict[str, Any]) -> Iterator[ChatResponse]:
        """The one sync path: the engine's deltas as cumulative responses (a bad request
        raises here, at the call, not at the first response)."""
        return ResponseBuilder().responses(self.engine.stream(**request))

    def _astream(self, request: dict[str, Any]) -> AsyncIterator[ChatResponse]:
        """The one async path: the engine's deltas as cumulative responses."""
        return ResponseBuilder().aresponses(self.engine.astream(**request))

    def _chat_request(
        self, prompt: str, formatted: bool, kwargs: dict[str, Any], stream: bool = True
    ) -> dict[str, Any]:
        """A completion as a request: through the chat template, or as is (``formatted``)."""
        if formatted:
            return self._request(kwargs, prompt=prompt, stream=stream)
        message = ChatMessage(role=MessageRole.USER, content=prompt)
        return self._request(kwargs, messages=[message], stream=stream)

    # -- chat ------------------------------------------------------------------------------

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Chat; the aggregate of :meth:`stream_chat`."""
        return aggregate(self._stream(self._request(kwargs, messages, stream=False)))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        """Stream one cumulative ``ChatResponse`` (with ``delta``) per engine delta."""
        return self._stream(self._request(kwargs, messages))

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Async chat; the aggregate of :meth:`astream_chat`."""
        return await aaggregate(self._astream(self._request(kwargs, messages, stream=False)))

    @llm_chat_callback()
    async def astream_chat(
        self, messages: Sequence[ChatMessage], **kwargs: Any
    ) -> ChatResponseAsyncGen:
        """Async stream; never blocks the event loop (the engine runs on its own thread)."""
        return self._astream(self._request(kwargs, messages))

    # -- completion ------------------------------------------------------------------------

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Complete ``prompt`` as a user turn (chat template), or as is with ``formatted=True``."""
        request = self._chat_request(prompt, formatted, kwargs, stream=False)
        return to_completion_response(aggregate(self._stream(request)))

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        """Stream a completion (see :meth:`complete`), one response per engine delta."""
        responses = self._stream(self._chat_request(prompt, formatted, kwargs))
        return (to_completion_response(r) for r in responses)

    @llm_completion_callback()
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        """Async :meth:`complete`."""
        request = self._chat_request(prompt, formatted, kwargs, stream=False)
        return to_completion_response(await aaggregate(self._astream(request)))

    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        """Async :meth:`stream_complete`."""
        responses = self._astream(self._chat_request(prompt, formatted, kwargs))

        async def gen() -> CompletionResponseAsyncGen:
            async for response in responses:
                yield to_completion_response(response)

        return gen()

    # -- tools -----------------------------------------------------------------------------

    def _prepare_chat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        tool_choice: str | dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Chat arguments with OpenAI-style tool schemas; ``tool_required`` forces a call
        (the engine constrains the output with structured outputs)."""
        messages = list(chat_history or [])
        if isinstance(user_msg, str):
            user_msg = ChatMessage(role=MessageRole.USER, content=user_msg)
        if user_msg is not None:
            messages.append(user_msg)
        specs = [tool.metadata.to_openai_tool(skip_length_check=True) for tool in tools]
        if not specs:
            return {"messages": messages, **kwargs}
        if tool_required:
            tool_choice = "required"
        return {
            "messages": messages,
            "tools": specs,
            "tool_choice": tool_choice if tool_choice is not None else "auto",
            **kwargs,
        }

    def _validate_chat_with_tools_response(
        self,
        response: ChatResponse,
        tools: Sequence[BaseTool],
        allow_parallel_tool_calls: bool = False,
        **kwargs: Any,
    ) -> ChatResponse:
        """Keep only the first tool call unless parallel calls are allowed."""
        if allow_parallel_tool_calls:
            return response
        message = response.message
        calls = [b for b in message.blocks if isinstance(b, ToolCallBlock)]
        if len(calls) > 1:
            message.blocks = [
                b for b in message.blocks if not isinstance(b, ToolCallBlock)
            ] + calls[:1]
            message.additional_kwargs["tool_calls"] = message.additional_kwargs["tool_calls"][:1]
        return response

    def get_tool_calls_from_response(
        self, response: ChatResponse, error_on_no_tool_call: bool = True, **kwargs: Any
    ) -> list[ToolSelection]:
        """The tool calls vLLM's tool parser found, as ``ToolSelection`` objects."""
        selections = tool_selections(response.message.blocks)
        if not selections and error_on_no_tool_call:
            msg = (
                f"Expected at least one tool call, but the model answered with text: "
                f"{(response.message.content or '')[:200]!r}"
            )
            raise ValueError(msg)
        return selections

    # -- structured outputs ----------------------------------------------------------------

    def _structured_request(
        self,
        output_cls: type[BaseModel],
        prompt: PromptTemplate,
        llm_kwargs: dict[str, Any] | None,
        prompt_args: dict[str, Any],
    ) -> tuple[list[ChatMessage], dict[str, Any]]:
        messages = self._get_messages(prompt, **prompt_args)
        kwargs = {
            **(llm_kwargs or {}),
            "structured_outputs": {"json": output_cls.model_json_schema()},
        }
        return messages, kwargs

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
            return super().structured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        dispatcher.event(
            LLMStructuredPredictStartEvent(
                output_cls=output_cls, template=prompt, template_args=prompt_args
            )
        )
        messages, kwargs = self._structured_request(output_cls, prompt, llm_kwargs, prompt_args)
        result = parse_structured(output_cls, self.chat(messages, **kwargs))
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
            return await super().astructured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        dispatcher.event(
            LLMStructuredPredictStartEvent(
                output_cls=output_cls, template=prompt, template_args=prompt_args
            )
        )
        messages, kwargs = self._structured_request(output_cls, prompt, llm_kwargs, prompt_args)
        result = parse_structured(output_cls, await self.achat(messages, **kwargs))
        dispatcher.event(LLMStructuredPredictEndEvent(output=result))
        return result

    def _structured_stream_call(
        self,
        output_cls: type[Model],
        prompt: PromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Any:
        """Partial objects as the constrained JSON streams (used by ``stream_structured_predict``)."""
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            return super()._structured_stream_call(output_cls, prompt, llm_kwargs, **prompt_args)
        messages, kwargs = self._structured_request(output_cls, prompt, llm_kwargs, prompt_args)
        responses = self.stream_chat(messages, **kwargs)

        def gen() -> Iterator[Any]:
            parse = PartialParser(self, output_cls)
            for response in responses:
                yield parse(response)
            yield from parse.finish()

        return gen()

    async def _structured_astream_call(
        self,
        output_cls: type[Model],
        prompt: PromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Any:
        """Async form of :meth:`_structured_stream_call`."""
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            return await super()._structured_astream_call(
                output_cls, prompt, llm_kwargs, **prompt_args
            )
        messages, kwargs = self._structured_request(output_cls, prompt, llm_kwargs, prompt_args)
        responses = await self.astream_chat(messages, **kwargs)

        async def gen() -> AsyncIterator[Any]:
            parse = PartialParser(self, output_cls)
            async for response in responses:
                yield parse(response)
            for final in parse.finish():
                yield final

        return gen()
