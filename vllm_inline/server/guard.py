"""The guard in front of the server's routes: the API key, the body size, and per-request caps,
all checked before a request reaches an engine.

``vllm serve`` checks its key on ``/v1`` only, which leaves ``/rerank``, ``/v2/rerank``,
``/score``, ``/tokenize`` and ``/detokenize`` running the models for anyone (its security page
warns; vLLM issues 18892, 42591, 58144). Here the key is asked on every route the server
installs but :data:`PUBLIC`, each open for a reason said there; a route added later is guarded
unless it is added to :data:`PUBLIC` (``tests/test_server.py`` walks the whole route table).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vllm_inline.engine import BadRequestError
from vllm_inline.server.errors import error_response

__all__ = ["PUBLIC", "Guard", "check_caps"]

PUBLIC: Mapping[str, str] = {
    "/health": "load balancers and orchestrators probe it without credentials (as vllm serve's)",
    "/": "the chat page's own HTML; every request the page makes carries the key",
    "/metrics": "Prometheus scrapers send no bearer token; counts and model names, no text",
    "/version": "the server's vLLM version only (as vllm serve's)",
}
"""The server's routes open without the key, and why each is."""


class Guard:
    """Pure ASGI middleware in front of the server's routes: the API key (401 without
    ``Authorization: Bearer <key>``), then the body size (413 over ``max_body_bytes``, by its
    ``Content-Length`` or by the bytes as they arrive), before any of the body reaches the app.

    ``routes``: the path patterns of the routes to guard (those :class:`~.app.OpenAIServer`
    installs; an app's own routes beside them are its own), ``None`` for every path; the paths
    of :data:`PUBLIC` and CORS preflights pass either way."""

    def __init__(
        self,
        app: ASGIApp,
        api_key: str | None,
        max_body_bytes: int | None,
        routes: Sequence[re.Pattern[str]] | None = None,
    ) -> None:
        self.app = app
        # Digests have one length: compare_digest then takes the same time for any key sent.
        self.key = hashlib.sha256(api_key.encode()).digest() if api_key else None
        self.max_body_bytes = max_body_bytes
        self.routes = routes

    def guards(self, path: str) -> bool:
        """Whether ``path`` needs the key (and has its body limited)."""
        if path in PUBLIC:
            return False
        return self.routes is None or any(route.match(path) for route in self.routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "").removeprefix(scope.get("root_path", ""))
        if (
            scope["type"] not in ("http", "websocket")
            or scope.get("method") == "OPTIONS"
            or not self.guards(path)
        ):
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if self.key is not None:
            scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
            digest = hashlib.sha256(token).digest()
            if not (secrets.compare_digest(digest, self.key) and scheme.lower() == b"bearer"):
                if scope["type"] == "websocket":
                    return await send({"type": "websocket.close", "code": 1008})
                reason = (
                    "the API key is not valid" if scheme else "send Authorization: Bearer <key>"
                )
                error = error_response(401, f"Unauthorized: {reason}.")
                error.headers["WWW-Authenticate"] = "Bearer"
                return await error(scope, receive, send)
        if scope["type"] == "http" and self.max_body_bytes is not None:
            length = headers.get(b"content-length", b"")
            too_long = length.isdigit() and int(length) > self.max_body_bytes
            body = None if too_long else await self.read_body(receive)
            if body is None:
                limit = f"this server's limit of {self.max_body_bytes} bytes (--max-body-bytes)"
                error = error_response(413, f"The request body is larger than {limit}.")
                return await error(scope, receive, send)
            receive = _replay(body, receive)
        await self.app(scope, receive, send)

    async def read_body(self, receive: Receive) -> list[Message] | None:
        """The body's messages, counted as they arrive (a chunked body has no Content-Length);
        None past the limit, without reading further."""
        messages: list[Message] = []
        size, more = 0, True
        while more:
            messages.append(message := await receive())
            if message["type"] != "http.request":  # the client left: the app will see it
                break
            size += len(message.get("body", b""))
            if size > (self.max_body_bytes or 0):
                return None
            more = message.get("more_body", False)
        return messages


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """``receive`` for the app: ``messages`` first, then the server's (the disconnect)."""
    pending = list(reversed(messages))

    async def receive_again() -> Message:
        return pending.pop() if pending else await receive()

    return receive_again


def check_caps(body: Mapping[str, Any], max_tokens_cap: int | None, max_n: int | None) -> None:
    """Refuse a request over the server's caps (400 naming the field), before the engine."""
    for name, cap, flag in (
        ("max_tokens", max_tokens_cap, "--max-tokens-cap"),
        ("max_completion_tokens", max_tokens_cap, "--max-tokens-cap"),
        ("n", max_n, "--max-n"),
    ):
        value = body.get(name)
        if cap is not None and isinstance(value, (int, float)) and value > cap:
            raise BadRequestError.invalid(name, value, f"at most {cap} on this server ({flag})")
