"""What every response store keeps and how: the stored record, the store's protocol, its
limits (:mod:`.store` opens one; :mod:`.sqlite_store` and :mod:`.memory_store` are the two)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "CANCELLABLE",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_TTL_SECONDS",
    "ResponseStore",
    "StoredEvent",
    "StoredResponse",
    "check_limits",
    "checked_size",
    "encoded",
    "events_size",
    "stored_event",
]

DEFAULT_MAX_BYTES = 256 << 20
"""256 MiB of stored responses (their JSON): beyond it the oldest are deleted. A response holds
its whole conversation (at most the model's context, ~4 bytes a token: ~0.5 MiB at 128k
tokens), so this keeps hundreds of long agent conversations, many thousands of short ones."""
DEFAULT_TTL_SECONDS = 30 * 24 * 3600.0
"""30 days, as OpenAI keeps stored responses; older ones are deleted."""
CANCELLABLE = ("queued", "in_progress")
"""The statuses of a background response that ``cancel`` can still stop."""


@dataclass(frozen=True)
class StoredResponse:
    """One stored response."""

    response: dict[str, Any]
    """The response object, as ``GET /v1/responses/{id}`` returns it."""
    messages: list[dict[str, Any]]
    """The whole conversation as chat messages, its input and its output, without the
    request's ``instructions`` (which do not carry over): where a request naming it as
    ``previous_response_id`` starts."""


@dataclass(frozen=True)
class StoredEvent:
    """One stream event of a background response streamed (``background`` and ``stream``),
    kept so that ``GET /v1/responses/{id}?stream=true`` replays it on any worker."""

    sequence_number: int
    """The event's ``sequence_number`` (from 0, in order)."""
    type: str
    """The event's ``type`` (the SSE ``event:`` line)."""
    data: str
    """The event, as JSON."""


def stored_event(event: dict[str, Any]) -> StoredEvent:
    """``event`` (numbered) as the store keeps it."""
    return StoredEvent(event["sequence_number"], event["type"], json.dumps(event))


def events_size(events: Sequence[StoredEvent]) -> int:
    return sum(len(e.data.encode()) for e in events)


@runtime_checkable
class ResponseStore(Protocol):
    """Where responses are kept (all methods blocking: the route calls them in a thread)."""

    def put(
        self,
        stored: StoredResponse,
        *,
        keep_cancelled: bool = False,
        events: Sequence[StoredEvent] = (),
    ) -> bool:
        """Keep ``stored`` under its response's ``id``, replacing one with that id (its events
        stay), unless ``keep_cancelled`` and that one was cancelled (then ``False``, nothing
        written); ``events`` are added to the response's in the same write."""

    def add_events(self, response_id: str, events: Sequence[StoredEvent]) -> bool:
        """Add ``events`` to the stored response's (they count in its size, and go with it),
        in one write, while it is ``queued`` or ``in_progress``; ``False`` (nothing written):
        it is cancelled, failed or gone."""

    def events(self, response_id: str, after: int) -> list[StoredEvent] | None:
        """The response's events numbered after ``after``, in order; ``None``: it has none
        (not stored, or not streamed in the background)."""

    def get(self, response_id: str) -> StoredResponse | None:
        """The stored response, or ``None`` (never stored, expired or evicted)."""

    def cancel(self, response_id: str) -> StoredResponse | None:
        """Mark a ``queued`` or ``in_progress`` response ``cancelled`` and return it as it is
        now (whatever its status; ``None``: not stored)."""

    def status(self, response_id: str) -> str | None:
        """The stored response's ``status`` (``None``: not stored): a cheap poll."""

    def close(self) -> None:
        """Release the store's resources."""


def check_limits(max_bytes: int, ttl_seconds: float) -> None:
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ValueError(f"max_bytes={max_bytes!r} is invalid: a positive number of bytes.")
    if not isinstance(ttl_seconds, (int, float)) or not ttl_seconds > 0:
        raise ValueError(f"ttl_seconds={ttl_seconds!r} is invalid: a positive number of seconds.")


def encoded(stored: StoredResponse) -> tuple[str, str]:
    return json.dumps(stored.response), json.dumps(stored.messages)


def checked_size(response: str, messages: str, max_bytes: int) -> int:
    size = len(response.encode()) + len(messages.encode())
    if size > max_bytes:
        msg = (
            f"The response is {size} bytes, more than the whole store may hold "
            f"({max_bytes}); raise the store's max_bytes."
        )
        raise ValueError(msg)
    return size
