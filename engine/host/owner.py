"""A host engine: one :class:`~vllm_inline.engine.Engine` for one model and options, kept by a
process of its own, which every process of the user attaches to over a Unix socket
(docs/host.md).

The first process that asks for the engine with ``keep_alive`` launches this module
(:mod:`.attach`); it forks once more and the launcher's child exits, so the owner is no child of
any app, in a process group of its own (a notebook kernel that ends its children, a terminal's
Ctrl-C, a supervisor stopping an app's process group: none of it reaches the engine). It writes its
record (:mod:`.directory`), listens on its socket and starts the engine; a process that attaches
meanwhile waits for the start (or gets its error). Each request runs on the engine through its
public API, as it would in the process that sent it; its deltas go back as they come, several
a frame when they pile up. A process that disconnects (it ended, crashed, was killed) has its
requests cancelled at once, which aborts them in vLLM; the others go on.

After the last process detaches the engine stays ``keep_alive`` seconds (the latest value a
process gave), then shuts down and removes its files; SIGTERM (``python -m vllm_inline engines
stop``) does the same at once. If this process is killed, its engine cores see it end and stop
(:mod:`..seam.vllm_boot`), and the next process that asks removes the record it left.

    python -m vllm_inline.engine.host.owner '{"directory": ..., "key": ..., "model": ...,
        "options": {...}, "keep_alive": 600}'
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
from vllm_inline.engine.host import directory as files
from vllm_inline.engine.host import serving, wire
from vllm_inline.engine.host.status import engine_info, tree_memory, versions

__all__ = ["main"]

logger = logging.getLogger("vllm_inline")

_FIRST_PROCESS_S = 60.0
"""How long a new host engine waits for its first process (the one that launched it)."""


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
        self.idle_since: float | None = time.time()
        self.ready: asyncio.Future[dict[str, Any]] | None = None
        self.stopped = asyncio.Event()
        self._idle_timer: asyncio.TimerHandle | None = None

    # -- life ----------------------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
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
        try:
            await self.stopped.wait()
        finally:
            server.close()
            start.cancel()
            if self.engine.started:  # their streams in flight end, typed
                told = self.engine.runtime.loop.submit(serving.stop_all(self.live))
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.wrap_future(told), timeout=5)
            with files.locked(self.directory, self.key):
                files.remove_files(self.directory, self.key)
            await asyncio.to_thread(self.engine.shutdown)

    def _start(self) -> None:
        """Start the engine (in a thread: seconds to minutes); its answer settles ``ready``."""
        loop = self.ready.get_loop() if self.ready is not None else None
        assert loop is not None
        try:
            self.engine.start()
            info = engine_info(self.engine, self.record)
        except BaseException as e:  # noqa: BLE001 - sent to every process that attaches
            logger.error("vllm-inline host engine for %s did not start: %s", self.engine.model, e)
            loop.call_soon_threadsafe(self._failed, e)
            return
        loop.call_soon_threadsafe(self._set_ready, info)

    def _set_ready(self, info: dict[str, Any]) -> None:
        assert self.ready is not None
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

    # -- one process ---------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hello = await self._greet(reader, writer)
        if hello is None:
            writer.close()
            return
        if hello.get("observe"):  # `engines`: a look, not an attach (the idle time runs on)
            writer.write(wire.frame(("status", 0, self.status())))
            await writer.drain()
            writer.close()
            return
        pid = int(hello["pid"])
        self.attached.append(pid)
        self._busy()
        if hello.get("keep_alive") is not None and hello["keep_alive"] != self.keep_alive:
            self.keep_alive = float(hello["keep_alive"])  # the latest wins, as in Ollama
            self.record.keep_alive = self.keep_alive
            self.record.write(self.directory)
        try:
            assert self.ready is not None
            try:
                info = await asyncio.shield(self.ready)
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
            loop = self.engine.runtime.loop
            job = serving.serve(self.engine, moved, pid, self.live, self.status)
            await asyncio.wrap_future(loop.submit(job))
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
        """The greeting: the peer is this user's and holds the key; same versions."""
        sock = writer.get_extra_info("socket")
        credentials = wire.peer(sock) if sock is not None else None
        if credentials is not None and credentials[1] != os.getuid():
            return None
        challenge = secrets.token_bytes(32)
        writer.write(wire.frame(("challenge", 0, challenge)))
        try:
            kind, _, hello = await asyncio.wait_for(
                wire.read_frame(reader, limit=wire.MAX_GREETING), timeout=30
            )
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, TimeoutError):
            return None
        if kind != "hello" or not hmac.compare_digest(
            bytes(hello.get("proof", b"")), wire.proof(self.secret, challenge)
        ):
            return None
        if hello.get("versions") != self.record.versions:
            error = files.version_mismatch(self.record, hello.get("versions"))
            writer.write(wire.frame(("error", 0, wire.exception_to_wire(error))))
            return None
        hello = dict(hello)
        if credentials is not None:
            hello["pid"] = credentials[0]  # the kernel's word, not the process's
        return hello

    def status(self) -> dict[str, Any]:
        """What ``python -m vllm_inline engines`` shows of this engine."""
        left = None
        if self.idle_since is not None and self.keep_alive != float("inf"):
            left = max(0.0, self.idle_since + self.keep_alive - time.time())
        return {
            "model": self.engine.model,
            "options": dict(self.engine.vllm_kwargs),
            "pid": os.getpid(),
            "started": self.engine.started,
            "attached": sorted(self.attached),
            "idle_seconds": None if self.idle_since is None else time.time() - self.idle_since,
            "keep_alive": self.keep_alive,
            "seconds_left": left,
            "memory_bytes": tree_memory(os.getpid()),
            "versions": self.record.versions,
        }


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(argv[0])
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
