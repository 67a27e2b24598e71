"""The engine's deltas as a Responses answer: output items, stream events, the response object
and its usage, in ``vllm serve``'s shapes (``vllm/entrypoints/openai/responses/``:
``streaming_events.py``'s simple event processor, ``protocol.py``'s ``ResponsesResponse``):
pure functions and one pure state machine, :class:`OutputFold`.

One fold serves both answers, as the chat route's streamed and whole answers come from the same
deltas: each delta is split in reasoning, text and tool-call fragments (in that order), each
opens an output item when the kind changes (a ``reasoning`` item, an assistant ``message``, a
``function_call`` per call), sends its delta events, and the previous item's ``done`` events.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any

from vllm_inline.engine import Delta, ToolCallDelta, Usage
from vllm_inline.engine.stream.openai_format import logprobs_dict
from vllm_inline.server.responses.tools import CallName, custom_input

__all__ = ["OutputFold", "response_object", "usage_object"]


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


class OutputFold:
    """Deltas in, stream events (dicts without ``sequence_number``) and output items out.

    ``include_reasoning=False`` leaves reasoning out (vLLM's extra); ``parallel_tool_calls=
    False`` keeps the first tool call only, as ``vllm serve`` filters them;
    ``top_logprobs`` (``None``: no logprobs asked) shapes each text delta's ``logprobs``;
    ``whole``: for a whole answer, where the message's logprobs also hold tokens with no text
    (the end of turn), as ``vllm serve`` lists them there and not in a stream; ``tool_names``:
    what the flat names the model calls stand for (:func:`.tools.chat_tools`): a namespaced
    function's call names its namespace, a custom tool's call is a ``custom_tool_call``."""

    def __init__(
        self,
        *,
        include_reasoning: bool = True,
        parallel_tool_calls: bool = True,
        top_logprobs: int | None = None,
        whole: bool = False,
        new_id: Callable[[str], str] = _new_id,
        tool_names: Mapping[str, CallName] | None = None,
    ) -> None:
        self.output: list[dict[str, Any]] = []
        """The finished output items, in order."""
        self.finish_reason: str | None = None
        """The engine's finish reason, once the last delta came."""
        self.usage: Usage | None = None
        """The token counts, once the last delta came."""
        self.reasoning = ""
        """All the reasoning text (the route counts its tokens)."""
        self._include_reasoning = include_reasoning
        self._parallel = parallel_tool_calls
        self._top_logprobs = top_logprobs
        self._whole = whole
        self._new_id = new_id
        self._tool_names = tool_names or {}
        self._kind: str | None = None  # "reasoning", "message" or "function_call"
        self._item: dict[str, Any] = {}
        self._text = ""
        self._logprobs: list[dict[str, Any]] = []
        self._call_index: int | None = None

    # -- deltas in ------------------------------------------------------------------------

    def feed(self, delta: Delta) -> list[dict[str, Any]]:
        """The events of one delta."""
        events: list[dict[str, Any]] = []
        if delta.reasoning:
            self.reasoning += delta.reasoning
        if delta.reasoning and self._include_reasoning:
            events += self._to("reasoning")
            events += self._reasoning_delta(delta.reasoning)
        if delta.text:
            events += self._to("message")
            events += self._text_delta(delta)
        elif self._whole and self._kind == "message" and delta.logprobs:
            self._text_delta(delta)  # the end-of-turn token's logprob: in a whole answer only
        for call in delta.tool_calls:
            if not self._parallel and call.index > 0:
                continue
            if self._kind != "function_call" or call.index != self._call_index:
                events += self._to("function_call", call)
            if call.arguments:
                events += self._arguments_delta(call.arguments)
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason
        if delta.usage is not None:
            self.usage = delta.usage
        return events

    def close(self) -> list[dict[str, Any]]:
        """The last item's ``done`` events (after the last delta)."""
        return self._to(None)

    # -- items ----------------------------------------------------------------------------

    def _to(self, kind: str | None, call: ToolCallDelta | None = None) -> list[dict[str, Any]]:
        """Close the open item unless it is of ``kind`` (a new call always closes), then open
        one of ``kind``."""
        if kind == self._kind and call is None:
            return []
        events = self._done() if self._kind is not None else []
        self._kind, self._text, self._logprobs = kind, "", []
        index = len(self.output)
        if kind is None:
            return events
        if kind == "reasoning":
            self._item = {
                "id": self._new_id("rs"),
                "summary": [],
                "type": "reasoning",
                "content": None,
                "encrypted_content": None,
                "status": "in_progress",
            }
            part: dict[str, Any] = {"text": "", "type": "reasoning_text"}
        elif kind == "message":
            self._item = {
                "id": self._new_id("msg"),
                "content": [],
                "role": "assistant",
                "status": "in_progress",
                "type": "message",
                "phase": None,
            }
            part = {"annotations": [], "text": "", "type": "output_text", "logprobs": []}
        else:
            assert call is not None
            self._call_index = call.index
            called = self._tool_names.get(call.name or "") or CallName(call.name or "")
            self._item = {
                "arguments": "",
                "call_id": call.id or f"call_{uuid.uuid4().hex[:24]}",
                "name": called.name,
                "type": "function_call",
                "id": self._new_id("fc"),
                "caller": None,
                "namespace": called.namespace,
                "status": "in_progress",
            }
            if called.custom:
                self._item = {
                    "call_id": self._item["call_id"],
                    "input": "",
                    "name": called.name,
                    "type": "custom_tool_call",
                    "id": self._new_id("ctc"),
                    "caller": None,
                    "namespace": None,
                }
        events.append(
            {"item": dict(self._item), "output_index": index, "type": "response.output_item.added"}
        )
        if kind != "function_call":
            events.append(
                {
                    "content_index": 0,
                    "item_id": self._item["id"],
                    "output_index": index,
                    "part": part,
                    "type": "response.content_part.added",
                }
            )
        return events

    def _where(self) -> dict[str, Any]:
        return {"content_index": 0, "item_id": self._item["id"], "output_index": len(self.output)}

    def _reasoning_delta(self, text: str) -> list[dict[str, Any]]:
        self._text += text
        return [{**self._where(), "delta": text, "type": "response.reasoning_text.delta"}]

    def _text_delta(self, delta: Delta) -> list[dict[str, Any]]:
        self._text += delta.text
        logprobs: list[dict[str, Any]] = []
        if self._top_logprobs is not None and delta.logprobs:
            logprobs = logprobs_dict(delta.logprobs, self._top_logprobs or None)["content"]
            if not self._top_logprobs:
                logprobs = [{**lp, "top_logprobs": []} for lp in logprobs]
            self._logprobs += logprobs
        streamed = [
            {
                "token": lp["token"],
                "logprob": lp["logprob"],
                "top_logprobs": [
                    {"token": t["token"], "logprob": t["logprob"]} for t in lp["top_logprobs"]
                ],
            }
            for lp in logprobs
        ]
        return [
            {
                **self._where(),
                "delta": delta.text,
                "logprobs": streamed,
                "type": "response.output_text.delta",
            }
        ]

    def _arguments_delta(self, arguments: str) -> list[dict[str, Any]]:
        self._text += arguments
        if self._item["type"] == "custom_tool_call":
            # Its input is a string inside the arguments' JSON, whole only at the end: it is
            # sent in one delta then (vLLM decodes partial JSON to send it in pieces).
            return []
        return [
            {
                "delta": arguments,
                "item_id": self._item["id"],
                "output_index": len(self.output),
                "type": "response.function_call_arguments.delta",
            }
        ]

    def _done(self) -> list[dict[str, Any]]:
        where, item = self._where(), self._item
        events: list[dict[str, Any]]
        if self._kind == "reasoning":
            part: dict[str, Any] = {"text": self._text, "type": "reasoning_text"}
            item = {**item, "content": [part], "status": "completed"}
            events = [
                {**where, "text": self._text, "type": "response.reasoning_text.done"},
                {**where, "part": part, "type": "response.content_part.done"},
            ]
        elif self._kind == "message":
            part = {
                "annotations": [],
                "text": self._text,
                "type": "output_text",
                "logprobs": self._logprobs or None,
            }
            item = {**item, "content": [part] if self._text else [], "status": "completed"}
            events = [
                {**where, "logprobs": [], "text": self._text, "type": "response.output_text.done"},
                {**where, "part": part, "type": "response.content_part.done"},
            ]
        elif item["type"] == "custom_tool_call":
            text = custom_input(self._text)
            item = {**item, "input": text}
            index, item_id = where["output_index"], item["id"]
            events = [
                {"delta": text, "item_id": item_id, "output_index": index,
                 "type": "response.custom_tool_call_input.delta"},
                {"input": text, "item_id": item_id, "output_index": index,
                 "type": "response.custom_tool_call_input.done"},
            ]  # fmt: skip
        else:
            item = {**item, "arguments": self._text, "status": "completed"}
            events = [
                {
                    "arguments": self._text,
                    "item_id": item["id"],
                    "name": item["name"],
                    "output_index": where["output_index"],
                    "type": "response.function_call_arguments.done",
                }
            ]
        events.append(
            {
                "item": item,
                "output_index": where["output_index"],
                "type": "response.output_item.done",
            }
        )
        self.output.append(item)
        return events


def usage_object(usage: Usage, reasoning_tokens: int = 0) -> dict[str, Any]:
    """The Responses ``usage``, as OpenAI's API defines it. ``cache_write_tokens``: 0, vLLM's
    engine reports no such count to a front end. ``vllm serve`` also sends its built-in tools'
    per-turn lists and ``tool_output_tokens`` in the details, which OpenAI's Agents SDK for
    JavaScript refuses (its schema takes numbers only there): they are left out."""
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


def response_object(
    *,
    response_id: str,
    created_at: int,
    model: str,
    echoed: Mapping[str, Any],
    sampling: Mapping[str, Any],
    output: list[dict[str, Any]],
    status: str,
    usage: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``response`` object, field by field as ``vllm serve`` sends it (less its null fields
    for transfers between vLLM instances, as the chat route leaves them out). ``sampling``: the
    effective ``temperature``, ``top_p``, ``max_output_tokens``, ``presence_penalty`` and
    ``frequency_penalty``. ``error`` (OpenAI's ``{"code", "message"}``) only when it failed."""
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    response = {
        "id": response_id,
        "created_at": created_at,
        "incomplete_details": incomplete,
        "instructions": echoed["instructions"],
        "metadata": echoed["metadata"],
        "model": model,
        "object": "response",
        "output": output,
        "parallel_tool_calls": echoed["parallel_tool_calls"],
        "temperature": sampling["temperature"],
        "tool_choice": echoed["tool_choice"],
        "tools": echoed["tools"],
        "top_p": sampling["top_p"],
        "background": echoed["background"],
        "max_output_tokens": sampling["max_output_tokens"],
        "max_tool_calls": echoed["max_tool_calls"],
        "previous_response_id": echoed["previous_response_id"],
        "prompt": echoed["prompt"],
        "reasoning": echoed["reasoning"],
        "service_tier": echoed["service_tier"],
        "status": status,
        "text": echoed["text"],
        "top_logprobs": echoed["top_logprobs"],
        "truncation": echoed["truncation"],
        "usage": usage,
        "user": echoed["user"],
        "presence_penalty": sampling["presence_penalty"],
        "frequency_penalty": sampling["frequency_penalty"],
        "input_messages": None,
        "output_messages": None,
    }
    if error is not None:
        response["error"] = error
    return response
