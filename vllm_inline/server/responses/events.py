"""A streamed response's events, from its deltas (:func:`turn_events`), and their SSE frames:
one generator for ``stream: true`` in the foreground, where the route sends each event, and in
the background, where a task keeps each in the store for every reader (:mod:`.background`)."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import aclosing
from typing import Any

from vllm_inline.engine import Delta, VLLMInlineError
from vllm_inline.server.errors import status_of
from vllm_inline.server.responses.records import StoredEvent
from vllm_inline.server.responses.turn import Turn

__all__ = ["LAST_EVENTS", "sse", "sse_of", "turn_events"]

LAST_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
"""The types of a stream's last event."""


def sse(event: Mapping[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


def sse_of(event: StoredEvent) -> str:
    return f"event: {event.type}\ndata: {event.data}\n\n"


async def turn_events(
    turn: Turn, first: Delta | None, deltas: AsyncIterator[Delta]
) -> AsyncGenerator[dict[str, Any], None]:
    """The events, each with its ``sequence_number``: ``response.created`` and
    ``response.in_progress``, each delta's (``first``, when the caller read it already, then
    the rest), the last item's ``done``, then ``response.completed`` (or ``.incomplete``); an
    engine error ends them with ``response.failed``. The last event carries the response to
    store. Closing this generator closes the engine stream (which aborts the request)."""
    number = 0

    def numbered(event: dict[str, Any]) -> dict[str, Any]:
        nonlocal number
        event["sequence_number"] = number
        number += 1
        return event

    start = turn.response("in_progress")
    async with aclosing(deltas):  # type: ignore[type-var]  # closed however this one ends
        yield numbered({"response": start, "sequence_number": 0, "type": "response.created"})
        yield numbered({"response": start, "sequence_number": 0, "type": "response.in_progress"})
        try:
            if first is not None:
                for event in turn.fold.feed(first):
                    yield numbered(event)
            async for delta in deltas:
                for event in turn.fold.feed(delta):
                    yield numbered(event)
            for event in turn.fold.close():
                yield numbered(event)
        except Exception as e:  # noqa: BLE001 - headers are gone: the last event says it
            http = status_of(e) if isinstance(e, VLLMInlineError) else 500
            code = "server_error" if http >= 500 else "invalid_request"
            failed = turn.response("failed", error={"code": code, "message": str(e)})
            yield numbered({"response": failed, "sequence_number": 0, "type": "response.failed"})
            return
    status = turn.status()
    kind = "response.incomplete" if status == "incomplete" else "response.completed"
    yield numbered({"response": turn.response(status), "sequence_number": 0, "type": kind})
