"""Tool calling of ``VLLM``: the ``FunctionCallingLLM`` helpers, without an engine.

:func:`chat_with_tools_kwargs` builds the chat arguments of ``chat_with_tools`` (OpenAI-style
tool schemas, ``tool_choice``), :func:`keep_first_tool_call` trims an answer to one call when
parallel calls are not allowed, and :func:`tool_selections` reads the ``ToolCallBlock`` blocks
vLLM's tool parser produced back as ``ToolSelection`` objects (:func:`tool_calls_of` for a
whole response).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ContentBlock,
    MessageRole,
    ToolCallBlock,
)
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.llms.utils import parse_partial_json

if TYPE_CHECKING:
    from llama_index.core.tools.types import BaseTool

__all__ = ["chat_with_tools_kwargs", "keep_first_tool_call", "tool_calls_of", "tool_selections"]


def chat_with_tools_kwargs(
    tools: Sequence[BaseTool],
    user_msg: str | ChatMessage | None,
    chat_history: list[ChatMessage] | None,
    *,
    tool_required: bool,
    tool_choice: str | dict[str, Any] | None,
    kwargs: dict[str, Any],
) -> dict[str, Any]:
    """Chat arguments with OpenAI-style tool schemas; ``tool_required`` forces a call (the
    engine constrains the output with structured outputs), else ``tool_choice`` (default
    ``"auto"``)."""
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


def keep_first_tool_call(response: ChatResponse) -> ChatResponse:
    """``response`` with only its first tool call (its message is changed in place)."""
    message = response.message
    calls = [b for b in message.blocks if isinstance(b, ToolCallBlock)]
    if len(calls) > 1:
        others = [b for b in message.blocks if not isinstance(b, ToolCallBlock)]
        message.blocks = [*others, *calls[:1]]
        message.additional_kwargs["tool_calls"] = message.additional_kwargs["tool_calls"][:1]
    return response


def tool_selections(blocks: Iterable[ContentBlock]) -> list[ToolSelection]:
    """The ``ToolCallBlock`` blocks of a message as ``ToolSelection`` objects.

    Arguments still streaming (a JSON fragment) are parsed as far as they go.
    """
    selections = []
    for block in blocks:
        if not isinstance(block, ToolCallBlock):
            continue
        kwargs = block.tool_kwargs
        if isinstance(kwargs, str):
            try:
                kwargs = parse_partial_json(kwargs) if kwargs.strip() else {}
            except (ValueError, TypeError):
                kwargs = {}
        selections.append(
            ToolSelection(
                tool_id=block.tool_call_id or block.tool_name,
                tool_name=block.tool_name,
                tool_kwargs=kwargs if isinstance(kwargs, dict) else {},
            )
        )
    return selections


def tool_calls_of(response: ChatResponse, error_on_no_tool_call: bool) -> list[ToolSelection]:
    """The tool calls vLLM's tool parser found in ``response``; none is a ``ValueError`` when
    ``error_on_no_tool_call``."""
    selections = tool_selections(response.message.blocks)
    if not selections and error_on_no_tool_call:
        msg = (
            f"Expected at least one tool call, but the model answered with text: "
            f"{(response.message.content or '')[:200]!r}"
        )
        raise ValueError(msg)
    return selections
