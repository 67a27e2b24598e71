"""The API key's cost per request: the guard in front of a do-nothing app, with and without a
key, on a guarded route and an open one, against the app alone (issue 65).

    python benchmarks/guard.py [--requests 200000]

What the server adds to each request before any engine work: matching the path against the
server's routes (``Guard.guards``), hashing the key sent and comparing it in constant time.
Pure Python on this process's loop, no socket: the figures are microseconds per request.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from vllm_inline.server import Limits, create_app
from vllm_inline.server.guard import Guard

KEY = "sk-benchmark-key"


async def app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})


async def receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


async def send(message: dict[str, Any]) -> None:
    pass


async def per_request(handler: Any, path: str, headers: list[Any], n: int) -> float:
    scope = {"type": "http", "method": "POST", "path": path, "root_path": "", "headers": headers}
    began = time.perf_counter()
    for _ in range(n):
        await handler(scope, receive, send)
    return (time.perf_counter() - began) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200_000)
    n = parser.parse_args().requests
    routes = [
        r.path_regex
        for r in create_app("any/model", limits=Limits(api_key=KEY)).router.routes
        if hasattr(r, "path_regex")
    ]
    keyed = Guard(app, api_key=KEY, max_body_bytes=None, routes=routes)
    keyless = Guard(app, api_key=None, max_body_bytes=None, routes=routes)
    auth = [(b"authorization", f"Bearer {KEY}".encode())]
    rows = {
        "the app alone": asyncio.run(per_request(app, "/v1/chat/completions", auth, n)),
        "no key set": asyncio.run(per_request(keyless, "/v1/chat/completions", auth, n)),
        "key, /v1/chat/completions": asyncio.run(
            per_request(keyed, "/v1/chat/completions", auth, n)
        ),
        "key, /v1/responses/{id}": asyncio.run(per_request(keyed, "/v1/responses/resp_1", auth, n)),
        "key, /health (open)": asyncio.run(per_request(keyed, "/health", [], n)),
    }
    alone = rows["the app alone"]
    for name, us in rows.items():
        print(f"{name:28s} {us:6.2f} us/request  (+{us - alone:5.2f} us)")


if __name__ == "__main__":
    main()
