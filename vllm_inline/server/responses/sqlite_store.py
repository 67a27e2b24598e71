"""The default response store: one SQLite file that every worker of the machine shares (see
:mod:`.store`).

Each response still ``queued`` or ``in_progress`` names the process that runs it
(``<pid>-<start>``, the process that stored it: a background response runs in the worker that
took the request). A worker killed meanwhile cannot mark its responses; the first read that
finds one whose process has ended marks it ``failed`` (and ends its stream, if it streams, with
``response.failed``), in one transaction, so every worker (and a restarted group) then reads
the same. The events of a response streamed in the background
are rows of their own, counted in its size and deleted with it. Processes of one machine: the
file is WAL, which needs shared memory."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from vllm_inline.engine.seam import ipc_directory
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
    stored_event,
)

__all__ = ["SQLiteResponseStore", "failed_as_orphan", "runner_gone", "this_runner"]


_SCHEMA_VERSION = 3
"""``PRAGMA user_version`` of the file this code writes (1: before the ``runner`` column, 2:
before the ``events`` table; opening adds them)."""
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS responses (
        id TEXT PRIMARY KEY,
        stored_at REAL NOT NULL,
        expires_at REAL NOT NULL,
        bytes INTEGER NOT NULL,
        status TEXT NOT NULL,
        response TEXT NOT NULL,
        messages TEXT NOT NULL,
        runner TEXT
    )""",
    "CREATE INDEX IF NOT EXISTS responses_by_age ON responses (stored_at)",
    "CREATE INDEX IF NOT EXISTS responses_by_expiry ON responses (expires_at)",
    # The size limit's sum reads this index, not the table's rows (each holds its JSON): it is
    # taken at every write, each event of a background stream included.
    "CREATE INDEX IF NOT EXISTS responses_by_size ON responses (bytes)",
    """CREATE TABLE IF NOT EXISTS events (
        response_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        type TEXT NOT NULL,
        data TEXT NOT NULL,
        PRIMARY KEY (response_id, seq)
    ) WITHOUT ROWID""",
)
_CANCELLED = "SELECT 1 FROM responses WHERE id = ? AND expires_at > ? AND status = 'cancelled'"
_ROW = "SELECT response, messages, status, runner FROM responses WHERE id = ? AND expires_at > ?"


def this_runner() -> str:
    """``<pid>-<start>``: the process that stores a queued or in-progress response runs it (a
    background response runs in the worker that took the request)."""
    pid = os.getpid()
    return f"{pid}-{ipc_directory.process_start(pid) or 0}"


def runner_gone(runner: str | None) -> bool:
    """Whether the process ``runner`` names has ended (so its response never will)."""
    if not runner:
        return False
    pid, _, start = runner.partition("-")
    try:
        return not ipc_directory.owner_alive(int(pid), int(start or 0))
    except ValueError:
        return False


def failed_as_orphan(response: dict[str, Any], runner: str) -> dict[str, Any]:
    """``response`` failed: the process running it (``runner``) ended before it did."""
    message = (
        f"The server process that ran this background response (pid "
        f"{runner.partition('-')[0]}) stopped before it finished; send the request again."
    )
    return {**response, "status": "failed", "error": {"code": "server_error", "message": message}}


def _prepare(db: sqlite3.Connection, path: pathlib.Path) -> None:
    """The table of :data:`_SCHEMA_VERSION` in ``path`` (``db``, in a transaction): created, or
    an older file brought up to it; a file of an unknown version refused."""
    (version,) = db.execute("PRAGMA user_version").fetchone()
    if version not in range(_SCHEMA_VERSION + 1):
        msg = (
            f"{path} holds responses of another vllm-inline version (schema "
            f"{version}, this one reads 1 to {_SCHEMA_VERSION}): move it away or "
            "name another file."
        )
        raise ValueError(msg)
    for statement in _SCHEMA:
        db.execute(statement)
    if "runner" not in {row[1] for row in db.execute("PRAGMA table_info(responses)")}:
        db.execute("ALTER TABLE responses ADD COLUMN runner TEXT")
    db.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")


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
        _private(self.path)
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
            try:
                with self._transaction() as db:  # two workers may open a new or older file at once
                    _prepare(db, self.path)
            except BaseException:
                self._db.close()
                raise
        self._runner = this_runner()

    def put(
        self,
        stored: StoredResponse,
        *,
        keep_cancelled: bool = False,
        events: Sequence[StoredEvent] = (),
    ) -> bool:
        response, messages = encoded(stored)
        size = checked_size(response, messages, self.max_bytes) + events_size(events)
        now = self._clock()
        rid = stored.response["id"]
        with self._lock, self._transaction() as db:
            # One transaction per response: the expired ones out, this one in, the oldest out
            # while over the limit.
            if keep_cancelled and db.execute(_CANCELLED, (rid, now)).fetchone():
                return False
            db.execute(
                "DELETE FROM events WHERE response_id IN "
                "(SELECT id FROM responses WHERE expires_at <= ?)",
                (now,),
            )
            db.execute("DELETE FROM responses WHERE expires_at <= ?", (now,))
            (kept,) = db.execute(
                "SELECT COALESCE(SUM(LENGTH(CAST(data AS BLOB))), 0) FROM events "
                "WHERE response_id = ?",
                (rid,),
            ).fetchone()
            status = stored.response["status"]
            db.execute(
                "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (rid, now, now + self.ttl_seconds, size + kept, status, response, messages,
                 self._runner if status in CANCELLABLE else None),
            )  # fmt: skip
            self._insert(db, rid, events)
            self._evict(db)
        return True

    def add_events(self, response_id: str, events: Sequence[StoredEvent]) -> bool:
        with self._lock, self._transaction() as db:
            row = db.execute(
                "SELECT status FROM responses WHERE id = ? AND expires_at > ?",
                (response_id, self._clock()),
            ).fetchone()
            if row is None or row[0] not in CANCELLABLE:
                return False  # cancelled, failed or gone meanwhile: the stream stops here
            self._append(db, response_id, events)
            self._evict(db)
        return True

    @staticmethod
    def _insert(db: sqlite3.Connection, response_id: str, events: Sequence[StoredEvent]) -> None:
        db.executemany(
            "INSERT OR REPLACE INTO events VALUES (?, ?, ?, ?)",
            [(response_id, e.sequence_number, e.type, e.data) for e in events],
        )

    def _append(
        self, db: sqlite3.Connection, response_id: str, events: Sequence[StoredEvent]
    ) -> None:
        """``events`` added to a stored response's, and to its size."""
        self._insert(db, response_id, events)
        db.execute(
            "UPDATE responses SET bytes = bytes + ? WHERE id = ?",
            (events_size(events), response_id),
        )

    def events(self, response_id: str, after: int) -> list[StoredEvent] | None:
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, type, data FROM events WHERE response_id = ? AND seq > ? ORDER BY seq",
                (response_id, after),
            ).fetchall()
            if not rows:
                some = self._db.execute(
                    "SELECT 1 FROM events WHERE response_id = ? LIMIT 1", (response_id,)
                ).fetchone()
                return [] if some else None
        return [StoredEvent(int(seq), str(kind), str(data)) for seq, kind, data in rows]

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

    def _orphan(self, status: str, runner: str | None) -> bool:
        """A queued or in-progress response whose runner (another process) has ended: killed,
        it could not mark its responses; the first read after that does."""
        return status in CANCELLABLE and runner != self._runner and runner_gone(runner)

    def _read(self, db: sqlite3.Connection, response_id: str) -> StoredResponse | None:
        """The response, read in ``db``'s write transaction; an orphan (:meth:`_orphan`)
        marked failed there."""
        row = db.execute(_ROW, (response_id, self._clock())).fetchone()
        if row is None:
            return None
        stored = StoredResponse(json.loads(row[0]), json.loads(row[1]))
        if self._orphan(row[2], row[3]):
            stored = StoredResponse(failed_as_orphan(stored.response, row[3]), stored.messages)
            db.execute(
                "UPDATE responses SET status = 'failed', runner = NULL, response = ? WHERE id = ?",
                (json.dumps(stored.response), response_id),
            )
            self._end_stream(db, stored.response)
        return stored

    def _end_stream(self, db: sqlite3.Connection, failed: dict[str, Any]) -> None:
        """A streamed response failed as an orphan: its stream's last event, which its
        runner never wrote, so that every reader (and every resumption) ends alike."""
        (last,) = db.execute(
            "SELECT MAX(seq) FROM events WHERE response_id = ?", (failed["id"],)
        ).fetchone()
        if last is None:
            return
        event = stored_event(
            {"response": failed, "sequence_number": last + 1, "type": "response.failed"}
        )
        self._append(db, failed["id"], [event])

    def _settle(self, response_id: str) -> StoredResponse | None:
        with self._transaction() as db:
            return self._read(db, response_id)

    def status(self, response_id: str) -> str | None:
        """The stored response's ``status`` (``None``: not stored): a cheap poll (one indexed
        ``SELECT``; a write only to mark an orphan failed)."""
        with self._lock:
            row = self._db.execute(
                "SELECT status, runner FROM responses WHERE id = ? AND expires_at > ?",
                (response_id, self._clock()),
            ).fetchone()
            if row is None or not self._orphan(row[0], row[1]):
                return None if row is None else str(row[0])
            settled = self._settle(response_id)
        return None if settled is None else str(settled.response["status"])

    def cancel(self, response_id: str) -> StoredResponse | None:
        with self._lock, self._transaction() as db:
            stored = self._read(db, response_id)  # an orphan is failed: no longer cancellable
            if stored is None or stored.response["status"] not in CANCELLABLE:
                return stored
            stored.response["status"] = "cancelled"
            db.execute(
                "UPDATE responses SET status = 'cancelled', runner = NULL, response = ? "
                "WHERE id = ?",
                (json.dumps(stored.response), response_id),
            )
        return stored

    def _evict(self, db: sqlite3.Connection) -> None:
        (total,) = db.execute("SELECT COALESCE(SUM(bytes), 0) FROM responses").fetchone()
        if total <= self.max_bytes:
            return
        over = total - self.max_bytes
        # The oldest finished ones: a response still running is not deleted under its writer.
        rows = db.execute(
            "SELECT id, bytes FROM responses WHERE status NOT IN ('queued', 'in_progress') "
            "ORDER BY stored_at, rowid"
        )
        doomed = []
        for response_id, size in rows:
            if over <= 0:
                break
            doomed.append((response_id,))
            over -= size
        db.executemany("DELETE FROM events WHERE response_id = ?", doomed)
        db.executemany("DELETE FROM responses WHERE id = ?", doomed)

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            row = self._db.execute(_ROW, (response_id, self._clock())).fetchone()
            if row is not None and self._orphan(row[2], row[3]):
                return self._settle(response_id)
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


def _private(path: pathlib.Path) -> None:
    """Make ``path`` the server's user's alone: every stored conversation is in it. A missing
    directory is made 0700, the file 0600 (SQLite gives its ``-wal`` and ``-shm`` files the
    file's mode), and a file of an earlier version, made 0644, is narrowed to 0600 with them."""
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
    for name in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            if os.stat(name).st_mode & 0o077:
                os.chmod(name, 0o600)
        except FileNotFoundError:
            pass
