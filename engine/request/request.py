"""A request, checked: the first step of the request path, before any engine work.

:func:`build_request` turns the arguments of :meth:`Engine.astream
<vllm_inline.engine.Engine.astream>` (and of ``prompt_token_ids``) into a :class:`Request`,
refusing bad input with a typed error that names the parameter. It needs no running engine, so
a bad call fails at once, before the engine starts, and the engine keeps serving everyone else.
The later steps are :mod:`.render` (prompt ids) and :mod:`vllm_inline.engine.stream.generate`
(sampling, vLLM, deltas).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_inline.engine.errors import BadRequestError
from vllm_inline.engine.request.images import ImageRef
from vllm_inline.engine.request.lora import Adapter, LoRARegistry
from vllm_inline.engine.request.messages import (
    validate_messages,
    validate_tool_choice,
    validate_tools,
)
from vllm_inline.engine.request.prompt_options import PromptOptions, pop_prompt_options
from vllm_inline.engine.request.sampling import check_sampling

__all__ = ["Request", "build_request", "is_token_ids", "non_token_id_at"]


@dataclass(frozen=True)
class Request:
    """A validated request, ready to render and send."""

    messages: list[dict[str, Any]] | None
    """OpenAI-style chat messages (checked copies), or ``None`` with :attr:`prompt`."""
    prompt: str | list[int] | None
    """A pre-formatted prompt sent as is (text, or token ids), instead of :attr:`messages`."""
    tools: list[dict[str, Any]] | None
    """OpenAI-style function tools for the chat template and the tool parser."""
    tool_choice: str | None
    """``"auto"``, ``"none"``, ``"required"``, a tool name, or ``None``."""
    chat_template: str | None
    """A Jinja template replacing the model's own."""
    chat_template_kwargs: Mapping[str, Any] | None
    """Extra template variables (``enable_thinking``, ...)."""
    sampling: dict[str, Any]
    """The caller's sampling values, checked (engine defaults are layered in later)."""
    structured_outputs: Mapping[str, Any] | None
    """vLLM ``StructuredOutputsParams`` fields (``json``, ``regex``, ``choice``, ...)."""
    tool_parser: str | None
    """vLLM tool parser name (else the family's default when tools are sent)."""
    reasoning_parser: str | None
    """vLLM reasoning parser name."""
    lora: Adapter | None = None
    """The LoRA adapter of the call (``None``: the base model)."""
    priority: int = 0
    """vLLM's scheduling priority: lower runs first (needs ``scheduling_policy="priority"``)."""
    timeout: float | None = None
    """Seconds the request may run before it is aborted (``None``: no deadline)."""
    images: tuple[ImageRef, ...] = ()
    """The images in :attr:`messages`, in order (checked against the engine in :mod:`.render`)."""
    stream: bool = True
    """``True``: one delta per engine step (vLLM's DELTA outputs). ``False``: one delta per
    choice, the whole answer once it is finished (vLLM's FINAL_ONLY outputs), for callers
    that only want the final message: no per-token work in vLLM's output handler, here or in
    the integrations. The final message is the same either way (see
    :mod:`vllm_inline.engine.stream.generate`)."""
    prompt_options: PromptOptions = field(default_factory=PromptOptions)
    """How the prompt is rendered beyond the messages (generation prompt, a prefilled last
    message, documents, reasoning effort, special tokens, truncation, cache salt, multimodal
    processor options): :mod:`.prompt_options`."""
    session_id: str | None = None
    """vLLM's ``session_id``: a label on the request's KV-cache events (for cache-aware routers
    reading them, with the engine's ``kv_events_config``); no effect on the answer."""
    include_reasoning: bool = True
    """``False``: the reasoning parser's reasoning is dropped, not returned (vLLM's
    ``include_reasoning``)."""
    parallel_tool_calls: bool | None = None
    """``False``: at most one tool call, constrained where vLLM's parser constrains it (the
    grammar of ``tool_choice="required"``: ``maxItems: 1``), as vLLM's ``parallel_tool_calls``;
    ``None``: vLLM's default (any number)."""
    return_prompt_token_ids: bool = False
    """``True``: the first delta of each choice carries the rendered prompt's token ids
    (:attr:`Delta.prompt_token_ids <vllm_inline.engine.stream.deltas.Delta.prompt_token_ids>`);
    ``False`` spares the copy of the prompt for callers that do not read them."""


def non_token_id_at(items: Sequence[Any]) -> int | None:
    """The index of the first item of ``items`` that is not a token id (an ``int`` >= 0, not a
    ``bool``), or ``None``: the one check of token ids (a prompt, the server's ``prompt`` and
    ``/detokenize`` ``tokens``)."""
    for i, item in enumerate(items):
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            return i
    return None


def is_token_ids(value: Any) -> bool:
    """Whether ``value`` is a non-empty list (or tuple) of token ids (:func:`non_token_id_at`)."""
    return isinstance(value, (list, tuple)) and bool(value) and non_token_id_at(value) is None


def build_request(
    messages: Any,
    options: Mapping[str, Any],
    *,
    adapters: LoRARegistry,
    max_model_len: int | None,
    engine_options: Mapping[str, Any] | None = None,
) -> Request:
    """Check ``messages`` and the keyword ``options`` of a call; anything left in ``options``
    after the request fields is a sampling value. ``max_model_len`` is known once started;
    ``engine_options`` (the engine's ``vllm_kwargs``) say where images may come from."""
    options = dict(options)
    prompt = options.pop("prompt", None)
    if (messages is None) == (prompt is None):
        raise BadRequestError(
            "Pass exactly one of messages (a chat) or prompt (pre-formatted text).",
            parameter="messages",
            value=messages,
        )
    if prompt is not None and not isinstance(prompt, str):
        if not is_token_ids(prompt):
            raise BadRequestError.invalid("prompt", prompt, "a string, or a list of token ids")
        prompt = list(prompt)
    tools = validate_tools(options.pop("tools", None))
    tool_choice = validate_tool_choice(options.pop("tool_choice", None), tools)
    chat_template = options.pop("chat_template", None)
    template_kwargs = options.pop("chat_template_kwargs", None)
    if template_kwargs is not None and not isinstance(template_kwargs, Mapping):
        raise BadRequestError.invalid("chat_template_kwargs", template_kwargs, "a mapping")
    structured = options.pop("structured_outputs", None)
    if structured is not None and not isinstance(structured, Mapping):
        raise BadRequestError.invalid(
            "structured_outputs", structured, "a mapping, e.g. {'json': schema}"
        )
    tool_parser = options.pop("tool_parser", None)
    reasoning_parser = options.pop("reasoning_parser", None)
    lora = adapters.resolve(options.pop("lora", None))
    priority = options.pop("priority", None)
    if priority is None:
        priority = 0
    elif isinstance(priority, bool) or not isinstance(priority, numbers.Integral):
        raise BadRequestError.invalid(
            "priority",
            priority,
            "an integer (lower runs first; the engine needs "
            "vllm_kwargs={'scheduling_policy': 'priority'})",
        )
    timeout = options.pop("timeout", None)
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, numbers.Real)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise BadRequestError.invalid("timeout", timeout, "a positive number of seconds, or None")
    stream = options.pop("stream", True)
    if not isinstance(stream, bool):
        raise BadRequestError.invalid(
            "stream", stream, "True (a delta per step) or False (the final answer only)"
        )
    prompt_options = pop_prompt_options(options)
    include_reasoning = options.pop("include_reasoning", None)
    if include_reasoning is not None and not isinstance(include_reasoning, bool):
        raise BadRequestError.invalid("include_reasoning", include_reasoning, "true or false")
    session_id = options.pop("session_id", None)
    if session_id is not None and not isinstance(session_id, str):
        raise BadRequestError.invalid("session_id", session_id, "a string")
    parallel_tool_calls = options.pop("parallel_tool_calls", None)
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise BadRequestError.invalid("parallel_tool_calls", parallel_tool_calls, "true or false")
    return_prompt_token_ids = options.pop("return_prompt_token_ids", False)
    if not isinstance(return_prompt_token_ids, bool):
        raise BadRequestError.invalid(
            "return_prompt_token_ids", return_prompt_token_ids, "true or false"
        )
    xargs = options.pop("vllm_xargs", None)
    if xargs is not None:
        # vLLM's server hands ``vllm_xargs`` to SamplingParams as ``extra_args``.
        if not isinstance(xargs, Mapping) or not all(isinstance(k, str) for k in xargs):
            raise BadRequestError.invalid("vllm_xargs", xargs, "a mapping of names to values")
        options["extra_args"] = {**dict(options.get("extra_args") or {}), **xargs}
    sampling = check_sampling(options, max_model_len=max_model_len)
    images: list[ImageRef] = []
    return Request(
        messages=_messages(messages, images, engine_options or {}),
        prompt=prompt,
        tools=tools,
        tool_choice=tool_choice,
        chat_template=chat_template,
        chat_template_kwargs=template_kwargs,
        sampling=sampling,
        structured_outputs=structured,
        tool_parser=tool_parser,
        reasoning_parser=reasoning_parser,
        lora=lora,
        priority=int(priority),
        timeout=float(timeout) if timeout is not None else None,
        images=tuple(images),
        stream=stream,
        prompt_options=prompt_options,
        include_reasoning=include_reasoning is not False,
        session_id=session_id,
        parallel_tool_calls=parallel_tool_calls,
        return_prompt_token_ids=return_prompt_token_ids,
    )


def _messages(
    messages: Any, images: list[ImageRef], engine_options: Mapping[str, Any]
) -> list[dict[str, Any]] | None:
    if messages is None:
        return None
    return validate_messages(
        messages,
        images,
        allowed_local_media_path=engine_options.get("allowed_local_media_path") or "",
        allowed_media_domains=tuple(engine_options.get("allowed_media_domains") or ()),
    )
