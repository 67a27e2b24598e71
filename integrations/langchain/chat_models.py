"""``ChatVLLM``: a LangChain chat model that runs vLLM in this process.

Streaming is the one path (:mod:`.streaming`): :meth:`ChatVLLM._astream` turns each engine
delta into one ``AIMessageChunk`` as it arrives, :meth:`ChatVLLM._stream` does the same through
the engine's synchronous bridge, and ``_generate``/``_agenerate`` aggregate those streams (a
final-only one, the whole answer as one delta, when no callback wants tokens:
:mod:`.token_callbacks`). Messages go to the engine through the converters of :mod:`.convert`;
``bind_tools`` and ``with_structured_output`` are built in :mod:`.structured_output`.

>>> from vllm_inline.integrations.langchain import ChatVLLM
>>> chat = ChatVLLM(model="Qwen/Qwen3-0.6B", reasoning_parser="qwen3", max_tokens=256)
>>> for chunk in chat.stream("Why is the sky blue?"):
...     print(chunk.text, end="", flush=True)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LangSmithParams, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field, model_validator
from typing_extensions import Self

from vllm_inline.engine import Engine, get_engine
from vllm_inline.engine.host.directory import parse_keep_alive
from vllm_inline.engine.request.sampling import check_sampling

from .batching import BatchAtOnce
from .convert import convert_message_to_dict, request_kwargs
from .kept_chunks import FoldedStreams
from .streaming import EngineCall, aggregate
from .structured_output import StructuredMethod, ToolLike, structured_output, tool_binding
from .token_callbacks import wants_tokens

__all__ = ["ChatVLLM"]

_SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "repetition_penalty",
    "stop",
    "seed",
    "logprobs",
    "n",
)
_REQUEST_FIELDS = (
    "chat_template",
    "chat_template_kwargs",
    "tool_parser",
    "reasoning_parser",
    "lora",
    "timeout",
    "priority",
    "reasoning_effort",
)


class ChatVLLM(BatchAtOnce, FoldedStreams, BaseChatModel):
    """vLLM in this process as a LangChain chat model: streaming, tools, structured output.

    Every ``ChatVLLM`` on the same ``model`` and ``vllm_kwargs`` shares one engine (and its
    continuous batching). Constructing one starts nothing; the engine starts on the first call.
    ``batch``/``abatch`` hand every input to the engine at once (:mod:`.batching`).

    Example:
        ```python
        from vllm_inline.integrations.langchain import ChatVLLM

        chat = ChatVLLM(
            model="Qwen/Qwen2.5-0.5B-Instruct",
            vllm_kwargs={"dtype": "bfloat16", "max_model_len": 4096},
            temperature=0.2,
            max_tokens=256,
        )
        chat.invoke("Name three moons of Jupiter.").content
        ```
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    model: str
    """Model path or hub id (required)."""

    vllm_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Options for vLLM's engine (``dtype``, ``max_model_len``, ``tensor_parallel_size``, ...).
    Default ``{}``: vLLM's own defaults."""

    keep_alive: str | int | float | None = None
    """Load the model once per host: the engine runs in a process of its own that every process
    of yours attaches to, and stays loaded this long after the last one is gone (``"10m"``,
    ``"1h"``, seconds, ``0``: until the last process is gone, ``-1``: until ``python -m
    vllm_inline engines stop``; docs/host.md). Default ``None``: ``$VLLMINLINE_KEEP_ALIVE``,
    else the engine lives and dies with this process."""

    temperature: float | None = None
    """Sampling temperature in [0, 2]; 0 is greedy. Default ``None``: the model's
    generation_config value, else vLLM's."""

    top_p: float | None = None
    """Nucleus sampling mass in (0, 1]. Default ``None``: the model's default."""

    top_k: int | None = None
    """Sample among the k most likely tokens (-1 or 0: all). Default ``None``: the model's."""

    max_tokens: int | None = None
    """Most tokens to generate. Default ``None``: 512, capped by the context window."""

    repetition_penalty: float | None = None
    """Penalty > 1 discourages repeats. Default ``None``: the model's, else 1.1."""

    stop: list[str] | None = None
    """Strings that end generation (not included in the output). A call's ``stop`` replaces
    these. Default ``None``: only the model's end-of-turn tokens."""

    seed: int | None = None
    """Random seed for sampling, per request. Default ``None``: not seeded."""

    logprobs: bool | int | None = None
    """``True`` puts each generated token's logprob in ``response_metadata["logprobs"]``; an
    int k adds the k most likely alternatives. Default ``None``: no logprobs."""

    n: int | None = None
    """Choices per request; ``generate`` returns each as its own generation (``stream``
    interleaves their chunks). Default ``None`` (one)."""

    chat_template: str | None = None
    """A Jinja chat template overriding the tokenizer's. Default ``None``: the model's
    template (or a family fallback)."""

    chat_template_kwargs: dict[str, Any] | None = None
    """Extra variables for the chat template (e.g. ``{"enable_thinking": False}``). Default
    ``None``."""

    tool_parser: str | None = None
    """vLLM tool parser name (``hermes``, ``llama3_json``, ``mistral``, ...). Default ``None``:
    chosen by model family when tools are bound."""

    reasoning_parser: str | None = None
    """vLLM reasoning parser name (``qwen3``, ``deepseek_r1``, ...); reasoning then goes to
    ``additional_kwargs["reasoning_content"]``, never to ``content``. Default ``None``."""

    lora: str | tuple[str, str] | dict[str, str] | None = None
    """LoRA adapter for every call: a local PEFT adapter directory, a ``(name, path)`` pair, or
    the name of an adapter the engine has seen; a call's ``lora=`` (or ``.bind(lora=...)``)
    replaces it, and a call's ``lora=None`` uses the base model. Needs
    ``vllm_kwargs={"enable_lora": True, "max_lora_rank": ...}``. Default ``None``: the base
    model."""

    timeout: float | None = None
    """Seconds a call may run; then it is aborted in the engine and raises
    ``RequestTimeoutError`` (a stream, after the chunks it delivered). A call's
    ``timeout=`` replaces it. Default ``None``: no deadline."""

    priority: int | None = None
    """vLLM's scheduling priority of every call, lower first (a call's ``priority=`` replaces
    it). Needs ``vllm_kwargs={"scheduling_policy": "priority"}``. Default ``None`` (0)."""

    reasoning_effort: str | None = None
    """OpenAI's ``reasoning_effort`` (``"none"``, ``"minimal"``, ``"low"``, ``"medium"``,
    ``"high"``, ...), as ``vllm serve`` takes it: a chat-template variable, and
    ``enable_thinking`` (``False`` for ``"none"``) unless ``chat_template_kwargs`` sets it. A
    call's ``reasoning_effort=`` replaces it. Default ``None``: the template's default."""

    extra_sampling: dict[str, Any] = Field(default_factory=dict)
    """Other vLLM sampling values and request options for every call (``min_p``,
    ``presence_penalty``, ``ignore_eos``, ``bad_words``, ``allowed_token_ids``,
    ``thinking_token_budget``, ``cache_salt``, ``include_reasoning``, ...: docs/server.md's
    field table, kinds ``sampling``, ``prompt`` and ``request``); a field's name
    (``temperature``, ``stop``, ...) is refused here. Default ``{}``."""

    streaming: bool = False
    """``True``: ``invoke`` streams (LangChain calls ``_stream`` and fires ``on_llm_new_token``
    per chunk). ``False``: ``invoke``/``batch`` still stream when a callback implements
    ``on_llm_new_token``, else ask the engine for the final answer only (same message, no
    per-token work; see :mod:`.token_callbacks`). Default ``False``."""

    @model_validator(mode="after")
    def _check_fields(self) -> Self:
        # As ChatOpenAI does with model_kwargs: a field's name in extra_sampling is refused, so
        # that each value has one place (an unset field would otherwise hide it).
        for name in (*_SAMPLING_FIELDS, *_REQUEST_FIELDS):
            if name in self.extra_sampling:
                value = self.extra_sampling[name]
                msg = (
                    f"extra_sampling[{name!r}]={value!r}: `{name}` is a ChatVLLM field; pass "
                    f"ChatVLLM({name}=...) (or {name}=... in the call) instead."
                )
                raise ValueError(msg)
        check_sampling(self._instance_sampling())
        parse_keep_alive(self.keep_alive)
        return self

    # -- identity ------------------------------------------------------------------------

    @classmethod
    def is_lc_serializable(cls) -> bool:
        """``dumpd``/``load`` round-trip a ``ChatVLLM`` (its fields hold no secrets)."""
        return True

    @classmethod
    def get_lc_namespace(cls) -> list[str]:
        """The import path ``load`` finds the class under."""
        return ["vllm_inline", "integrations", "langchain"]

    @property
    def _llm_type(self) -> str:
        return "vllm-inline"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": self.model, "vllm_kwargs": self.vllm_kwargs, **self._instance_request()}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = LangSmithParams(
            ls_provider="vllm", ls_model_name=kwargs.get("model", self.model), ls_model_type="chat"
        )
        temperature = kwargs.get("temperature", self.temperature)
        if temperature is not None:
            params["ls_temperature"] = float(temperature)
        max_tokens = kwargs.get("max_tokens", self.max_tokens)
        if max_tokens is not None:
            params["ls_max_tokens"] = max_tokens
        ls_stop = stop if stop is not None else self.stop
        if ls_stop:
            params["ls_stop"] = list(ls_stop)
        return params

    @property
    def engine(self) -> Engine:
        """The shared engine for ``model`` and ``vllm_kwargs`` (looked up, not started)."""
        return get_engine(self.model, keep_alive=self.keep_alive, **self.vllm_kwargs)

    # -- token counts --------------------------------------------------------------------

    def get_token_ids(self, text: str) -> list[int]:
        """Ids of ``text`` under the model's own tokenizer, without special tokens (starts the
        engine). ``custom_get_token_ids``, when set, is used instead."""
        if self.custom_get_token_ids is not None:
            return self.custom_get_token_ids(text)
        return list(self.engine.tokenizer.encode(text, add_special_tokens=False))

    def get_num_tokens_from_messages(
        self,
        messages: list[BaseMessage],
        tools: Sequence[ToolLike] | None = None,
    ) -> int:
        """The exact prompt size of ``messages`` (and ``tools``): rendered by the model's chat
        template as a call sends them, generation prompt included (starts the engine).

        This is what ``trim_messages(..., token_counter=chat)`` counts with. A chat template
        that refuses the messages (e.g. roles that do not alternate) raises
        ``ChatTemplateError``; ``langchain_core.messages.utils.count_tokens_approximately``
        counts any list.
        """
        wire = [convert_message_to_dict(m, f"messages[{i}]") for i, m in enumerate(messages)]
        formatted = [convert_to_openai_tool(t) for t in tools] if tools else None
        ids = self.engine.prompt_token_ids(
            wire,
            tools=formatted,
            chat_template=self.chat_template,
            chat_template_kwargs=self.chat_template_kwargs,
        )
        return len(ids)

    # -- requests ------------------------------------------------------------------------

    def _instance_sampling(self) -> dict[str, Any]:
        values = {**self.extra_sampling, **{k: getattr(self, k) for k in _SAMPLING_FIELDS}}
        return {k: v for k, v in values.items() if v is not None}

    def _instance_request(self) -> dict[str, Any]:
        """This model's own request values (sampling and request fields, ``extra_sampling``),
        unset ones left out."""
        fields = {k: getattr(self, k) for k in _REQUEST_FIELDS}
        return {**self._instance_sampling(), **{k: v for k, v in fields.items() if v is not None}}

    def _prepare(
        self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]
    ) -> EngineCall:
        """One call resolved: its engine, model name, wire messages and engine kwargs.

        A call's ``model=...`` picks another model's shared engine (same ``vllm_kwargs``).
        """
        model = kwargs.pop("model", None) or self.model
        wire = [convert_message_to_dict(m, f"messages[{i}]") for i, m in enumerate(messages)]
        request = request_kwargs(self._instance_request(), stop, kwargs)
        engine = get_engine(model, keep_alive=self.keep_alive, **self.vllm_kwargs)
        return EngineCall(engine, model, wire, request)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        for _, chunk in self._prepare(messages, stop, kwargs).chunks(run_manager):
            yield chunk

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        async for _, chunk in self._prepare(messages, stop, kwargs).achunks(run_manager):
            yield chunk

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        tokens = wants_tokens(run_manager)
        kwargs.setdefault("stream", tokens)
        call = self._prepare(messages, stop, kwargs)
        return aggregate(call.chunks(run_manager if tokens else None), self.model)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        tokens = wants_tokens(run_manager)
        kwargs.setdefault("stream", tokens)
        call = self._prepare(messages, stop, kwargs)
        chunks = call.achunks(run_manager if tokens else None)
        return aggregate([c async for c in chunks], self.model)

    # -- tools and structured output -----------------------------------------------------

    def bind_tools(
        self,
        tools: Sequence[ToolLike],
        *,
        tool_choice: dict[str, Any] | str | bool | None = None,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools: they go into the chat template and the output is parsed for calls.

        ``tool_choice``: ``"auto"``, ``"none"``, ``"required"`` (or ``"any"``/``True``) or a
        tool name (or ``{"type": "function", "function": {"name": ...}}``); ``"required"`` and
        a name are enforced with vLLM's structured outputs. ``strict=True`` closes the tools'
        argument schemas (``additionalProperties: false``), so an enforced call has exactly
        the declared arguments.
        """
        return super().bind(**tool_binding(tools, tool_choice=tool_choice, strict=strict, **kwargs))

    def with_structured_output(
        self,
        schema: dict[str, Any] | type,
        *,
        method: StructuredMethod = "json_schema",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | Any]:
        """Answers that match ``schema`` (a Pydantic class, a TypedDict or a JSON schema).

        ``method="json_schema"`` (default) constrains decoding to the schema with vLLM's
        structured outputs, so the answer always validates, streaming too;
        ``"function_calling"`` binds the schema as the one tool the model must call (its
        arguments schema closed unless ``strict=False``); ``"json_mode"`` constrains decoding
        to some JSON object (describe the shape in the prompt). With ``include_raw=True``
        the result is ``{"raw", "parsed", "parsing_error"}``.
        """
        if kwargs:
            msg = f"Unexpected arguments for with_structured_output: {sorted(kwargs)}"
            raise ValueError(msg)
        return structured_output(
            self, schema, method=method, include_raw=include_raw, strict=strict
        )
