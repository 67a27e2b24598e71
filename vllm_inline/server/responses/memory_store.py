"""Responses in one process's memory (``":memory:"``), with the file's limits."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from vllm_inline.server.responses.records import (
    CANCELLABLE,
    DEFAULT_MAX_BYTES,
    DEFAULT_TTL_SECONDS,
    StoredEvent,
    StoredResponse,
    check_limits,
    checked_size,
    encoded,
    events_size,
)

__all__ = ["MemoryResponseStore"]


@dataclass
class _Item:
    """One response as the memory store keeps it (JSON, as the file does)."""

    expires_at: float
    size: int
    status: str
    response: str
    messages: str
    events: list[StoredEvent] = field(default_factory=list)

    def stored(self) -> StoredResponse:
        return StoredResponse(json.loads(self.response), json.loads(self.messages))


class MemoryResponseStore:
    """Responses in this process's memory, with the same limits as the file: for a server of
    one process that asks for it. Workers of ``--workers N`` would each see only their own."""

    def __init__(
        self,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        check_limits(max_bytes, ttl_seconds)
        self.max_bytes = max_bytes
        """The most stored JSON kept, in bytes."""
        self.ttl_seconds = ttl_seconds
        """How long a response is kept."""
        self._clock = clock
        self._lock = threading.Lock()
        self._items: dict[str, _Item] = {}  # insertion order: oldest first
        self._total = 0

    def put(
        self,
        stored: StoredResponse,
        *,
        keep_cancelled: bool = False,
        events: Sequence[StoredEvent] = (),
    ) -> bool:
        response, messages = encoded(stored)
        size = checked_size(response, messages, self.max_bytes)
        now = self._clock()
        rid = stored.response["id"]
        with self._lock:
            for key in [k for k, v in self._items.items() if v.expires_at <= now]:
                self._drop(key)
            was = self._items.get(rid)
            if keep_cancelled and was and was.status == "cancelled":
                return False
            kept = [*(was.events if was else ()), *events]
            if was is not None:
                self._drop(rid)
            status = str(stored.response["status"])
            item = _Item(now + self.ttl_seconds, size + events_size(kept), status, response,
                         messages, kept)  # fmt: skip
            self._items[rid] = item
            self._total += item.size
            self._evict()
        return True

    def _drop(self, response_id: str) -> None:
        self._total -= self._items.pop(response_id).size

    def _evict(self) -> None:
        """The oldest finished ones out while over the limit (not one still running)."""
        for key in [k for k, v in self._items.items() if v.status not in CANCELLABLE]:
            if self._total <= self.max_bytes:
                return
            self._drop(key)

    def add_events(self, response_id: str, events: Sequence[StoredEvent]) -> bool:
        with self._lock:
            item = self._live(response_id)
            if item is None or item.status not in CANCELLABLE:
                return False  # cancelled, failed or gone meanwhile: the stream stops here
            item.events.extend(events)
            added = events_size(events)
            item.size += added
            self._total += added
            if self._total > self.max_bytes:
                self._evict()
        return True

    def events(self, response_id: str, after: int) -> list[StoredEvent] | None:
        with self._lock:
            item = self._items.get(response_id)
            if item is None or not item.events:
                return None
            return [e for e in item.events if e.sequence_number > after]

    def _live(self, response_id: str) -> _Item | None:
        item = self._items.get(response_id)
        return None if item is None or item.expires_at <= self._clock() else item

    def status(self, response_id: str) -> str | None:
        """The stored response's ``status`` (``None``: not stored)."""
        with self._lock:
            item = self._live(response_id)
            return None if item is None else item.status

    def cancel(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            item = self._live(response_id)
            if item is None:
                return None
            stored = item.stored()
            if item.status in CANCELLABLE:
                stored.response["status"] = item.status = "cancelled"
                item.response = json.dumps(stored.response)
        return stored

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            item = self._live(response_id)
        return None if item is None else item.stored()

    def total_bytes(self) -> int:
        """The stored JSON's size now."""
        with self._lock:
            return self._total

    def close(self) -> None:
        with self._lock:
            self._items.clear()
            self._total = 0
