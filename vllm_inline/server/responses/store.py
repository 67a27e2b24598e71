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

import contextlib
import json
import logging
import os
import pathlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

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

logger = logging.getLogger("vllm_inline")

STORE_VARIABLE = "VLLMINLINE_RESPONSES_STORE"
"""The store's file (or ``:memory:``) when the server is given none: how ``serve --workers N``
tells every worker the same file."""
MEMORY = ":memory:"
"""The name that asks for :class:`MemoryResponseStore` (one process only)."""
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


def _check_limits(max_bytes: int, ttl_seconds: float) -> None:
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ValueError(f"max_bytes={max_bytes!r} is invalid: a positive number of bytes.")
    if not isinstance(ttl_seconds, (int, float)) or not ttl_seconds > 0:
        raise ValueError(f"ttl_seconds={ttl_seconds!r} is invalid: a positive number of seconds.")


def _encoded(stored: StoredResponse) -> tuple[str, str]:
    return json.dumps(stored.response), json.dumps(stored.messages)


def _checked_size(response: str, messages: str, max_bytes: int) -> int:
    size = len(response.encode()) + len(messages.encode())
    if size > max_bytes:
        msg = (
            f"The response is {size} bytes, more than the whole store may hold "
            f"({max_bytes}); raise the store's max_bytes."
        )
        raise ValueError(msg)
    return size


_SCHEMA_VERSION = 1
"""``PRAGMA user_version`` of the file this code writes."""
_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    stored_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    bytes INTEGER NOT NULL,
    status TEXT NOT NULL,
    response TEXT NOT NULL,
    messages TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_by_age ON responses (stored_at);
CREATE INDEX IF NOT EXISTS responses_by_expiry ON responses (expires_at);
"""


class SQLiteResponseStore:
    """Responses in a SQLite file that every process of the machine may share (see the module).

    ``max_bytes`` bounds the stored JSON (the oldest responses go first), ``ttl_seconds`` how
    long one is kept; ``clock`` gives the time (seconds), for tests.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        _check_limits(max_bytes, ttl_seconds)
        self.path = pathlib.Path(path).expanduser()
        """The database file (``-wal`` and ``-shm`` files sit beside it while it is open)."""
        self.max_bytes = max_bytes
        """The most stored JSON kept, in bytes."""
        self.ttl_seconds = ttl_seconds
        """How long a response is kept."""
        self._clock = clock
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # One connection per store, used by one thread at a time (the lock): the route calls
        # the store from asyncio's worker threads. Autocommit mode: transactions are explicit.
        self._db = sqlite3.connect(
            self.path, timeout=30, isolation_level=None, check_same_thread=False
        )
        self._lock = threading.Lock()
        with self._lock:
            # WAL: readers never wait for the writer, and a writer killed mid-transaction leaves
            # only uncommitted frames that the next opener ignores. busy_timeout: a writer waits
            # for another process's transaction (each is a few milliseconds) instead of failing.
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA busy_timeout=30000")
            self._db.executescript(_SCHEMA)
            (version,) = self._db.execute("PRAGMA user_version").fetchone()
            if version not in (0, _SCHEMA_VERSION):
                self._db.close()
                msg = (
                    f"{self.path} holds responses of another vllm-inline version (schema "
                    f"{version}, this one reads {_SCHEMA_VERSION}): move it away or name "
                    "another file."
                )
                raise ValueError(msg)
            self._db.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")

    def put(self, stored: StoredResponse, *, keep_cancelled: bool = False) -> bool:
        response, messages = _encoded(stored)
        size = _checked_size(response, messages, self.max_bytes)
        now = self._clock()
        with self._lock, self._transaction() as db:
            # One transaction per response: the expired ones out, this one in, the oldest out
            # while over the limit.
            if keep_cancelled and self._status(db, stored.response["id"], now) == "cancelled":
                return False
            db.execute("DELETE FROM responses WHERE expires_at <= ?", (now,))
            db.execute(
                "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?)",
                (stored.response["id"], now, now + self.ttl_seconds, size,
                 stored.response["status"], response, messages),
            )  # fmt: skip
            self._evict(db)
        return True

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE (the write lock first, so two workers' read-then-write never
        interleave), COMMIT, or ROLLBACK on any error."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _status(self, db: sqlite3.Connection, response_id: str, now: float) -> str | None:
        row = db.execute(
            "SELECT status FROM responses WHERE id = ? AND expires_at > ?", (response_id, now)
        ).fetchone()
        return None if row is None else str(row[0])

    def status(self, response_id: str) -> str | None:
        """The stored response's ``status`` (``None``: not stored): a cheap poll."""
        with self._lock:
            return self._status(self._db, response_id, self._clock())

    def cancel(self, response_id: str) -> StoredResponse | None:
        now = self._clock()
        with self._lock, self._transaction() as db:
            row = db.execute(
                "SELECT response, messages FROM responses WHERE id = ? AND expires_at > ?",
                (response_id, now),
            ).fetchone()
            if row is None:
                return None
            stored = StoredResponse(json.loads(row[0]), json.loads(row[1]))
            if stored.response["status"] not in CANCELLABLE:
                return stored
            stored.response["status"] = "cancelled"
            db.execute(
                "UPDATE responses SET status = 'cancelled', response = ? WHERE id = ?",
                (json.dumps(stored.response), response_id),
            )
        return stored

    def _evict(self, db: sqlite3.Connection) -> None:
        (total,) = db.execute("SELECT COALESCE(SUM(bytes), 0) FROM responses").fetchone()
        if total <= self.max_bytes:
            return
        over = total - self.max_bytes
        rows = db.execute("SELECT id, bytes FROM responses ORDER BY stored_at, rowid")
        doomed = []
        for response_id, size in rows:
            if over <= 0:
                break
            doomed.append((response_id,))
            over -= size
        db.executemany("DELETE FROM responses WHERE id = ?", doomed)

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            row = self._db.execute(
                "SELECT response, messages FROM responses WHERE id = ? AND expires_at > ?",
                (response_id, self._clock()),
            ).fetchone()
        if row is None:
            return None
        return StoredResponse(json.loads(row[0]), json.loads(row[1]))

    def total_bytes(self) -> int:
        """The stored JSON's size now (expired responses not yet deleted included)."""
        with self._lock:
            (total,) = self._db.execute("SELECT COALESCE(SUM(bytes), 0) FROM responses").fetchone()
        return int(total)

    def close(self) -> None:
        with self._lock:
            self._db.close()


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
        _check_limits(max_bytes, ttl_seconds)
        self.max_bytes = max_bytes
        """The most stored JSON kept, in bytes."""
        self.ttl_seconds = ttl_seconds
        """How long a response is kept."""
        self._clock = clock
        self._lock = threading.Lock()
        self._items: dict[str, tuple[float, int, str, str]] = {}  # insertion order: oldest first

    def put(self, stored: StoredResponse, *, keep_cancelled: bool = False) -> bool:
        response, messages = _encoded(stored)
        size = _checked_size(response, messages, self.max_bytes)
        now = self._clock()
        rid = stored.response["id"]
        with self._lock:
            for key in [k for k, v in self._items.items() if v[0] <= now]:
                del self._items[key]
            was = self._items.get(rid)
            if keep_cancelled and was and json.loads(was[2])["status"] == "cancelled":
                return False
            self._items.pop(rid, None)
            self._items[rid] = (now + self.ttl_seconds, size, response, messages)
            total = sum(v[1] for v in self._items.values())
            while total > self.max_bytes:
                oldest = next(iter(self._items))
                total -= self._items.pop(oldest)[1]
        return True

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
                self._items[response_id] = (item[0], item[1], json.dumps(stored.response), item[3])
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
