"""One process's connection to a host engine (:mod:`.owner`), read on a loop thread of the
process: calls wait for their result, streams get their deltas as they come, and the end of
the connection (the host engine stopped or killed) ends every call and stream in flight with
:class:`~vllm_inline.engine.errors.EngineDeadError`.

Standard library and the package's light modules only: no torch, no vLLM.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
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
        self.reader, self.writer = self.loop.submit(_open(sock)).result()
        self.reading = self.loop.submit(self._read())

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
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError) as e:
            pid = self.info.get("pid")
            self.lost = (
                EngineShutdownError(
                    f"The host engine (pid {pid}) was stopped (`python -m vllm_inline engines "
                    "stop`, or its keep_alive ran out). The next request attaches to a new one."
                )
                if stopped
                else EngineDeadError(
                    f"The host engine (pid {pid}) went away: its process ended. The next "
                    "request (or engine.restart()) attaches to a new one."
                )
            )
            for target in list(self.waiting.values()):
                if isinstance(target, asyncio.Queue):
                    target.put_nowait(("lost", None))
                elif not target.done():
                    target.set_exception(self.lost)
            if isinstance(e, asyncio.CancelledError):
                raise

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
        async def close() -> None:
            self.writer.close()
            self.reading.cancel()

        if not self.loop.loop.is_closed():
            with_timeout = self.loop.submit(close())
            with_timeout.result(timeout=5)
        self.loop.stop()


async def _open(sock: socket.socket) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock.setblocking(False)
    return await asyncio.open_unix_connection(sock=sock, limit=1 << 24)
