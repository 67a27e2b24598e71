"""``VLLM``: a LlamaIndex ``FunctionCallingLLM`` on the shared in-process vLLM engine.

One streaming path per side: :meth:`VLLM.stream_chat` iterates :meth:`Engine.stream` and
:meth:`VLLM.astream_chat` iterates :meth:`Engine.astream`; every other method (non-streaming
chat, completions, tools, structured outputs) is built on those two, the non-streaming ones
with the engine's ``stream=False`` (the final answer as one delta: no per-token work).

The class is the LlamaIndex surface; the work is in the modules beside it: :mod:`.request`
(fields and call arguments into one request), :mod:`.utils` (messages to the engine, deltas
back as responses), :mod:`.tools` (tool calling), :mod:`.structured` (structured outputs, the
class ``VLLM`` builds on).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

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
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.llm import ToolSelection

from vllm_inline.engine import Engine, get_engine
from vllm_inline.engine.host.directory import KEEP_ALIVE_HELP, parse_keep_alive
from vllm_inline.engine.request.sampling import DEFAULTS, check_sampling

from .metadata import MultimodalLLMMetadata, takes_images
from .request import REQUEST_FIELDS, SAMPLING_FIELDS, request_kwargs
from .structured import SchemaConstrainedLLM
from .tools import chat_with_tools_kwargs, keep_first_tool_call, tool_calls_of
from .utils import (
    ResponseBuilder,
    aaggregate,
    aggregate,
    to_completion_response,
    to_engine_messages,
)

if TYPE_CHECKING:
    from llama_index.core.tools.types import BaseTool

__all__ = ["VLLM"]


class VLLM(SchemaConstrainedLLM):
    """vLLM running inside this process, as a LlamaIndex LLM (chat, completion, tools).

    Objects on the same ``model`` and ``vllm_kwargs`` (including LangChain ``ChatVLLM`` ones)
    share one engine, which starts on first use.

    >>> llm = VLLM(model="Qwen/Qwen3-0.6B", vllm_kwargs={"dtype": "bfloat16"}, max_tokens=256)
    >>> for r in llm.stream_complete("Tell me a joke"):
    ...     print(r.delta, end="")

    Sampling values left ``None`` fall back to the model's ``generation_config`` and then to
    vllm-inline's defaults. Structured outputs (``structured_predict`` and its forms) are
    decoded under vLLM's JSON-schema constraint (:class:`~.structured.SchemaConstrainedLLM`).
    """

    model: str = Field(description="Model path or hub id.")
    vllm_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Options for vLLM's AsyncEngineArgs (dtype, max_model_len, ...). Default: {}.",
    )
    keep_alive: str | int | float | None = Field(default=None, description=KEEP_ALIVE_HELP)
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
    reasoning_effort: str | None = Field(
        default=None,
        description="OpenAI's reasoning_effort ('none', 'low', 'medium', 'high', ...), as vllm "
        "serve takes it: a chat-template variable, and enable_thinking (False for 'none') unless "
        "chat_template_kwargs sets it. Default: None (the template's default).",
    )
    additional_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Other vLLM sampling values and request options (seed, top_k, min_p, "
        "bad_words, allowed_token_ids, cache_salt, include_reasoning, ...: docs/server.md's "
        "field table). Default: {}.",
    )

    _engine: Engine | None = PrivateAttr(default=None)
    _context_window: int | None = PrivateAttr(default=None)

    def __init__(self, model: str | None = None, **data: Any) -> None:
        if model is not None:
            data["model"] = model
        # Refuse bad sampling values with the engine's typed error, before anything starts.
        check_sampling({k: data[k] for k in SAMPLING_FIELDS if data.get(k) is not None})
        check_sampling(data.get("additional_kwargs") or {})
        parse_keep_alive(data.get("keep_alive"))
        super().__init__(**data)

    @classmethod
    def class_name(cls) -> str:
        return "VLLMInline"

    # -- engine and metadata ---------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        """The shared engine for ``model`` and ``vllm_kwargs`` (not started by reading this)."""
        if self._engine is None:
            self._engine = get_engine(self.model, keep_alive=self.keep_alive, **self.vllm_kwargs)
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
        request = request_kwargs(
            {k: getattr(self, k) for k in SAMPLING_FIELDS},
            {k: getattr(self, k) for k in REQUEST_FIELDS},
            self.additional_kwargs,
            kwargs,
        )
        request["stream"] = stream
        if prompt is not None:
            request["prompt"] = prompt
        else:
            request["messages"] = to_engine_messages(messages or [])
        return request

    def _stream(self, request: dict[str, Any]) -> ChatResponseGen:
        """The one sync path: the engine's deltas as cumulative responses (a bad request
        raises here, at the call, not at the first response)."""
        return ResponseBuilder().responses(self.engine.stream(**request))

    def _astream(self, request: dict[str, Any]) -> ChatResponseAsyncGen:
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
        return chat_with_tools_kwargs(
            tools,
            user_msg,
            chat_history,
            tool_required=tool_required,
            tool_choice=tool_choice,
            kwargs=kwargs,
        )

    def _validate_chat_with_tools_response(
        self,
        response: ChatResponse,
        tools: Sequence[BaseTool],
        allow_parallel_tool_calls: bool = False,
        **kwargs: Any,
    ) -> ChatResponse:
        """Keep only the first tool call unless parallel calls are allowed."""
        return response if allow_parallel_tool_calls else keep_first_tool_call(response)

    def get_tool_calls_from_response(
        self, response: ChatResponse, error_on_no_tool_call: bool = True, **kwargs: Any
    ) -> list[ToolSelection]:
        """The tool calls vLLM's tool parser found, as ``ToolSelection`` objects."""
        return tool_calls_of(response, error_on_no_tool_call)
