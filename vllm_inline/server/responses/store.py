"""The response store: what ``store=true`` keeps and ``previous_response_id`` and
``GET /v1/responses/{id}`` read back, shared by every worker of ``serve --workers N``.

:class:`SQLiteResponseStore` is the default: one SQLite file (stdlib ``sqlite3``) in WAL mode,
which any number of processes on the machine read and write at once; each response is written
in one transaction (a worker killed mid-write leaves the file as it was before that response);
expired responses are deleted, and the oldest ones too while the file holds more than its size
limit, in that same transaction. The file outlives the server, so a restarted launcher finds
what its workers stored. :class:`MemoryResponseStore` keeps them in one process's memory, for a
single-process server that asks for it (``":memory:"``).

Where the file is: ``OpenAIServer(responses_store=...)``, else ``serve --responses-store``, else
``$VLLMINLINE_RESPONSES_STORE``, else ``$VLLMINLINE_CACHE/responses.sqlite3``, else
``~/.cache/vllm_inline/responses.sqlite3`` (:func:`default_store_path`). It is opened at the
first request that needs it, so a server that never serves ``/v1/responses`` writes nothing.
"""

from __future__ import annotations

import os
import pathlib

from vllm_inline.server.responses.memory_store import MemoryResponseStore
from vllm_inline.server.responses.records import (
    CANCELLABLE,
    DEFAULT_MAX_BYTES,
    DEFAULT_TTL_SECONDS,
    ResponseStore,
    StoredResponse,
)
from vllm_inline.server.responses.sqlite_store import SQLiteResponseStore

__all__ = [
    "CANCELLABLE",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_TTL_SECONDS",
    "MEMORY",
    "STORE_VARIABLE",
    "MemoryResponseStore",
    "ResponseStore",
    "SQLiteResponseStore",
    "StoredResponse",
    "default_store_path",
    "open_store",
]

STORE_VARIABLE = "VLLMINLINE_RESPONSES_STORE"
"""The store's file (or ``:memory:``) when the server is given none: how ``serve --workers N``
tells every worker the same file."""
MEMORY = ":memory:"
"""The name that asks for :class:`MemoryResponseStore` (one process only)."""


def default_store_path() -> pathlib.Path:
    """``$VLLMINLINE_CACHE/responses.sqlite3``, else ``~/.cache/vllm_inline/responses.sqlite3``
    (the test kit's cache folder: ``vllm_inline.testing.default_root``'s parent)."""
    base = os.environ.get("VLLMINLINE_CACHE")
    root = pathlib.Path(base).expanduser() if base else pathlib.Path.home() / ".cache/vllm_inline"
    return root / "responses.sqlite3"


def open_store(
    where: str | os.PathLike[str] | None,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    ttl_seconds: float = DEFAULT_TTL_SECONDS,
) -> ResponseStore:
    """The store at ``where`` (a file path or :data:`MEMORY`); ``None``: ``$VLLMINLINE_RESPONSES_STORE``,
    else :func:`default_store_path`."""
    where = where or os.environ.get(STORE_VARIABLE) or default_store_path()
    if str(where) == MEMORY:
        return MemoryResponseStore(max_bytes=max_bytes, ttl_seconds=ttl_seconds)
    return SQLiteResponseStore(where, max_bytes=max_bytes, ttl_seconds=ttl_seconds)
