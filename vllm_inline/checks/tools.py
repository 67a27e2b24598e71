"""The check's tool-call round trip (``python -m vllm_inline check``, :mod:`.check`): one call
of a weather tool, its result sent back, the answer after it; and the prompt rendering the
check's rows share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vllm_inline.engine import Engine
from vllm_inline.engine.errors import ChatTemplateError

from .report import Report, shorten

__all__ = ["WEATHER", "add_tool_rows", "rendered"]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
"""The tool the round trip offers the model."""


def rendered(
    engine: Engine, messages: Sequence[Mapping[str, Any]], **kw: Any
) -> tuple[list[int] | None, str]:
    """The prompt's token ids, or ``None`` and why the template refused it."""
    try:
        return engine.prompt_token_ids(list(messages), **kw), ""
    except ChatTemplateError as e:
        return None, str(e)


def add_tool_rows(engine: Engine, report: Report, tool_parser: str | None) -> None:
    """One tool-call round trip when the template takes tools (never fails the check)."""
    user = [{"role": "user", "content": "What is the weather in Oslo? Use the get_weather tool."}]
    plain, _ = rendered(engine, user)
    with_tools, error = rendered(engine, user, tools=[WEATHER])
    if with_tools is None:
        report.add("tool round trip", "info", "the template refuses tools", error)
        return
    if with_tools == plain:
        report.add("tool round trip", "info", "skipped: the template does not render tools")
        return
    if tool_parser is None:
        report.add(
            "tool round trip",
            "warn",
            "no tool parser",
            "The template takes tools but the family has no default parser: pass "
            "--tool-parser (e.g. hermes, llama3_json, mistral, pythonic).",
        )
        return
    calls: dict[int, dict[str, str]] = {}
    text = []
    for delta in engine.stream(
        user, tools=[WEATHER], tool_parser=tool_parser, temperature=0.0, max_tokens=256
    ):
        text.append(delta.text)
        for c in delta.tool_calls:
            call = calls.setdefault(c.index, {"id": "", "name": "", "arguments": ""})
            call["id"] = c.id or call["id"]
            call["name"] = c.name or call["name"]
            call["arguments"] += c.arguments
    if not calls:
        report.add(
            "tool round trip",
            "info",
            "the model answered without calling the tool",
            f"answer: {shorten(''.join(text), 160)}",
        )
        return
    call = calls[min(calls)]
    call_id = call["id"] or "call_0"
    follow: list[dict[str, Any]] = [
        *user,
        {
            "role": "assistant",
            "content": "".join(text) or None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"] or "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "It is sunny in Oslo."},
    ]
    answer = "".join(
        d.text
        for d in engine.stream(
            follow, tools=[WEATHER], tool_parser=tool_parser, temperature=0.0, max_tokens=256
        )
    )
    report.add(
        "tool round trip",
        "ok",
        f"{call['name']}({call['arguments']}) with {tool_parser}",
        f"answer after the tool result: {shorten(answer, 160)}",
    )
