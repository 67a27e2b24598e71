"""The default response store: one SQLite file that every worker of the machine shares (see
:mod:`.store`)."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator

from vllm_inline.server.responses.records import (
    CANCELLABLE,
    DEFAULT_MAX_BYTES,
    DEFAULT_TTL_SECONDS,
    StoredResponse,
    check_limits,
    checked_size,
    encoded,
)

__all__ = ["SQLiteResponseStore"]


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
        check_limits(max_bytes, ttl_seconds)
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
        response, messages = encoded(stored)
        size = checked_size(response, messages, self.max_bytes)
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
