"""A host engine: one :class:`~vllm_inline.engine.Engine` for one model and options, kept by a
process of its own, which every process of the user attaches to over a Unix socket
(docs/host.md).

The first process that asks for the engine with ``keep_alive`` launches this module
(:mod:`.attach`); it forks once more and the launcher's child exits, so the owner is no child of
any app, in a process group of its own (a notebook kernel that ends its children, a terminal's
Ctrl-C, a supervisor stopping an app's process group: none of it reaches the engine). It writes its
record (:mod:`.directory`), listens on its socket and starts the engine; a process that attaches
meanwhile waits for the start (or gets its error). Once greeted, a process's requests run on
the engine's own loop (:mod:`.serving`). A process that disconnects (it ended, crashed, was
killed) has its requests cancelled at once, which aborts them in vLLM; the others go on.

After the last process detaches the engine stays ``keep_alive`` seconds (the latest value a
process gave), then shuts down and removes its files; SIGTERM (``python -m vllm_inline engines
stop``) does the same at once; so does a record that is no longer its own (removed, or
another owner's). The files go after the engine's shutdown, so that no new owner starts beside
a dying one. If this process is killed, its engine cores see it end and stop
(:mod:`..seam.vllm_boot`), and the next process that asks removes the record it left.

    python -m vllm_inline.engine.host.owner < spec.json  # directory, key, model, options,
                                                         # keep_alive: on stdin, not in `ps`
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import secrets
import signal
import socket
import sys
import time
from typing import Any

from vllm_inline.engine.engine import Engine
from vllm_inline.engine.errors import EngineShutdownError
from vllm_inline.engine.host import directory as files
from vllm_inline.engine.host import serving, wire
from vllm_inline.engine.host.status import engine_info, tree_memory, versions
from vllm_inline.engine.life.runtime import Runtime

__all__ = ["main"]

logger = logging.getLogger("vllm_inline")

_FIRST_PROCESS_S = 60.0
"""How long a new host engine waits for its first process (the one that launched it)."""
_RECORD_CHECK_S = 10.0
"""How often the host engine checks that its record is still its own."""


class Owner:
    """The engine, its socket and the processes attached to it."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.directory: str = spec["directory"]
        self.key: str = spec["key"]
        self.keep_alive: float = float(spec["keep_alive"])
        # The process's one engine; not get_engine's (which would attach to a host engine).
        self.engine = Engine(spec["model"], spec["options"])
        self.secret = files.secret(self.directory)
        self.record = files.Record(
            key=self.key,
            model=spec["model"],
            options=dict(spec["options"]),
            pid=os.getpid(),
            start=files.this_process_start(),
            versions=versions(),
            keep_alive=self.keep_alive,
            started_at=time.time(),
        )
        self.attached: list[int] = []
        """The attached processes' pids (one entry per connection)."""
        self.live: set[serving.Connection] = set()
        """Their connections, on the engine's loop (:mod:`.serving`)."""
        self.runtime: Runtime | None = None
        """The started engine, once up: requests use this one (never a start of their own)."""
        self.idle_since: float | None = time.time()
        self.ready: asyncio.Future[dict[str, Any]] | None = None
        self.stopped = asyncio.Event()
        self._idle_timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- life ----------------------------------------------------------------------------

    async def run(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self.ready = loop.create_future()
        path = os.path.join(self.directory, f"{self.key}.sock")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        server = await asyncio.start_unix_server(self._serve, path=path)
        os.chmod(path, 0o600)
        self.record.write(self.directory)
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stopped.set)
        start = asyncio.ensure_future(asyncio.to_thread(self._start))
        # The process that launched it comes at once; were it to die first, this stops too.
        self._idle(at_least=_FIRST_PROCESS_S)
        loop.call_later(_RECORD_CHECK_S, self._check_record)
        try:
            await self.stopped.wait()
        finally:
            server.close()
            start.cancel()
            if self.runtime is not None:  # their streams in flight end, typed
                told = self.runtime.loop.submit(serving.stop_all(self.live))
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.wrap_future(told), timeout=5)
            await asyncio.to_thread(self.engine.shutdown)
            with files.locked(self.directory, self.key):
                if self._mine():
                    files.remove_files(self.directory, self.key)

    def _mine(self) -> bool:
        """The record on disk is this process's (not removed, not another owner's)."""
        record = files.key_of(self.directory, self.key)
        return record is not None and (record.pid, record.start) == (
            self.record.pid,
            self.record.start,
        )

    def _check_record(self) -> None:
        if not self._mine():  # removed (its directory too, at logout), or another's now
            logger.warning("vllm-inline host engine %s: its record is gone; stopping", self.key)
            self.stopped.set()
            return
        asyncio.get_running_loop().call_later(_RECORD_CHECK_S, self._check_record)

    def _start(self) -> None:
        """Start the engine (in a thread: seconds to minutes); its answer settles ``ready``."""
        assert self._loop is not None
        try:
            self.engine.start()
            runtime = self.engine.runtime
            info = engine_info(self.engine, self.record)
        except BaseException as e:  # noqa: BLE001 - sent to every process that attaches
            logger.error("vllm-inline host engine for %s did not start: %s", self.engine.model, e)
            self._loop.call_soon_threadsafe(self._failed, e)
            return
        self._loop.call_soon_threadsafe(self._set_ready, runtime, info)

    def _set_ready(self, runtime: Runtime, info: dict[str, Any]) -> None:
        assert self.ready is not None
        self.runtime = runtime
        if not self.ready.done():
            self.ready.set_result(info)

    def _failed(self, e: BaseException) -> None:
        assert self.ready is not None
        if not self.ready.done():
            self.ready.set_exception(e)
        # The processes waiting now get the error; later ones start a new owner (and see it).
        asyncio.get_running_loop().call_later(1.0, self.stopped.set)

    def _idle(self, at_least: float = 0.0) -> None:
        """No process attached: stop after ``keep_alive`` seconds (never, for ``inf``), and
        not before ``at_least``."""
        self.idle_since = time.time()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self._idle_timer = None
        if self.keep_alive != float("inf"):
            delay = max(self.keep_alive, at_least)
            self._idle_timer = asyncio.get_running_loop().call_later(delay, self.stopped.set)

    def _busy(self) -> None:
        self.idle_since = None
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _set_keep_alive(self, seconds: float) -> None:
        """A process asked for another ``keep_alive``: the latest wins, as in Ollama."""
        if seconds == self.keep_alive or self.stopped.is_set():
            return
        self.keep_alive = self.record.keep_alive = seconds
        self.record.write(self.directory)
        if not self.attached:
            self._idle()

    # -- one process ---------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hello = None if self.stopped.is_set() else await self._greet(reader, writer)
        if hello is None:
            writer.close()
            return
        if hello.get("observe"):  # `engines`: a look, not an attach (the idle time runs on)
            writer.write(wire.frame(("status", 0, await self.status())))
            await writer.drain()
            writer.close()
            return
        pid = int(hello["pid"])
        self.attached.append(pid)
        self._busy()
        with contextlib.suppress(ValueError):
            seconds = files.parse_keep_alive(hello.get("keep_alive"))
            if seconds is not None:
                self._set_keep_alive(seconds)
        try:
            assert self.ready is not None
            try:
                info = await asyncio.shield(self.ready)
                if self.stopped.is_set() or self.runtime is None:
                    raise EngineShutdownError(
                        f"The host engine for {self.engine.model!r} is stopping: ask again."
                    )
            except Exception as e:  # noqa: BLE001 - the start's error, for this process
                writer.write(wire.frame(("error", 0, wire.exception_to_wire(e))))
                await writer.drain()
                return
            writer.write(wire.frame(("ready", 0, info)))
            await writer.drain()
            # Its requests run on the engine's loop from now on (.serving): the socket moves
            # there; this loop's transport lets go of its descriptor, which had nothing left.
            sock = writer.get_extra_info("socket")
            moved = socket.socket(fileno=os.dup(sock.fileno()))
            writer.transport.abort()
            calls = self._calls()
            job = serving.serve(self.engine, self.runtime, moved, pid, self.live, calls)
            await asyncio.wrap_future(self.runtime.loop.submit(job))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the process ended before its greeting was answered
        finally:
            self.attached.remove(pid)
            writer.close()
            if not self.attached and not self.stopped.is_set():
                self._idle()

    async def _greet(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> dict[str, Any] | None:
        """The greeting, in JSON: the peer is this user's and holds the key; same versions."""
        sock = writer.get_extra_info("socket")
        credentials = wire.peer(sock) if sock is not None else None
        if credentials is not None and credentials[1] != os.getuid():
            return None
        challenge = secrets.token_bytes(32)
        writer.write(wire.frame_json({"challenge": challenge.hex()}))
        try:
            hello = await asyncio.wait_for(wire.read_json(reader), timeout=30)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, asyncio.TimeoutError):
            return None
        proof = hello.get("proof") if isinstance(hello, dict) else None
        expected = wire.proof(self.secret, challenge).hex()
        if not isinstance(proof, str) or not hmac.compare_digest(proof, expected):
            return None
        if hello.get("versions") != self.record.versions:
            error = files.version_mismatch(self.record, hello.get("versions"))
            writer.write(wire.frame(("error", 0, wire.exception_to_wire(error))))
            return None
        if credentials is not None:
            hello["pid"] = credentials[0]  # the kernel's word, not the process's
        return dict(hello) if isinstance(hello.get("pid"), int) else None

    def _calls(self) -> dict[str, serving.Call]:
        """The requests of a process that the host answers itself (on the engine's loop)."""
        main = self._loop
        assert main is not None

        async def status(_: Any) -> Any:
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.status(), main))

        async def keep_alive(value: Any) -> None:
            seconds = files.parse_keep_alive(value)
            if seconds is not None:
                main.call_soon_threadsafe(self._set_keep_alive, seconds)

        return {"status": status, "keep_alive": keep_alive}

    async def status(self) -> dict[str, Any]:
        """What ``python -m vllm_inline engines`` shows of this engine (on the main loop)."""
        left = None
        if self.idle_since is not None and self.keep_alive != float("inf"):
            left = max(0.0, self.idle_since + self.keep_alive - time.time())
        return {
            "model": self.engine.model,
            "options": dict(self.engine.vllm_kwargs),
            "pid": os.getpid(),
            "started": self.runtime is not None,
            "attached": sorted(self.attached),
            "idle_seconds": None if self.idle_since is None else time.time() - self.idle_since,
            "keep_alive": self.keep_alive,
            "seconds_left": left,
            "memory_bytes": await asyncio.to_thread(tree_memory, os.getpid()),
            "versions": self.record.versions,
        }


def main() -> None:
    spec = json.load(sys.stdin)  # on stdin: the engine's options are nobody else's to read
    # A process group of its own, so that what is sent to the app's (a terminal's Ctrl-C, a
    # notebook kernel's restart, a supervisor's stop) does not reach it; and no child of the
    # app: the launcher's child exits at once and this one goes on under init. Not a session
    # of its own: in one (setsid), its own scheduler autogroup here, the deltas of 1 stream in
    # 3 waited for the whole answer before the first reached the app (benchmarks/host_engine.py;
    # docs/host.md).
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    if os.fork():
        os._exit(0)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    asyncio.run(Owner(spec).run())


if __name__ == "__main__":
    main()
