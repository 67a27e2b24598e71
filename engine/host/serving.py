"""The requests of one attached process, on the host engine's own loop (:mod:`.owner`).

Once a process is greeted, its connection moves to the engine's event-loop thread, where vLLM's
output handler and every stream's generator already run: a delta goes from vLLM's output to the
socket in that one thread, as in-process it goes to the consumer's bridge (no thread hop added in
the host). A stream runs the engine's own streaming path (:func:`~..stream.generate.generate` on
the request :func:`~..request.request.build_request` checks, as :meth:`Engine.astream
<vllm_inline.engine.Engine.astream>` does); the other calls go through the engine's public
methods. Frames queued in one pass of the loop go out in one write. A request cancelled by its
process, or whose process went away, is cancelled here, which aborts it in vLLM.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from vllm_inline.engine.engine import Engine
from vllm_inline.engine.host import wire
from vllm_inline.engine.life.runtime import Runtime
from vllm_inline.engine.request.request import build_request
from vllm_inline.engine.stream.generate import generate

__all__ = ["Call", "Connection", "serve", "stop_all"]

HIGH_WATER = 4 << 20
"""Bytes queued to one process past which its streams wait for the socket (a reader that
stopped reading)."""


@dataclass(eq=False)
class Connection:
    """One attached process's connection, on the engine loop."""

    pid: int
    writer: asyncio.StreamWriter
    tasks: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    pending: list[bytes] = field(default_factory=list)

    def send(self, message: Any) -> None:
        """Queue ``message``; everything queued in one pass of the loop goes in one write."""
        if not self.pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self.pending.append(wire.frame(message))

    def _flush(self) -> None:
        data, self.pending = b"".join(self.pending), []
        if not self.writer.is_closing():
            self.writer.write(data)

    async def room(self) -> None:
        """Wait while too much is queued for this process."""
        transport = self.writer.transport
        if transport.get_write_buffer_size() > HIGH_WATER and not transport.is_closing():
            await self.writer.drain()

    def track(self, request_id: int, task: asyncio.Task[None]) -> None:
        """Keep ``task`` (request ``request_id``) until it is done: a cancel or a lost
        connection cancels it."""
        self.tasks[request_id] = task
        task.add_done_callback(lambda _: self.tasks.pop(request_id, None))


Call = Callable[[Any], Awaitable[Any]]
"""A request the host answers: its payload in, its result out."""


async def serve(
    engine: Engine,
    runtime: Runtime,
    sock: socket.socket,
    pid: int,
    live: set[Connection],
    more: dict[str, Call],
) -> None:
    """Serve the process ``pid`` on ``sock`` until it goes (on ``runtime``'s loop, the started
    ``engine``'s); ``more``: the requests the host answers itself (status, keep_alive)."""
    sock.setblocking(False)
    reader, writer = await asyncio.open_unix_connection(sock=sock, limit=1 << 24)
    connection = Connection(pid, writer)
    live.add(connection)
    calls = {**_calls(engine), **more}
    try:
        while True:
            op, request_id, payload = await wire.read_frame(reader)
            if op == "cancel":
                task = connection.tasks.get(request_id)
                if task is not None:
                    task.cancel()
                continue
            job = _job(engine, runtime, calls, connection, op, request_id, payload)
            connection.track(request_id, asyncio.ensure_future(job))
    except (asyncio.IncompleteReadError, ConnectionError):
        pass  # the process ended, crashed or was killed
    finally:
        for task in list(connection.tasks.values()):
            task.cancel()  # aborts its requests in vLLM
        live.discard(connection)
        writer.close()


async def stop_all(live: set[Connection]) -> None:
    """Tell every attached process the engine stops (their streams in flight end with
    :class:`~vllm_inline.engine.errors.EngineShutdownError`) and close their connections."""
    for connection in list(live):
        connection.writer.write(wire.frame(("stopped", 0, None)))
        connection.writer.close()


async def _job(
    engine: Engine,
    runtime: Runtime,
    calls: dict[str, Call],
    connection: Connection,
    op: str,
    request_id: int,
    payload: Any,
) -> None:
    try:
        if op == "stream":
            messages, kwargs = payload
            request = build_request(
                messages,
                kwargs,
                adapters=engine.adapters,
                max_model_len=runtime.max_model_len,
                engine_options=engine.vllm_kwargs,
            )
            async for delta in generate(runtime, request):
                connection.send(("delta", request_id, delta))
                await connection.room()
            connection.send(("end", request_id, None))
            return
        call = calls.get(op)
        if call is None:
            raise ValueError(f"unknown request {op!r}")
        connection.send(("result", request_id, await call(payload)))
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - the request's error, for its process
        connection.send(("error", request_id, wire.exception_to_wire(e)))


def _calls(engine: Engine) -> dict[str, Call]:
    async def embed(payload: Any) -> Any:
        texts, kwargs = payload
        return await engine.aembed(texts, **kwargs)

    async def score(payload: Any) -> Any:
        query, documents, kwargs = payload
        return await engine.ascore(query, documents, **kwargs)

    async def prompt_token_ids(payload: Any) -> Any:
        messages, kwargs = payload
        return await engine.aprompt_token_ids(messages, **kwargs)

    async def stats(_: Any) -> Any:
        return engine.stats()

    async def check_parsers(payload: Any) -> Any:
        engine.check_parsers(*payload)

    async def unfinished(_: Any) -> Any:
        return engine.num_unfinished_requests()

    return {
        "embed": embed,
        "score": score,
        "prompt_token_ids": prompt_token_ids,
        "stats": stats,
        "check_parsers": check_parsers,
        "unfinished": unfinished,
    }
