"""The response store (vllm_inline.server.responses.store): what ``store=true`` keeps for
``previous_response_id``. No engine: SQLite files under ``tmp_path``, processes of their own
where the point is another process (writers at once, a writer killed mid-write).

Proven here: a response written through one connection (another worker) is read through another;
the file outlives its store (a restarted launcher); expired responses are gone; the oldest go
first past the size limit; writers in several processes at once lose nothing; a writer killed by
SIGKILL in the middle of its writes leaves every committed response whole and no half-written
one; the memory store (one process) obeys the same limits.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from vllm_inline.server.responses import (
    MemoryResponseStore,
    SQLiteResponseStore,
    StoredResponse,
    open_store,
)
from vllm_inline.server.responses.records import StoredEvent, stored_event
from vllm_inline.server.responses.store import default_store_path


def stored(
    response_id: str, text: str = "The answer is complete.", status: str = "completed"
) -> StoredResponse:
    response = {
        "id": response_id,
        "object": "response",
        "status": status,
        "output": [{"text": text}],
    }
    return StoredResponse(response, [{"role": "assistant", "content": text}])


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_one_worker_writes_another_reads_and_the_file_outlives_both(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    worker_1, worker_2 = SQLiteResponseStore(path), SQLiteResponseStore(path)
    worker_1.put(stored("resp_1"))
    assert worker_2.get("resp_1") == stored("resp_1")
    assert worker_2.get("resp_2") is None
    worker_1.close()
    worker_2.close()
    again = SQLiteResponseStore(path)  # the launcher restarted
    assert again.get("resp_1") == stored("resp_1")
    assert again.path == path
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    db.close()
    again.close()


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_expiry_and_the_size_limit(tmp_path: Path, kind: str) -> None:
    clock = Clock()
    size = len(json.dumps(stored("resp_0").response)) + len(json.dumps(stored("resp_0").messages))
    limits: dict[str, Any] = {"max_bytes": 3 * size, "ttl_seconds": 60, "clock": clock}
    store = (
        SQLiteResponseStore(tmp_path / "s.sqlite3", **limits)
        if kind == "sqlite"
        else MemoryResponseStore(**limits)
    )
    for k in range(5):  # five of the same size, three fit: the two oldest are evicted
        store.put(stored(f"resp_{k}"))
        clock.now += 1
    assert [store.get(f"resp_{k}") is not None for k in range(5)] == [
        False,
        False,
        True,
        True,
        True,
    ]
    assert store.total_bytes() <= 3 * size
    clock.now += 60  # every one expired: not found, and deleted at the next write
    assert store.get("resp_4") is None
    store.put(stored("resp_5"))
    assert store.total_bytes() == size
    with pytest.raises(ValueError, match="max_bytes"):
        store.put(stored("resp_big", "x" * 4 * size))
    store.close()


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_cancel_marks_a_running_response_and_its_end_is_not_written(
    tmp_path: Path, kind: str
) -> None:
    """What a cancel on one worker and the end of the response on another do, in either order."""
    store = (
        SQLiteResponseStore(tmp_path / "s.sqlite3") if kind == "sqlite" else MemoryResponseStore()
    )
    store.put(stored("resp_1", "", status="queued"))
    assert store.status("resp_1") == "queued"
    cancelled = store.cancel("resp_1")
    assert cancelled is not None and cancelled.response["status"] == "cancelled"
    assert not store.put(stored("resp_1"), keep_cancelled=True)  # the end comes after
    assert store.status("resp_1") == "cancelled"
    store.put(stored("resp_2"))  # finished: a cancel changes nothing
    got = store.cancel("resp_2")
    assert got is not None and got.response["status"] == "completed"
    assert store.cancel("resp_nope") is None and store.status("resp_nope") is None
    store.close()


def test_a_file_of_another_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=99")
    db.close()
    with pytest.raises(ValueError, match="another vllm-inline version"):
        SQLiteResponseStore(path)


def test_the_store_is_private_to_its_user(tmp_path: Path) -> None:
    """Every stored conversation is in the file: it, its -wal and -shm files are 0600 and a
    directory made for it 0700; a file an earlier version made 0644 is narrowed."""
    import os
    import stat

    path = tmp_path / "made" / "responses.sqlite3"
    store = SQLiteResponseStore(path)
    store.put(stored("resp_1"))
    modes = {p.name: stat.S_IMODE(os.stat(p).st_mode) for p in path.parent.iterdir()}
    assert modes == {
        "responses.sqlite3": 0o600,
        "responses.sqlite3-wal": 0o600,
        "responses.sqlite3-shm": 0o600,
    }, modes
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    store.close()
    old = tmp_path / "old.sqlite3"
    sqlite3.connect(old).close()
    os.chmod(old, 0o644)
    SQLiteResponseStore(old).close()
    assert stat.S_IMODE(os.stat(old).st_mode) == 0o600


def test_a_response_stored_under_one_key_is_not_found_with_another(tmp_path: Path) -> None:
    """Two servers with other API keys on one store file (or one whose key changed): neither
    finds the other's conversations; each sees its own under the ids it gave them. A server's
    store is scoped by its key (OpenAIServer), never by the key itself (a digest)."""
    from vllm_inline.engine import Engine
    from vllm_inline.server import Limits, OpenAIServer
    from vllm_inline.server.responses.scoped import KeyScopedStore, scope_of

    path = tmp_path / "shared.sqlite3"
    raw = SQLiteResponseStore(path)
    one, other = (KeyScopedStore(raw, scope_of(key)) for key in ("sk-one", "sk-other"))
    event = stored_event({"sequence_number": 0, "type": "response.created"})
    one.put(stored("resp_1", status="in_progress"), events=[event])
    assert one.get("resp_1").response["id"] == "resp_1"  # type: ignore[union-attr]
    assert one.status("resp_1") == "in_progress" and one.events("resp_1", -1) == [event]
    for elsewhere in (other, raw):
        assert elsewhere.get("resp_1") is None and elsewhere.status("resp_1") is None
        assert elsewhere.events("resp_1", -1) is None and elsewhere.cancel("resp_1") is None
    assert "sk-one" not in scope_of("sk-one") and scope_of(None) == ""
    assert one.cancel("resp_1").response["status"] == "cancelled"  # type: ignore[union-attr]
    raw.close()
    model = Engine("some/model")  # never started: the store is what is looked at
    server = OpenAIServer(chat=model, limits=Limits(api_key="sk-one"), responses_store=str(path))
    assert isinstance(server.responses_store(), KeyScopedStore)
    assert server.responses_store().get("resp_1") is not None
    server.responses_store.close()
    keyless = OpenAIServer(chat=model, responses_store=":memory:")
    assert not isinstance(keyless.responses_store(), KeyScopedStore)


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="max_bytes=0"):
        MemoryResponseStore(max_bytes=0)
    with pytest.raises(ValueError, match="ttl_seconds=-1"):
        MemoryResponseStore(ttl_seconds=-1)


def test_where_the_store_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLMINLINE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("VLLMINLINE_RESPONSES_STORE", raising=False)
    assert default_store_path() == tmp_path / "cache" / "responses.sqlite3"
    assert isinstance(open_store(":memory:"), MemoryResponseStore)
    monkeypatch.setenv("VLLMINLINE_RESPONSES_STORE", str(tmp_path / "env.sqlite3"))
    store = open_store(None)
    assert isinstance(store, SQLiteResponseStore) and store.path == tmp_path / "env.sqlite3"
    store.close()


WRITER = """
import sys
from vllm_inline.server.responses import SQLiteResponseStore, StoredResponse
path, name, count, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
store = SQLiteResponseStore(path)
print("ready", flush=True)
for k in range(count):
    rid = f"resp_{name}_{k}"
    text = str(k) * size
    response = {"id": rid, "status": "completed", "text": text}
    store.put(StoredResponse(response, [{"role": "assistant", "content": text}]))
    print(rid, flush=True)
"""


def writer(path: Path, name: str, count: int, size: int) -> subprocess.Popen[str]:
    command = [sys.executable, "-c", WRITER, str(path), name, str(count), str(size)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def whole(path: Path) -> dict[str, dict[str, Any]]:
    """Every stored response, checked whole: its JSON parses and matches its messages."""
    store = SQLiteResponseStore(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    found = {}
    for (rid,) in db.execute("SELECT id FROM responses"):
        got = store.get(rid)
        assert got is not None
        assert got.response["id"] == rid and got.messages[0]["content"] == got.response["text"]
        found[rid] = got.response
    db.close()
    store.close()
    return found


def test_writers_in_several_processes_at_once(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    SQLiteResponseStore(path).close()  # the schema first, so the writers only write
    writers = [writer(path, name, 40, 1000) for name in ("a", "b", "c")]
    outs = [w.communicate(timeout=120) for w in writers]
    assert [w.returncode for w in writers] == [0, 0, 0], [err for _, err in outs]
    written = {rid for out, _ in outs for rid in out.split() if rid != "ready"}
    assert len(written) == 120
    assert set(whole(path)) == written


def test_a_writer_killed_mid_write_leaves_nothing_half_written(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    SQLiteResponseStore(path).close()
    child = writer(path, "k", 10_000, 200_000)  # ~0.4 MB a response: a write takes a while
    assert child.stdout is not None
    lines = [child.stdout.readline().strip() for _ in range(4)]  # "ready", then 3 written
    time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    # Read on through the same buffered pipe (communicate() would skip what readline buffered).
    rest = child.stdout.read()
    err = child.stderr.read() if child.stderr is not None else ""
    child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL, (lines, err)
    assert lines[0] == "ready", (lines, err)
    committed = [*lines[1:], *rest.split()]
    found = whole(path)
    # Every write it finished is there, whole; at most the one it was in besides, whole too.
    assert set(committed) <= set(found), (committed, sorted(found))
    assert len(found) <= len(committed) + 1, (committed, sorted(found))


RUNNER = """
import sys, time
from vllm_inline.server.responses import SQLiteResponseStore, StoredResponse
store = SQLiteResponseStore(sys.argv[1])
for rid, status in (("resp_q", "queued"), ("resp_p", "in_progress"), ("resp_c", "completed")):
    store.put(StoredResponse({"id": rid, "status": status}, []))
print("stored", flush=True)
time.sleep(300)
"""


def test_a_background_response_of_a_killed_worker_is_failed_at_the_next_read(
    tmp_path: Path,
) -> None:
    """A worker killed while it runs background responses cannot mark them: the store names
    the process that runs each, and the first read after it is gone fails them, once."""
    path = tmp_path / "store.sqlite3"
    child = subprocess.Popen([sys.executable, "-c", RUNNER, str(path)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "stored"
        store = SQLiteResponseStore(path)
        got = store.get("resp_q")
        assert got is not None and got.response["status"] == "queued"  # its runner runs
        assert store.status("resp_p") == "in_progress"
    finally:
        child.kill()
        child.wait(timeout=30)
    failed = store.get("resp_q")
    assert failed is not None and failed.response["status"] == "failed"
    assert failed.response["error"]["code"] == "server_error"
    assert f"pid {child.pid}" in failed.response["error"]["message"]
    assert store.status("resp_p") == "failed"  # the cheap poll sees it too
    cancelled = store.cancel("resp_p")  # too late: it failed
    assert cancelled is not None and cancelled.response["status"] == "failed"
    finished = store.get("resp_c")
    assert finished is not None and finished.response == {"id": "resp_c", "status": "completed"}
    store.close()
    again = SQLiteResponseStore(path)  # written once: another opener reads the same
    assert again.get("resp_q") == failed
    again.close()


def test_a_file_of_the_previous_schema_is_brought_up_to_date(tmp_path: Path) -> None:
    path = tmp_path / "v1.sqlite3"
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE responses (id TEXT PRIMARY KEY, stored_at REAL NOT NULL, expires_at "
        "REAL NOT NULL, bytes INTEGER NOT NULL, status TEXT NOT NULL, response TEXT NOT NULL, "
        "messages TEXT NOT NULL)"
    )
    response = json.dumps({"id": "resp_1", "status": "queued"})
    row = ("resp_1", time.time(), time.time() + 60, 10, "queued", response, "[]")
    db.execute("INSERT INTO responses VALUES (?, ?, ?, ?, ?, ?, ?)", row)
    db.execute("PRAGMA user_version=1")
    db.commit()
    db.close()
    store = SQLiteResponseStore(path)
    got = store.get("resp_1")  # no runner recorded: left as it is
    assert got is not None and got.response["status"] == "queued"
    assert store.put(stored("resp_2")) and store.get("resp_2") == stored("resp_2")
    assert store.events("resp_1", -1) is None  # the events table is there, and empty
    store.add_events("resp_1", events_of("resp_1", range(2)))
    assert store.events("resp_1", 0) == events_of("resp_1", [1])
    store.close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone() == (3,)
    db.close()


def events_of(response_id: str, numbers: Any) -> list[StoredEvent]:
    return [
        stored_event({"type": "response.output_text.delta", "sequence_number": n,
                      "delta": f"{response_id}:{n} " * 10})
        for n in numbers
    ]  # fmt: skip


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_a_background_streams_events_are_kept_counted_and_go_with_it(
    tmp_path: Path, kind: str
) -> None:
    clock = Clock()
    limits: dict[str, Any] = {"max_bytes": 4000, "ttl_seconds": 60, "clock": clock}
    store: Any = (
        SQLiteResponseStore(tmp_path / "store.sqlite3", **limits)
        if kind == "sqlite"
        else MemoryResponseStore(**limits)
    )
    queued = stored("resp_1", status="queued")
    store.put(queued, events=events_of("resp_1", range(2)))
    assert store.add_events("resp_1", events_of("resp_1", range(2, 5)))
    assert store.events("resp_1", -1) == events_of("resp_1", range(5))
    assert store.events("resp_1", 2) == events_of("resp_1", [3, 4])
    assert store.events("resp_1", 4) == []  # streamed, nothing new yet
    assert store.events("resp_2", -1) is None  # never streamed
    # The last write replaces the response; its events stay, and count in its size.
    store.put(stored("resp_1"), events=events_of("resp_1", [5]))
    assert store.events("resp_1", 4) == events_of("resp_1", [5])
    size = len(json.dumps(stored("resp_1").response)) + len(json.dumps(stored("resp_1").messages))
    with_events = size + sum(len(e.data) for e in events_of("resp_1", range(6)))
    assert store.total_bytes() == with_events
    # Events only while it runs: not for a response finished, cancelled or gone.
    assert not store.add_events("resp_1", events_of("resp_1", [6]))
    assert not store.add_events("resp_gone", events_of("resp_gone", [0]))
    assert store.events("resp_gone", -1) is None
    store.put(stored("resp_c", status="queued"), events=events_of("resp_c", [0]))
    assert store.cancel("resp_c") is not None
    assert not store.add_events("resp_c", events_of("resp_c", [1]))
    assert store.events("resp_c", -1) == events_of("resp_c", [0])
    # Evicted past the size limit, oldest first, with its events; one still running is not.
    store.put(stored("resp_q", status="queued"))
    store.put(stored("resp_2", text="x" * ((4000 - with_events) // 2)))  # both together: over
    assert store.get("resp_1") is None and store.events("resp_1", -1) is None
    assert store.status("resp_q") == "queued"
    assert store.total_bytes() <= 4000
    # Expired, with its events.
    store.put(stored("resp_3", status="queued"), events=events_of("resp_3", [0]))
    clock.now += 61
    store.put(stored("resp_4"))
    assert store.get("resp_3") is None and store.events("resp_3", -1) is None
    store.close()


def test_serve_refuses_a_memory_store_for_several_workers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import argparse

    from vllm_inline.commands.serve import add_arguments, serve

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--workers", "2", "--responses-store", ":memory:"])
    assert serve(args) == 2  # before any process or engine starts
    assert "with --workers use a file" in capsys.readouterr().out
    defaults = parser.parse_args([])
    assert defaults.responses_store is None and defaults.reasoning_parser is None


def test_serve_flags_set_the_stores_size_and_expiry_and_it_still_opens_at_first_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from vllm_inline.commands.serve import add_arguments, responses_store_of

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    path = tmp_path / "store.sqlite3"
    args = parser.parse_args(["--responses-store", str(path), "--responses-store-max-bytes",
                              "4096", "--responses-store-ttl-seconds", "60"])  # fmt: skip
    opener = responses_store_of(args)
    assert not path.exists()  # a server that never serves /v1/responses writes nothing
    store = opener()
    try:
        assert isinstance(store, SQLiteResponseStore) and path.exists()
        assert (store.max_bytes, store.ttl_seconds) == (4096, 60.0)
    finally:
        store.close()
    assert responses_store_of(parser.parse_args(["--responses-store", str(path)])) == str(path)
    # The server takes the opener as it is (an engine that never starts: nothing else runs).
    from vllm_inline.engine import Engine
    from vllm_inline.server import OpenAIServer

    server = OpenAIServer(chat={"m": Engine(str(tmp_path / "no-model"), {})},
                          responses_store=responses_store_of(args))  # fmt: skip
    try:
        assert server.responses_store().max_bytes == 4096
    finally:
        server.responses_store.close()
    for flag, value in (("--responses-store-max-bytes", "0"),
                        ("--responses-store-max-bytes", "1.5"),
                        ("--responses-store-ttl-seconds", "-1"),
                        ("--responses-store-ttl-seconds", "nan")):  # fmt: skip
        with pytest.raises(SystemExit):
            parser.parse_args([flag, value])
        error = capsys.readouterr().err
        assert f"argument {flag}:" in error and repr(value) in error, error
