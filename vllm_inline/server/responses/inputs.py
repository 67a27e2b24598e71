"""A Responses request's ``input`` (and the stored conversation it continues) as the chat
messages :meth:`Engine.astream <vllm_inline.engine.Engine.astream>` takes: pure functions.

The items are those of OpenAI's Responses API that a chat model's turn can hold, converted as
``vllm serve`` converts them (``vllm/entrypoints/openai/responses/utils.py``): a message (text,
or the parts ``input_text`` / ``output_text`` / ``input_image``), a ``function_call`` (an
assistant message's tool call; consecutive calls join one message), a ``custom_tool_call`` (the
same, its ``input`` as the arguments of :mod:`.tools`' shim), a ``function_call_output`` or
``custom_tool_call_output`` (a ``tool`` message), a ``reasoning`` item (the assistant message's ``reasoning``). Anything else
(hosted tools' calls, ``item_reference``, ...) is refused with a 400 naming the item, as is a
``function_call_output`` whose ``call_id`` no ``function_call`` of the conversation made.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vllm_inline.server.errors import InvalidBodyError
from vllm_inline.server.responses.tools import custom_arguments, flat_name

__all__ = ["HANDLED_ITEMS", "conversation", "output_messages"]

HANDLED_ITEMS = (
    "message",
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
    "reasoning",
)
"""The input item types this package turns into chat messages."""

_ROLES = ("user", "assistant", "system", "developer")


def conversation(
    body_input: Any, instructions: Any, history: Sequence[Mapping[str, Any]] = ()
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(messages for the engine, the new turn's messages)``: ``instructions`` as the system
    message first (they do not carry over from ``history``, as in OpenAI's API), then
    ``history`` (a stored response's conversation), then ``body_input`` converted."""
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidBodyError("body.instructions", "Input should be a valid string")
    if isinstance(body_input, str):
        new = [{"role": "user", "content": body_input}]
    elif isinstance(body_input, list):
        new = _items(body_input)
    elif body_input is None:
        raise InvalidBodyError("body.input", "Field required")
    else:
        raise InvalidBodyError("body.input", "Input should be a valid string or list of items")
    _check_outputs_answer_calls([*history, *new])
    system = [{"role": "system", "content": instructions}] if instructions else []
    return [*system, *(dict(m) for m in history), *new], new


def _items(items: list[Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        place = f"body.input.{i}"
        if not isinstance(item, Mapping):
            raise InvalidBodyError(place, "Input should be a valid dictionary")
        kind = item.get("type", "message" if "role" in item else None)
        last = messages[-1] if messages else None
        open_assistant = last if last is not None and last["role"] == "assistant" else None
        if kind == "message":
            message = _message(item, place)
            if (
                message["role"] == "assistant"
                and open_assistant is not None
                and not open_assistant.get("content")
                and not open_assistant.get("tool_calls")
            ):
                open_assistant["content"] = message["content"]  # after its reasoning item
            else:
                messages.append(message)
        elif kind in ("function_call", "custom_tool_call"):
            call = _function_call(item, place)
            if open_assistant is not None:
                open_assistant.setdefault("tool_calls", []).append(call)
                open_assistant.setdefault("content", None)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            messages.append(_function_call_output(item, place))
        elif kind == "reasoning":
            messages.append(
                {"role": "assistant", "content": None, "reasoning": _reasoning(item, place)}
            )
        else:
            handled = ", ".join(HANDLED_ITEMS)
            raise InvalidBodyError(
                f"{place}.type",
                f"the item type {kind!r} is not handled by vllm-inline; send one of {handled}",
            )
    return messages


def _text(value: Any, place: str) -> str:
    if not isinstance(value, str):
        raise InvalidBodyError(
            place, "Field required" if value is None else "Input should be a valid string"
        )
    return value


def _message(item: Mapping[str, Any], place: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in _ROLES:
        problem = "Field required" if role is None else f"Input should be one of {_ROLES}"
        raise InvalidBodyError(f"{place}.role", problem)
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise InvalidBodyError(
            f"{place}.content", "Input should be a valid string or list of parts"
        )
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        where = f"{place}.content.{j}"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": _text(part.get("text"), f"{where}.text")})
        elif kind == "refusal":
            parts.append({"type": "text", "text": _text(part.get("refusal"), f"{where}.refusal")})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise InvalidBodyError(
                    f"{where}.image_url", "an image URL or data URL (file_id is not supported)"
                )
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise InvalidBodyError(
                f"{where}.type",
                f"the content part {kind!r} is not handled by vllm-inline; send input_text, "
                "output_text or input_image",
            )
    if all(p["type"] == "text" for p in parts):
        # One string, as a chat message's text parts become (every template takes it).
        return {"role": role, "content": "".join(p["text"] for p in parts)}
    return {"role": role, "content": parts}


def _function_call(item: Mapping[str, Any], place: str) -> dict[str, Any]:
    """A ``function_call`` or ``custom_tool_call`` item as the assistant's tool call, in the
    names and arguments the model was shown (:mod:`.tools`)."""
    name = _text(item.get("name"), f"{place}.name")
    if item.get("type") == "custom_tool_call":
        arguments = custom_arguments(_text(item.get("input"), f"{place}.input"))
    else:
        arguments = _text(item.get("arguments"), f"{place}.arguments")
    call_id = _text(item.get("call_id"), f"{place}.call_id")
    namespace = item.get("namespace")
    name = flat_name(namespace if isinstance(namespace, str) else None, name)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _function_call_output(item: Mapping[str, Any], place: str) -> dict[str, Any]:
    call_id = _text(item.get("call_id"), f"{place}.call_id")
    output = item.get("output")
    if isinstance(output, list):  # input_text parts
        texts = [p.get("text") for p in output if isinstance(p, Mapping)]
        if len(texts) != len(output) or not all(isinstance(t, str) for t in texts):
            raise InvalidBodyError(f"{place}.output", "a string or a list of input_text parts")
        output = "".join(texts)  # type: ignore[arg-type]
    return {"role": "tool", "tool_call_id": call_id, "content": _text(output, f"{place}.output")}


def _reasoning(item: Mapping[str, Any], place: str) -> str:
    if item.get("encrypted_content"):
        raise InvalidBodyError(f"{place}.encrypted_content", "encrypted reasoning is not supported")
    for key in ("content", "summary"):
        parts = item.get(key) or []
        if not isinstance(parts, list):
            raise InvalidBodyError(f"{place}.{key}", "Input should be a valid list")
        texts = [p.get("text") for p in parts if isinstance(p, Mapping)]
        if texts and all(isinstance(t, str) for t in texts):
            return "".join(texts)  # type: ignore[arg-type]
    return ""


def _check_outputs_answer_calls(messages: Sequence[Mapping[str, Any]]) -> None:
    """Every tool output answers a call made before it in the conversation."""
    made: set[str] = set()
    for message in messages:
        for call in message.get("tool_calls") or ():
            made.add(call["id"])
        if message["role"] == "tool" and message["tool_call_id"] not in made:
            raise InvalidBodyError(
                "body.input",
                f"a function_call_output answers call_id {message['tool_call_id']!r}, which no "
                "function_call of this conversation made (send the function_call item first, "
                "or previous_response_id of the response that made it)",
            )


def output_messages(output: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A response's output items as the chat messages that continue its conversation (one
    assistant message: its reasoning, text and tool calls)."""
    message: dict[str, Any] = {"role": "assistant", "content": None}
    for item in output:
        if item["type"] == "reasoning":
            texts = [p["text"] for p in item.get("content") or ()]
            message["reasoning"] = (message.get("reasoning") or "") + "".join(texts)
        elif item["type"] == "message":
            texts = [p["text"] for p in item["content"] if p["type"] == "output_text"]
            message["content"] = (message["content"] or "") + "".join(texts)
        elif item["type"] in ("function_call", "custom_tool_call"):
            message.setdefault("tool_calls", []).append(_function_call(item, "output"))
    if message["content"] is None and not message.get("tool_calls"):
        message["content"] = ""
    return [message]
