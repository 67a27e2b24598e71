"""Serve an ASGI app with uvicorn in a thread on 127.0.0.1, over a real socket, for a test;
read the Responses API's server-sent events."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any


@contextlib.contextmanager
def serving(app: Any, lifespan: str = "on") -> Iterator[str]:
    """Serve ``app`` until the block ends; yields its base URL (``http://127.0.0.1:PORT``)."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan=lifespan))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 180  # the lifespan starts the engines
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()
    assert not thread.is_alive()


def sse_events(lines: Iterable[str], most: int | None = None) -> list[dict[str, Any]]:
    """The events of an SSE body's ``lines`` (all, or the first ``most``), checked: each
    ``event:`` line names the type of the ``data:`` after it."""
    out: list[dict[str, Any]] = []
    name = None
    for line in lines:
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            event = json.loads(line.removeprefix("data: "))
            assert event["type"] == name, (name, event["type"])
            out.append(event)
            if len(out) == most:
                break
    return out
