"""One process's connection to a host engine (:mod:`.owner`), read on a loop thread of the
process: calls wait for their result, streams get their deltas as they come, and the end of
the connection (the host engine stopped or killed) ends every call and stream in flight with
:class:`~vllm_inline.engine.errors.EngineDeadError`.

Standard library and the package's light modules only: no torch, no vLLM.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import os
import socket
import threading
import weakref
from collections.abc import AsyncIterator
from typing import Any

from vllm_inline.engine.errors import EngineDeadError, EngineShutdownError
from vllm_inline.engine.host import wire
from vllm_inline.engine.loop.bridge import LoopThread
from vllm_inline.engine.stream.deltas import Delta

__all__ = ["Link"]


class Link:
    """One connection to the host engine, read on a loop thread of this process."""

    def __init__(self, sock: socket.socket, info: dict[str, Any], name: str) -> None:
        self.info = info
        self.loop = LoopThread(name=name)
        self.waiting: dict[int, asyncio.Future[Any] | asyncio.Queue[tuple[str, Any]]] = {}
        self.ids = itertools.count(1)
        self.lost: BaseException | None = None
        self.orphaned = False
        """True in a child forked from the process that made it: nothing of it runs there."""
        self.reader, self.writer = self.loop.submit(_open(sock)).result()
        self.reading = self.loop.submit(self._read())
        with _links_lock:
            _links.add(self)

    async def _read(self) -> None:
        stopped = False
        try:
            while True:
                kind, request_id, payload = await wire.read_frame(self.reader)
                if kind == "stopped":
                    stopped = True
                    continue
                target = self.waiting.get(request_id)
                if isinstance(target, asyncio.Queue):
                    target.put_nowait((kind, payload))
                elif target is not None and not target.done():
                    if kind == "error":
                        target.set_exception(wire.exception_from_wire(payload))
                    else:
                        target.set_result(payload)
        except asyncio.CancelledError:
            self._lose(self.lost or EngineShutdownError("This process detached from the engine."))
            raise
        except BaseException as e:  # noqa: BLE001 - every caller waiting is told, typed
            pid = self.info.get("pid")
            ended = isinstance(e, (asyncio.IncompleteReadError, ConnectionError))
            if stopped:
                lost: BaseException = EngineShutdownError(
                    f"The host engine (pid {pid}) was stopped (`python -m vllm_inline engines "
                    "stop`, or its keep_alive ran out). The next request attaches to a new one."
                )
            elif ended:
                lost = EngineDeadError(
                    f"The host engine (pid {pid}) went away: its process ended. The next "
                    "request (or engine.restart()) attaches to a new one."
                )
            else:
                lost = EngineDeadError(
                    f"The connection to the host engine (pid {pid}) broke: {e!r}"
                )
                lost.__cause__ = e
            self._lose(lost)

    def _lose(self, lost: BaseException) -> None:
        """The connection is gone: every call and stream waiting ends with ``lost``."""
        self.lost = lost
        for target in list(self.waiting.values()):
            if isinstance(target, asyncio.Queue):
                target.put_nowait(("lost", None))
            elif not target.done():
                target.set_exception(lost)

    def _send(self, message: Any) -> None:
        if self.lost is not None:
            raise self.lost
        self.writer.write(wire.frame(message))

    async def call(self, op: str, payload: Any = None) -> Any:
        """Run ``op`` there and return its result (on this link's loop)."""
        request_id = next(self.ids)
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiting[request_id] = answer
        try:
            self._send((op, request_id, payload))
            return await answer
        except asyncio.CancelledError:  # as in-process: the work stops there too
            if self.lost is None and not self.writer.is_closing():
                self.writer.write(wire.frame(("cancel", request_id, None)))
            raise
        finally:
            self.waiting.pop(request_id, None)

    async def stream(self, payload: Any) -> AsyncIterator[Delta]:
        """A stream's deltas as they come (on this link's loop); leaving it early cancels it
        there, which aborts it in vLLM."""
        request_id = next(self.ids)
        items: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.waiting[request_id] = items
        ended = False
        try:
            self._send(("stream", request_id, payload))
            while True:
                kind, value = await items.get()
                if kind == "delta":
                    yield value
                    continue
                ended = True
                if kind == "end":
                    return
                if kind == "lost":
                    assert self.lost is not None
                    raise self.lost
                raise wire.exception_from_wire(value)
        finally:
            self.waiting.pop(request_id, None)
            if not ended and self.lost is None and not self.writer.is_closing():
                self.writer.write(wire.frame(("cancel", request_id, None)))

    def close(self) -> None:
        """Detach: the calls and streams in flight end with ``EngineShutdownError`` (their
        consumers are given the time to see it), then the connection and the loop go."""

        if self.orphaned:
            return

        async def close() -> None:
            self._lose(EngineShutdownError("This process detached from the engine."))
            self.writer.close()
            self.reading.cancel()
            for _ in range(100):  # the streams' pumps hand their end over: a few passes
                if not self.waiting:
                    break
                await asyncio.sleep(0.01)

        if not self.loop.loop.is_closed():
            with contextlib.suppress(Exception):
                self.loop.submit(close()).result(timeout=5)
        self.loop.stop()


async def _open(sock: socket.socket) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock.setblocking(False)
    return await asyncio.open_unix_connection(sock=sock, limit=1 << 24)


_links: weakref.WeakSet[Link] = weakref.WeakSet()
_links_lock = threading.Lock()


def _close_all() -> None:
    """At the interpreter's exit: the host engines see this process go at once, and the
    connections' readers end in order."""
    with _links_lock:
        links = list(_links)
    for link in links:
        link.close()


def _orphan_in_child() -> None:
    """In a child forked from this process: its links are not its own (their loop threads are
    not there, and the host must not take the child for the parent). They are marked lost,
    so that the child's engines attach again at their first use, and their descriptors are
    closed, not shut down: the parent's connections stay."""
    for link in list(_links):
        link.orphaned = True
        link.lost = EngineShutdownError("This process was forked from the one that attached.")
        sock = link.writer.get_extra_info("socket")
        with contextlib.suppress(OSError, AttributeError):
            os.close(sock.fileno())
    _links.clear()


atexit.register(_close_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_orphan_in_child)
