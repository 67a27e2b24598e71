"""Responses in one process's memory (``":memory:"``), with the file's limits."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence

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
        self._items: dict[str, tuple[float, int, str, str]] = {}  # insertion order: oldest first
        self._events: dict[str, list[StoredEvent]] = {}

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
            for key in [k for k, v in self._items.items() if v[0] <= now]:
                self._drop(key)
            was = self._items.get(rid)
            if keep_cancelled and was and json.loads(was[2])["status"] == "cancelled":
                return False
            self._items.pop(rid, None)
            kept = self._events.setdefault(rid, [])
            kept.extend(events)
            if not kept:
                del self._events[rid]
            size += events_size(kept)
            self._items[rid] = (now + self.ttl_seconds, size, response, messages)
            self._evict()
        return True

    def _drop(self, response_id: str) -> int:
        """Delete a response and its events; its size."""
        self._events.pop(response_id, None)
        return self._items.pop(response_id)[1]

    def _evict(self) -> None:
        total = sum(v[1] for v in self._items.values())
        while total > self.max_bytes:
            total -= self._drop(next(iter(self._items)))

    def add_events(self, response_id: str, events: Sequence[StoredEvent]) -> None:
        with self._lock:
            item = self._items.get(response_id)
            if item is None:  # gone meanwhile: its events would stay
                return
            self._events.setdefault(response_id, []).extend(events)
            self._items[response_id] = (item[0], item[1] + events_size(events), *item[2:])
            self._evict()

    def events(self, response_id: str, after: int) -> list[StoredEvent] | None:
        with self._lock:
            kept = self._events.get(response_id)
            return None if kept is None else [e for e in kept if e.sequence_number > after]

    def status(self, response_id: str) -> str | None:
        """The stored response's ``status`` (``None``: not stored)."""
        got = self.get(response_id)
        return None if got is None else str(got.response["status"])

    def cancel(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            item = self._items.get(response_id)
            if item is None or item[0] <= self._clock():
                return None
            stored = StoredResponse(json.loads(item[2]), json.loads(item[3]))
            if stored.response["status"] in CANCELLABLE:
                stored.response["status"] = "cancelled"
                self._items[response_id] = (*item[:2], json.dumps(stored.response), item[3])
        return stored

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            item = self._items.get(response_id)
        if item is None or item[0] <= self._clock():
            return None
        return StoredResponse(json.loads(item[2]), json.loads(item[3]))

    def total_bytes(self) -> int:
        """The stored JSON's size now."""
        with self._lock:
            return sum(v[1] for v in self._items.values())

    def close(self) -> None:
        with self._lock:
            self._items.clear()
            self._events.clear()
