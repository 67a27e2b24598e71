"""Pure converters between LangChain messages and the engine's wire format.

``convert_message_to_dict`` turns a LangChain message into the OpenAI-style dict the engine
takes; ``request_kwargs`` layers a call's values over a chat model's into the engine's keyword
arguments; ``delta_to_chunk`` turns one engine :class:`~vllm_inline.engine.Delta` into one
``AIMessageChunk`` and ``delta_to_generation_chunk`` into the ``ChatGenerationChunk`` a
stream yields. They are shared by the sync and async streams of ``ChatVLLM`` and import
neither vLLM nor torch.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    convert_to_openai_image_block,
)
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages.tool import ToolCallChunk, tool_call_chunk
from langchain_core.outputs import ChatGenerationChunk

from vllm_inline.engine import BadRequestError, Delta, TokenLogprob, ToolCallDelta, Usage

__all__ = [
    "convert_message_to_dict",
    "delta_to_chunk",
    "delta_to_generation_chunk",
    "request_kwargs",
]

# Content blocks of an AI message that are not text for the model: reasoning shown to the user
# and tool calls (sent through ``tool_calls`` instead).
_SKIPPED_AI_BLOCKS = frozenset(
    {"reasoning", "thinking", "tool_call", "tool_call_chunk", "invalid_tool_call", "tool_use"}
)


# Roles whose messages may carry images (as in the engine: see vllm_inline.engine.request.images).
_IMAGE_ROLES = frozenset({"user", "tool"})


def _image_part(block: dict[str, Any], where: str) -> dict[str, Any]:
    """A LangChain image block (v1 ``base64``/``url``, v0 ``source_type``, or OpenAI's
    ``image_url``) as OpenAI's ``image_url`` part, which the engine checks and decodes."""
    if block.get("type") == "image_url":
        return block
    try:
        return convert_to_openai_image_block(block)
    except (ValueError, KeyError) as e:
        raise BadRequestError.invalid(
            where,
            block,
            f"{e} Send {{'type': 'image', 'base64': ..., 'mime_type': "
            "'image/png'}} or {'type': 'image', 'url': ...} (a data: URL or an allowed local "
            "file; file_id is not supported)",
        ) from e


def _content(
    content: str | Sequence[str | dict[str, Any]], where: str, *, role: str
) -> str | list[dict[str, Any]]:
    """A message's content for the engine: a string (text blocks joined with newlines), or,
    when it holds images, a list of OpenAI text and ``image_url`` parts."""
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    has_image = False
    for i, block in enumerate(content):
        if isinstance(block, str):
            parts.append({"type": "text", "text": block})
            continue
        kind = block.get("type") if isinstance(block, dict) else type(block).__name__
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append({"type": "text", "text": block["text"]})
        elif role == "assistant" and kind in _SKIPPED_AI_BLOCKS:
            continue
        elif kind in ("image", "image_url") and role in _IMAGE_ROLES:
            parts.append(_image_part(block, f"{where}.content[{i}]"))
            has_image = True
        else:
            raise BadRequestError.invalid(
                f"{where}.content[{i}]",
                block,
                f"a content block of type {kind!r} cannot be taken by this chat model in a "
                f"{role!r} message; send strings, text blocks ({{'type': 'text', 'text': ...}}) "
                "and, in human and tool messages, image blocks (PDF, audio and video are not "
                "supported)",
            )
    if has_image:
        return parts
    return "\n".join(p["text"] for p in parts)


def convert_message_to_dict(message: BaseMessage, where: str = "message") -> dict[str, Any]:
    """One LangChain message as an OpenAI-style chat dict (text, and images in human and
    tool messages)."""
    if isinstance(message, SystemMessage):
        role = "system"
    elif isinstance(message, HumanMessage):
        role = "user"
    elif isinstance(message, AIMessage):
        role = "assistant"
    elif isinstance(message, ToolMessage):
        role = "tool"
    elif isinstance(message, ChatMessage):
        role = message.role
    else:
        raise BadRequestError.invalid(
            where,
            message,
            f"{type(message).__name__} is not supported; use SystemMessage, HumanMessage, "
            "AIMessage, ToolMessage or ChatMessage",
        )
    content = _content(message.content, where, role=role)
    out: dict[str, Any] = {"role": role, "content": content}
    if message.name is not None and role in ("system", "user", "assistant"):
        out["name"] = message.name
    if isinstance(message, AIMessage) and message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.get("id") or f"call_{i}",
                "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(call["args"])},
            }
            for i, call in enumerate(message.tool_calls)
        ]
    if isinstance(message, ToolMessage):
        out["tool_call_id"] = message.tool_call_id
    return out


def _usage_to_metadata(usage: Usage) -> UsageMetadata:
    """Engine token counts as LangChain's ``UsageMetadata``."""
    return UsageMetadata(
        input_tokens=usage.prompt_tokens,
        output_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
        input_token_details={"cache_read": usage.cached_tokens},
    )


def _logprobs_to_dict(logprobs: Sequence[TokenLogprob]) -> dict[str, Any]:
    """Token logprobs in OpenAI's ``{"content": [...]}`` shape (lists concatenate on merge)."""
    return {
        "content": [
            {
                "token": lp.token,
                "token_id": lp.token_id,
                "logprob": lp.logprob,
                "top_logprobs": [{"token": t, "logprob": p} for t, p in lp.top_logprobs],
            }
            for lp in logprobs
        ]
    }


def _tool_call_chunks(calls: Sequence[ToolCallDelta]) -> list[ToolCallChunk]:
    """Tool-call fragments as LangChain chunks, one per call index.

    One engine step can carry several fragments of the same call (its name, then the start of
    its arguments); LangChain merges chunks by index only across messages, so they are joined
    here.
    """
    merged: dict[int, ToolCallChunk] = {}
    for call in calls:
        chunk = merged.get(call.index)
        if chunk is None:
            merged[call.index] = tool_call_chunk(
                name=call.name, args=call.arguments, id=call.id, index=call.index
            )
            continue
        chunk["name"] = chunk["name"] or call.name
        chunk["id"] = chunk["id"] or call.id
        chunk["args"] = (chunk["args"] or "") + call.arguments
    return list(merged.values())


def delta_to_chunk(delta: Delta, model_name: str) -> AIMessageChunk:
    """One engine delta as one ``AIMessageChunk``.

    Text goes to ``content``; reasoning to ``additional_kwargs["reasoning_content"]`` (which
    LangChain shows as a reasoning content block); tool-call fragments to
    ``tool_call_chunks``. The last delta of a choice carries ``response_metadata``
    (``finish_reason``, ``model_name``, ``stop_reason``) and ``chunk_position="last"``; the last
    delta of the request also carries ``usage_metadata`` (cached prompt tokens as
    ``input_token_details["cache_read"]``) and the request's timings in seconds as
    ``response_metadata["metrics"]`` (see :class:`~vllm_inline.engine.RequestMetrics`).
    """
    additional_kwargs: dict[str, Any] = {}
    if delta.reasoning:
        additional_kwargs["reasoning_content"] = delta.reasoning
    response_metadata: dict[str, Any] = {}
    if delta.logprobs is not None:
        response_metadata["logprobs"] = _logprobs_to_dict(delta.logprobs)
    last = delta.finish_reason is not None
    if last:
        response_metadata.update(
            finish_reason=delta.finish_reason,
            model_name=model_name,
            stop_reason=delta.stop_reason,
        )
    if delta.metrics is not None:
        response_metadata["metrics"] = dataclasses.asdict(delta.metrics)
    return AIMessageChunk(
        content=delta.text,
        additional_kwargs=additional_kwargs,
        response_metadata=response_metadata,
        tool_call_chunks=_tool_call_chunks(delta.tool_calls),
        usage_metadata=_usage_to_metadata(delta.usage) if delta.usage is not None else None,
        chunk_position="last" if last else None,
    )


# Plain-text deltas (nearly all of them) take a fast path, written by hand because LangChain has
# none: pydantic validation of each AIMessageChunk and ChatGenerationChunk was the largest
# per-token cost of ChatVLLM's stream (see docs/performance.md). A copy of a validated empty chunk
# with the text swapped in (pydantic's ``model_copy(update=...)``, no validation) is equal to the
# validated chunk (tests/test_langchain_unit.py checks it) and costs about a third (5 us vs 16).
_EMPTY_MESSAGE = AIMessageChunk(content="")
_EMPTY_GENERATION = ChatGenerationChunk(message=_EMPTY_MESSAGE)


def delta_to_generation_chunk(delta: Delta, model_name: str) -> ChatGenerationChunk:
    """One engine delta as the ``ChatGenerationChunk`` of a stream (see ``delta_to_chunk``)."""
    if (
        delta.reasoning
        or delta.tool_calls
        or delta.logprobs is not None
        or delta.finish_reason is not None
        or delta.usage is not None
    ):
        return ChatGenerationChunk(message=delta_to_chunk(delta, model_name))
    message = _EMPTY_MESSAGE.model_copy(
        update={
            "content": delta.text,
            # Fresh containers: a copy is shallow and callers may mutate what they get.
            "additional_kwargs": {},
            "response_metadata": {},
            "tool_calls": [],
            "invalid_tool_calls": [],
            "tool_call_chunks": [],
        }
    )
    return _EMPTY_GENERATION.model_copy(update={"message": message, "text": delta.text})


def request_kwargs(
    instance: Mapping[str, Any],
    stop: list[str] | None = None,
    call: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The engine keyword arguments of one call: a chat model's own values (``instance``),
    overridden by the call's keyword arguments (``call``); ``None`` values dropped, so a call's
    ``lora=None`` means the base model whatever the model's ``lora``.

    A call's ``stop`` replaces the model's; ``stop`` given both as the call's argument and
    among its keyword arguments is refused (``ValueError``).
    """
    values = dict(call or {})
    if stop is not None:
        if "stop" in values:
            msg = "`stop` was given both as the call's argument and as a keyword; pass it once."
            raise ValueError(msg)
        values["stop"] = stop
    merged = {**instance, **values}
    return {k: v for k, v in merged.items() if v is not None}
