"""Pure converters between LlamaIndex types and the engine's OpenAI-style messages and deltas.

Nothing here talks to an engine: :func:`to_engine_messages` turns ``ChatMessage`` objects into
the chat dicts the engine renders with the model's template, :class:`ResponseBuilder` turns the
engine's :class:`~vllm_inline.engine.Delta` objects into cumulative ``ChatResponse`` objects,
:func:`aggregate` makes the non-streaming answer of them and :func:`to_completion_response` the
``CompletionResponse`` of one. Reading tool calls back is in :mod:`.tools`, reading structured
answers in :mod:`.structured`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llama_index.core.base.llms.types import (
    CachePoint,
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    ContentBlock,
    ImageBlock,
    MessageRole,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)

from vllm_inline.engine import BadRequestError, Delta, Usage

__all__ = [
    "ResponseBuilder",
    "aaggregate",
    "aggregate",
    "to_completion_response",
    "to_engine_messages",
    "usage_dict",
]

_ROLE_ALIASES = {MessageRole.MODEL.value: "assistant", MessageRole.CHATBOT.value: "assistant"}


# -- LlamaIndex messages -> engine messages ------------------------------------------------


def _arguments_json(arguments: Any) -> str:
    """Tool-call arguments as the JSON text OpenAI-style messages carry."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def _tool_call_dict(call: Any, where: str) -> dict[str, Any]:
    """One assistant tool call (``ToolCallBlock``, OpenAI dict or OpenAI object) as a dict."""
    if isinstance(call, ToolCallBlock):
        return {
            "id": call.tool_call_id or f"call_{call.tool_name}",
            "type": "function",
            "function": {"name": call.tool_name, "arguments": _arguments_json(call.tool_kwargs)},
        }
    if hasattr(call, "model_dump"):
        call = call.model_dump()
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        raise BadRequestError.invalid(
            where, call, "an OpenAI-style tool call {'id': ..., 'function': {'name', 'arguments'}}"
        )
    function = call["function"]
    return {
        "id": call.get("id") or f"call_{function.get('name')}",
        "type": "function",
        "function": {
            "name": function.get("name"),
            "arguments": _arguments_json(function.get("arguments", {})),
        },
    }


def _image_part(block: ImageBlock) -> dict[str, Any]:
    """An ``ImageBlock`` as OpenAI's ``image_url`` part; the engine checks and decodes it (a
    path must be inside the engine's ``allowed_local_media_path``; remote URLs are refused
    unless their domain is in ``allowed_media_domains``)."""
    if block.image is not None:
        # ImageBlock keeps bytes base64-encoded (its validator does that).
        data = block.resolve_image(as_base64=True).read().decode("ascii")
        url = f"data:{block.image_mimetype or 'image/png'};base64,{data}"
    elif block.path is not None:
        url = str(block.path.resolve())
    else:
        url = str(block.url or "")
    return {"type": "image_url", "image_url": {"url": url}}


def _to_engine_message(message: ChatMessage, i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    role = _ROLE_ALIASES.get(message.role.value, message.role.value)
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    has_image = False
    for j, block in enumerate(message.blocks):
        if isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageBlock):
            parts.append(_image_part(block))
            has_image = True
        elif isinstance(block, ToolCallBlock):
            calls.append(_tool_call_dict(block, f"{where}.blocks[{j}]"))
        elif isinstance(block, (ThinkingBlock, CachePoint)):
            continue  # the model's own reasoning and cache markers are not re-sent
        else:
            raise BadRequestError.invalid(
                f"{where}.blocks[{j}]",
                type(block).__name__,
                f"a {block.block_type!r} block is not supported; send TextBlock and "
                "ImageBlock content (audio, video and documents are not supported)",
            )
    content: str | list[dict[str, Any]] = (
        parts if has_image else "\n".join(p["text"] for p in parts)
    )
    out: dict[str, Any] = {"role": role, "content": content}
    if role == "assistant":
        legacy = message.additional_kwargs.get("tool_calls")
        if not calls and legacy:
            calls = [_tool_call_dict(c, f"{where}.tool_calls[{k}]") for k, c in enumerate(legacy)]
        if calls:
            out["tool_calls"] = calls
    elif role == "tool":
        call_id = message.additional_kwargs.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise BadRequestError.invalid(
                f"{where}.additional_kwargs['tool_call_id']",
                call_id,
                "a tool message needs the id of the call it answers "
                "(ChatMessage(role='tool', additional_kwargs={'tool_call_id': ...}))",
            )
        out["tool_call_id"] = call_id
    name = message.additional_kwargs.get("name")
    if isinstance(name, str):
        out["name"] = name
    return out


def to_engine_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """LlamaIndex ``ChatMessage`` objects as OpenAI-style chat dicts.

    Text blocks are joined with newlines (as ``ChatMessage.content`` does); ``ToolCallBlock``
    blocks (or legacy ``additional_kwargs["tool_calls"]``) of assistant messages become
    ``tool_calls``; a ``tool`` message takes ``additional_kwargs["tool_call_id"]``. A message
    with ``ImageBlock``s keeps its content as a list of OpenAI text and ``image_url`` parts
    (bytes as a data URL, a path, a URL), which the engine checks. Thinking blocks are dropped;
    audio, video and documents are refused with :class:`~vllm_inline.engine.BadRequestError`.
    """
    if not messages:
        raise BadRequestError(
            "messages is empty: send at least one message.", parameter="messages", value=[]
        )
    return [_to_engine_message(m, i) for i, m in enumerate(messages)]


# -- engine deltas -> LlamaIndex responses -------------------------------------------------


def usage_dict(usage: Usage) -> dict[str, int]:
    """Usage in the OpenAI shape LlamaIndex's token counters read, plus ``cached_tokens``
    (prompt tokens found in vLLM's prefix cache)."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "cached_tokens": usage.cached_tokens,
    }


def _kwargs_of(arguments: str) -> dict[str, Any] | str:
    """Complete JSON arguments as a dict; a still-streaming fragment stays a string."""
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments


@dataclass
class _Call:
    id: str | None = None
    name: str = ""
    arguments: str = ""


@dataclass
class ResponseBuilder:
    """Folds the engine's deltas into cumulative ``ChatResponse`` objects (one per delta).

    Each response carries the whole message so far (text, a ``ThinkingBlock`` for reasoning,
    one ``ToolCallBlock`` per tool call) and the new text as ``delta``; the last one also has
    usage and the finish reason in ``additional_kwargs`` and ``raw``.
    """

    text: str = ""
    reasoning: str = ""
    calls: dict[int, _Call] = field(default_factory=dict)
    last: ChatResponse | None = None

    def push(self, delta: Delta) -> ChatResponse:
        """Add one delta; return the cumulative response."""
        self.text += delta.text
        self.reasoning += delta.reasoning
        for fragment in delta.tool_calls:
            call = self.calls.setdefault(fragment.index, _Call())
            call.id = call.id or fragment.id
            call.name += fragment.name or ""
            call.arguments += fragment.arguments
        usage = usage_dict(delta.usage) if delta.usage is not None else None
        additional: dict[str, Any] = {}
        if delta.reasoning:
            additional["thinking_delta"] = delta.reasoning
        if usage is not None:
            additional.update(usage)
        if delta.finish_reason is not None:
            additional["finish_reason"] = delta.finish_reason
        raw = {
            "text": delta.text,
            "reasoning": delta.reasoning,
            "tool_calls": [
                {"index": c.index, "id": c.id, "name": c.name, "arguments": c.arguments}
                for c in delta.tool_calls
            ],
            "token_ids": list(delta.token_ids),
            "finish_reason": delta.finish_reason,
            "stop_reason": delta.stop_reason,
            "usage": usage,
            "metrics": dataclasses.asdict(delta.metrics) if delta.metrics is not None else None,
        }
        self.last = ChatResponse(
            message=self.message(), delta=delta.text, raw=raw, additional_kwargs=additional
        )
        return self.last

    def message(self) -> ChatMessage:
        """The assistant message so far."""
        blocks: list[ContentBlock] = []
        additional: dict[str, Any] = {}
        if self.reasoning:
            blocks.append(ThinkingBlock(content=self.reasoning))
            additional["reasoning_content"] = self.reasoning
        blocks.append(TextBlock(text=self.text))
        if self.calls:
            ordered = [self.calls[k] for k in sorted(self.calls)]
            blocks.extend(
                ToolCallBlock(
                    tool_call_id=c.id, tool_name=c.name, tool_kwargs=_kwargs_of(c.arguments)
                )
                for c in ordered
            )
            additional["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in ordered
            ]
        return ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks, additional_kwargs=additional)

    def responses(self, deltas: Iterable[Delta]) -> ChatResponseGen:
        """One cumulative response per delta of ``deltas``."""
        for delta in deltas:
            yield self.push(delta)

    async def aresponses(self, deltas: AsyncIterable[Delta]) -> ChatResponseAsyncGen:
        """One cumulative response per delta of ``deltas`` (async)."""
        async for delta in deltas:
            yield self.push(delta)


def to_completion_response(response: ChatResponse) -> CompletionResponse:
    """A cumulative ``ChatResponse`` as the matching ``CompletionResponse``."""
    return CompletionResponse(
        text=response.message.content or "",
        additional_kwargs={**response.message.additional_kwargs, **response.additional_kwargs},
        raw=response.raw,
        delta=response.delta,
    )


# -- aggregation --------------------------------------------------------------------------


def _final(last: ChatResponse | None) -> ChatResponse:
    """The last cumulative response as the whole answer (no ``delta``)."""
    if last is None:
        return ChatResponse(
            message=ChatMessage(role=MessageRole.ASSISTANT, blocks=[TextBlock(text="")])
        )
    return last.model_copy(update={"delta": None})


def aggregate(responses: Iterator[ChatResponse]) -> ChatResponse:
    """The non-streaming answer: the last cumulative response (it carries usage)."""
    last = None
    for last in responses:
        pass
    return _final(last)


async def aaggregate(responses: AsyncIterator[ChatResponse]) -> ChatResponse:
    """The async form of :func:`aggregate`."""
    last = None
    async for last in responses:
        pass
    return _final(last)
