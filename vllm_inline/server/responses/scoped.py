"""The conversations of one API key: a store seen through a key (:class:`KeyScopedStore`).

A server with an API key keeps its responses under ids that name the key (a digest of it, never
the key), so that servers with other keys sharing one store file, or a server whose key was
changed, do not find each other's conversations: a response id from elsewhere is "not found",
as one never stored. A server without a key sees the responses stored without one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace

from vllm_inline.server.responses.records import ResponseStore, StoredEvent, StoredResponse

__all__ = ["KeyScopedStore", "scope_of"]


def scope_of(api_key: str | None) -> str:
    """The prefix of the ids a server with ``api_key`` stores under (``""`` without a key)."""
    if not api_key:
        return ""
    return "key-" + hashlib.sha256(api_key.encode()).hexdigest()[:16] + ":"


class KeyScopedStore:
    """``store`` as the server of one key sees it: the same methods, each response's id
    prefixed by :func:`scope_of` inside the store and not outside it."""

    def __init__(self, store: ResponseStore, scope: str) -> None:
        self.store = store
        self.scope = scope

    def _inside(self, stored: StoredResponse) -> StoredResponse:
        return replace(
            stored, response={**stored.response, "id": self.scope + stored.response["id"]}
        )

    def _outside(self, stored: StoredResponse | None) -> StoredResponse | None:
        if stored is None:
            return None
        return replace(
            stored, response={**stored.response, "id": stored.response["id"][len(self.scope) :]}
        )

    def put(
        self,
        stored: StoredResponse,
        *,
        keep_cancelled: bool = False,
        events: Sequence[StoredEvent] = (),
    ) -> bool:
        return self.store.put(self._inside(stored), keep_cancelled=keep_cancelled, events=events)

    def add_events(self, response_id: str, events: Sequence[StoredEvent]) -> bool:
        return self.store.add_events(self.scope + response_id, events)

    def events(self, response_id: str, after: int) -> list[StoredEvent] | None:
        events = self.store.events(self.scope + response_id, after)
        if events is None:
            return None
        # The store writes one event itself (a killed runner's response.failed), with the
        # response as it has it: its id inside the store.
        return [replace(e, data=e.data.replace(self.scope, "")) for e in events]

    def get(self, response_id: str) -> StoredResponse | None:
        return self._outside(self.store.get(self.scope + response_id))

    def cancel(self, response_id: str) -> StoredResponse | None:
        return self._outside(self.store.cancel(self.scope + response_id))

    def status(self, response_id: str) -> str | None:
        return self.store.status(self.scope + response_id)

    def close(self) -> None:
        self.store.close()
