"""The Responses API's tools as the engine's chat tools, and the calls back as output items, as
``vllm serve`` handles each (``vllm/tool_parsers/utils.py``: ``get_function_tools``,
``custom_tool_as_function_dict``; ``vllm/entrypoints/openai/responses/utils.py``):

- ``function`` tools are chat tools;
- a ``namespace`` tool's functions are flattened to ``<namespace>__<name>``, and a call of one
  comes back as a ``function_call`` with its own ``name`` and its ``namespace``;
- a ``custom`` tool (free-form input, as Codex's ``apply_patch``) is shown as a function of one
  string argument, ``input``, and a call of it comes back as a ``custom_tool_call`` whose
  ``input`` is that string;
- hosted tools (:data:`HOSTED`: OpenAI runs them; a server without them cannot) are not shown to
  the model, as ``vllm serve`` drops them for every model but gpt-oss.

Written here rather than taken from vLLM: its helpers take its pydantic request types, and a
server on a host engine (``--keep-alive``) does not import vLLM. Pure functions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_inline.server.errors import InvalidBodyError

__all__ = [
    "CUSTOM_INPUT",
    "HOSTED",
    "CallName",
    "chat_tools",
    "custom_arguments",
    "custom_input",
    "flat_name",
]

CUSTOM_INPUT = "input"
"""The one argument of a custom tool's function (vLLM's ``CUSTOM_TOOL_INPUT_KEY``)."""
HOSTED = frozenset(
    {
        "file_search",
        "computer",
        "computer_use_preview",
        "web_search",
        "web_search_2025_08_26",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "mcp",
        "code_interpreter",
        "programmatic_tool_calling",
        "image_generation",
        "local_shell",
        "shell",
        "tool_search",
        "apply_patch",
    }
)
"""OpenAI's hosted tool types (``openai.types.responses.Tool``): dropped, as vLLM drops them."""
_CUSTOM_PARAMETERS = {
    "type": "object",
    "properties": {
        CUSTOM_INPUT: {"type": "string", "description": "The freeform text payload for this tool."}
    },
    "required": [CUSTOM_INPUT],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class CallName:
    """What a flat tool name the model calls stands for."""

    name: str
    """The tool's own name, as the client gave it."""
    namespace: str | None = None
    """The namespace tool it is in, if any."""
    custom: bool = False
    """A ``custom`` tool: its call is a ``custom_tool_call`` with a string ``input``."""


def flat_name(namespace: str | None, name: str) -> str:
    """The name the model sees: ``<namespace>__<name>`` for a namespaced tool (vLLM's)."""
    return f"{namespace}__{name}" if namespace else name


def custom_arguments(text: str) -> str:
    """A custom tool's ``input`` as the arguments of its function (for the conversation)."""
    return json.dumps({CUSTOM_INPUT: text}, ensure_ascii=False)


def custom_input(arguments: str) -> str:
    """The ``input`` of a finished custom call from its arguments; text that is not the
    one-string object passes through whole, as vLLM's ``decode_custom_tool_input``."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    value = parsed.get(CUSTOM_INPUT) if isinstance(parsed, dict) else None
    return value if isinstance(value, str) else arguments


def chat_tools(tools: Any) -> tuple[list[dict[str, Any]], dict[str, CallName]]:
    """The body's ``tools`` as the engine's chat tools, and what each flat name stands for."""
    if tools is None:
        return [], {}
    if not isinstance(tools, list):
        raise InvalidBodyError("body.tools", "Input should be a valid list")
    out: list[dict[str, Any]] = []
    names: dict[str, CallName] = {}
    for i, tool in enumerate(tools):
        place = f"body.tools.{i}"
        if not isinstance(tool, Mapping):
            raise InvalidBodyError(place, "Input should be a valid dictionary")
        kind = tool.get("type")
        if kind == "function":
            function = _function(tool, place, None)
            names[function["name"]] = CallName(tool["name"])
            out.append({"type": "function", "function": function})
        elif kind == "namespace":
            namespace = _name(tool, place)
            inner = tool.get("tools")
            if not isinstance(inner, list):
                raise InvalidBodyError(f"{place}.tools", "Input should be a valid list")
            for j, member in enumerate(inner):
                where = f"{place}.tools.{j}"
                if not isinstance(member, Mapping):
                    raise InvalidBodyError(where, "Input should be a valid dictionary")
                if member.get("type") != "function":
                    continue  # vLLM shows a namespace's functions only
                function = _function(member, where, namespace)
                names[function["name"]] = CallName(member["name"], namespace)
                out.append({"type": "function", "function": function})
        elif kind == "custom":
            name = _name(tool, place)
            # vLLM's FunctionDefinition order (name, description, parameters): the template
            # renders the tool as JSON, and the prompt is the same token for token.
            function = {"name": name}
            if tool.get("description") is not None:
                function["description"] = tool["description"]
            function["parameters"] = dict(_CUSTOM_PARAMETERS)
            names[name] = CallName(name, custom=True)
            out.append({"type": "function", "function": function})
        elif not isinstance(kind, str) or kind not in HOSTED:
            known = ["function", "namespace", "custom", *sorted(HOSTED)]
            raise InvalidBodyError(f"{place}.type", f"Input should be one of {known}")
    return out, names


def _name(tool: Mapping[str, Any], place: str) -> str:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidBodyError(f"{place}.name", "Field required")
    return name


def _function(tool: Mapping[str, Any], place: str, namespace: str | None) -> dict[str, Any]:
    name = _name(tool, place)
    parameters = tool.get("parameters")
    if parameters is not None and not isinstance(parameters, Mapping):
        raise InvalidBodyError(f"{place}.parameters", "Input should be a valid dictionary")
    function: dict[str, Any] = {"name": flat_name(namespace, name)}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    function["parameters"] = dict(parameters or {"type": "object", "properties": {}})
    if tool.get("strict") is not None:
        function["strict"] = tool["strict"]
    return function
