"""Validation of OpenAI-style chat messages and tools, before anything is rendered.

The renderer (vLLM's, with the model's template) does the formatting; this module only makes sure
that what reaches it is well-formed, so that bad input fails with a typed error that names the
offending field instead of a Jinja traceback from inside the engine.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from vllm_inline.engine.errors import BadRequestError
from vllm_inline.engine.request.images import (
    ImageRef,
    check_sources,
    is_image_part,
    normalize_image_part,
)

__all__ = ["ROLES", "validate_messages", "validate_tool_choice", "validate_tools"]

ROLES = ("system", "developer", "user", "assistant", "tool")
"""Roles a chat message may have."""


_IMAGE_ROLES = ("user", "tool")


def _content_of(content: Any, where: str, role: str, images: list[ImageRef]) -> Any:
    """A string, or a list of text parts and images.

    Text only: the parts joined into one string (as vLLM's "string" content format does), which
    every template takes. With images (``user`` and ``tool`` messages): a list of
    ``{"type": "text", ...}`` parts and normalised image parts (see :mod:`.images`), in order.
    """
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, (bytes, bytearray)):
        parts: list[dict[str, Any]] = []
        has_image = False
        for j, part in enumerate(content):
            if isinstance(part, str):
                parts.append({"type": "text", "text": part})
                continue
            if is_image_part(part):
                if role not in _IMAGE_ROLES:
                    raise BadRequestError.invalid(
                        f"{where}[{j}]",
                        "<image>",
                        f"a {role!r} message cannot hold an image; put images in user (or tool) "
                        "messages",
                    )
                normalised, ref = normalize_image_part(part, f"{where}[{j}]")
                parts.append(normalised)
                images.append(ref)
                has_image = True
                continue
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            if kind != "text" or not isinstance(part.get("text"), str):
                raise BadRequestError.invalid(
                    f"{where}[{j}]",
                    part,
                    f"content part of type {kind!r} is not supported; send text parts "
                    "({'type': 'text', 'text': ...}), strings, or images ({'type': 'image_url', "
                    "'image_url': {'url': 'data:image/png;base64,...'}}, bytes, a PIL image)",
                )
            parts.append({"type": "text", "text": part["text"]})
        if has_image:
            return parts
        # Same joining as vLLM's "string" content format.
        return "\n".join(p["text"] for p in parts)
    raise BadRequestError.invalid(
        where, content, "content must be a string or a list of text and image parts"
    )


def _check_tool_call(call: Any, where: str) -> dict[str, Any]:
    if not isinstance(call, Mapping):
        raise BadRequestError.invalid(where, call, "a tool call must be a mapping")
    function = call.get("function", call)
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str) or not name:
        raise BadRequestError.invalid(f"{where}.function.name", name, "a non-empty string")
    arguments = function.get("arguments", {})
    if not isinstance(arguments, (str, Mapping)):
        raise BadRequestError.invalid(
            f"{where}.function.arguments", arguments, "a JSON string or a mapping"
        )
    if not isinstance(arguments, str):
        # OpenAI's wire form; vLLM decodes it again for templates that want a mapping.
        arguments = json.dumps(arguments)
    return {
        "id": call.get("id") or f"call_{name}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def validate_messages(
    messages: Any,
    images: list[ImageRef] | None = None,
    *,
    allowed_local_media_path: str = "",
    allowed_media_domains: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Check ``messages`` and return clean copies (text parts joined, tool calls normalised).

    Image parts are normalised (:mod:`.images`) and their sources checked against the engine
    options ``allowed_local_media_path`` and ``allowed_media_domains`` (by default no local file
    and no remote URL is allowed); each image's :class:`~.images.ImageRef` is appended to
    ``images`` when given, for the checks that need the running engine.
    """
    images = images if images is not None else []
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise BadRequestError.invalid(
            "messages", messages, "a list of {'role': ..., 'content': ...} mappings"
        )
    if not messages:
        raise BadRequestError(
            "messages is empty: send at least one message.", parameter="messages", value=messages
        )
    clean = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise BadRequestError.invalid(where, message, "a mapping with 'role' and 'content'")
        role = message.get("role")
        if role is None:
            raise BadRequestError(
                f"{where} has no 'role'; use one of {ROLES}.", parameter=f"{where}.role", value=None
            )
        if role not in ROLES:
            raise BadRequestError.invalid(f"{where}.role", role, f"one of {ROLES}")
        out: dict[str, Any] = {"role": role}
        content = message.get("content")
        tool_calls = message.get("tool_calls") if role == "assistant" else None
        if content is None:
            if not tool_calls:
                raise BadRequestError.invalid(
                    f"{where}.content",
                    None,
                    f"content of a {role!r} message cannot be None"
                    + (" unless it has tool_calls" if role == "assistant" else ""),
                )
            out["content"] = ""
        else:
            out["content"] = _content_of(content, f"{where}.content", role, images)
        if tool_calls:
            if not isinstance(tool_calls, Sequence) or isinstance(tool_calls, str):
                raise BadRequestError.invalid(
                    f"{where}.tool_calls", tool_calls, "a list of tool calls"
                )
            out["tool_calls"] = [
                _check_tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(tool_calls)
            ]
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise BadRequestError.invalid(
                    f"{where}.tool_call_id",
                    call_id,
                    "a tool message needs the id of the call it answers (tool_call_id)",
                )
            out["tool_call_id"] = call_id
        if isinstance(message.get("name"), str):
            out["name"] = message["name"]
        clean.append(out)
    check_sources(images, allowed_local_media_path, allowed_media_domains)
    return clean


def validate_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Check OpenAI-style tool schemas (``{"type": "function", "function": {...}}``)."""
    if tools is None:
        return None
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise BadRequestError.invalid("tools", tools, "a list of OpenAI-style function tools")
    clean = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if (
            not isinstance(tool, Mapping)
            or tool.get("type", "function") != "function"
            or not isinstance(function, Mapping)
        ):
            raise BadRequestError.invalid(
                where, tool, "{'type': 'function', 'function': {'name': ..., 'parameters': {...}}}"
            )
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise BadRequestError.invalid(f"{where}.function.name", name, "a non-empty string")
        params = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, Mapping) or params.get("type", "object") != "object":
            raise BadRequestError.invalid(
                f"{where}.function.parameters", params, "a JSON schema of type 'object'"
            )
        clean.append({"type": "function", "function": {**function, "parameters": dict(params)}})
    return clean


def validate_tool_choice(tool_choice: Any, tools: list[dict[str, Any]] | None) -> str | None:
    """Normalise ``tool_choice`` to ``None``/"auto"/"none"/"required" or a tool name.

    Takes OpenAI's forms (a string, ``{"type": "function", "function": {"name": ...}}``) and
    LangChain's (``"any"`` or ``True`` for "required", ``False`` for "none").
    """
    if tool_choice is None:
        return None
    given = tool_choice
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        tool_choice = (
            function.get("name") if isinstance(function, Mapping) else tool_choice.get("name")
        )
    if tool_choice is True or tool_choice == "any":
        tool_choice = "required"
    elif tool_choice is False:
        tool_choice = "none"
    names = [t["function"]["name"] for t in tools or ()]
    expected = "'auto', 'none', 'required' ('any' or True) or the name of a tool"
    if not isinstance(tool_choice, str):
        raise BadRequestError.invalid("tool_choice", given, f"{expected} {names}")
    if tool_choice in ("auto", "none"):
        return tool_choice
    if not names:
        raise BadRequestError.invalid("tool_choice", given, "tool_choice needs tools")
    if tool_choice == "required" or tool_choice in names:
        return tool_choice
    raise BadRequestError.invalid(
        "tool_choice", given, f"names an unknown tool; known tools: {names}"
    )
