"""What every response store keeps and how: the stored record, the store's protocol, its
limits (:mod:`.store` opens one; :mod:`.sqlite_store` and :mod:`.memory_store` are the two)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "CANCELLABLE",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_TTL_SECONDS",
    "ResponseStore",
    "StoredResponse",
    "check_limits",
    "checked_size",
    "encoded",
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


@runtime_checkable
class ResponseStore(Protocol):
    """Where responses are kept (all methods blocking: the route calls them in a thread)."""

    def put(self, stored: StoredResponse, *, keep_cancelled: bool = False) -> bool:
        """Keep ``stored`` under its response's ``id``, replacing one with that id, unless
        ``keep_cancelled`` and that one was cancelled (then ``False``, nothing written)."""

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
