"""An OpenAI-compatible ``/v1/chat/completions`` inside your own FastAPI app, on vLLM in-process.

    python examples/openai_server.py [--model M] [--host 127.0.0.1] [--port 8000] [--api-key KEY]
    VLLM_API_KEY=<key> MODEL=<hub id or path> uvicorn --factory examples.openai_server:create_app
    curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
        -H "Authorization: Bearer $VLLM_API_KEY" \\
        -d '{"model": "<the id /v1/models lists>", "stream": true,
             "messages": [{"role": "user", "content": "Hello"}]}'

Any OpenAI client works against it (``OpenAI(base_url="http://127.0.0.1:8000/v1",
api_key=<the key>)``, LangChain's ``ChatOpenAI(base_url=...)``). This is the hand-written
"FastAPI + vLLM backend" with the hand-written parts gone: delta streaming, the model's stop
tokens, its chat template, token counts, tool-call parsing and the ``max_tokens=512`` /
``repetition_penalty=1.1`` defaults all come from :mod:`vllm_inline.engine`; what is left here
is the translation between OpenAI's wire format and the engine's call, which is yours to extend
(your own routes, a RAG chain in front of the model sharing the same engine through
``get_engine``). For a plain model server with nothing of yours around it, ``vllm serve`` is the
better answer: see docs/migration.md.

As with ``vllm serve``, an API key (``--api-key``, else ``$VLLM_API_KEY``) locks every
``/v1/...`` route (401 without ``Authorization: Bearer <key>``; ``/health`` stays open); without
one the server is open. Bodies over ``--max-body-bytes`` and requests over ``--max-tokens-cap``
or ``--max-n`` are refused before they reach the engine (the guard, below).

The engine lives in the server process: run one worker (``--workers 1``; every worker process
would load its own copy of the model).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing, asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vllm_inline.cli import resolve_model
from vllm_inline.engine import (
    DEFAULTS,
    BadRequestError,
    ContextLengthExceededError,
    Delta,
    EngineUnavailableError,
    get_engine,
)
from vllm_inline.engine.stream.openai_format import (
    chunk_from_delta,
    completion_from_deltas,
    usage_chunk,
)

# OpenAI request fields handed to the engine under the same name and meaning.
OPENAI_SAMPLING = (
    "temperature",
    "top_p",
    "stop",
    "seed",
    "n",
    "presence_penalty",
    "frequency_penalty",
)
# vLLM's own extras, as `vllm serve` takes them next to OpenAI's fields (`extra_body=` in the SDK).
VLLM_EXTRAS = (
    "repetition_penalty",
    "top_k",
    "min_p",
    "min_tokens",
    "ignore_eos",
    "stop_token_ids",
    "chat_template_kwargs",
)
# Read by the route itself, or OpenAI fields with no effect on a model in this process.
IGNORED = (
    "model",
    "messages",
    "stream",
    "stream_options",
    "user",
    "store",
    "metadata",
    "service_tier",
    "parallel_tool_calls",
    "prompt_cache_key",
    "safety_identifier",
)
# Translated below.
HANDLED = (
    "max_tokens",
    "max_completion_tokens",
    "tools",
    "tool_choice",
    "response_format",
    "logprobs",
    "top_logprobs",
    "logit_bias",
)


def openai_error(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> JSONResponse:
    """An error in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


def engine_kwargs(body: Mapping[str, Any]) -> dict[str, Any]:
    """The ``Engine.astream`` keyword arguments for an OpenAI request body.

    Values are checked by the engine (a bad one raises :class:`BadRequestError` naming it);
    here only OpenAI's names and shapes are translated.
    """
    unknown = sorted(set(body) - {*OPENAI_SAMPLING, *VLLM_EXTRAS, *IGNORED, *HANDLED})
    if unknown:
        name = unknown[0]
        raise BadRequestError.invalid(name, body[name], "an unrecognized request argument")
    kwargs = {k: body[k] for k in (*OPENAI_SAMPLING, *VLLM_EXTRAS) if body.get(k) is not None}
    # max_completion_tokens replaced max_tokens in OpenAI's API; both are still sent.
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    if max_tokens is not None:
        kwargs["max_tokens"] = max_tokens
    if body.get("tools"):
        kwargs["tools"] = body["tools"]
        kwargs["tool_choice"] = body.get("tool_choice")
    if body.get("logprobs"):
        kwargs["logprobs"] = body.get("top_logprobs") or 0
    if body.get("logit_bias"):
        try:  # JSON keys are strings; vLLM wants token ids
            kwargs["logit_bias"] = {int(k): float(v) for k, v in body["logit_bias"].items()}
        except (AttributeError, TypeError, ValueError):
            raise BadRequestError.invalid(
                "logit_bias", body["logit_bias"], "a mapping of token ids to biases"
            ) from None
    response_format = body.get("response_format") or {"type": "text"}
    kind = response_format.get("type") if isinstance(response_format, Mapping) else None
    if kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        kwargs["structured_outputs"] = {"json": schema or {"type": "object"}}
    elif kind == "json_object":
        kwargs["structured_outputs"] = {"json_object": True}
    elif kind != "text":
        raise BadRequestError.invalid(
            "response_format", response_format, "{'type': 'text' | 'json_object' | 'json_schema'}"
        )
    return kwargs


async def cancel_on_disconnect(request: Request, work: asyncio.Future[Any]) -> bool:
    """Wait for ``work``; cancel it (aborting its engine request) if the client leaves first.

    True when ``work`` finished. The request body has been read, so the next ASGI message the
    server has for us is the disconnect.
    """

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if not work.done():
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        return False
    return True


# -- the guard: API key, body size and per-request caps, all checked before the engine -------

MAX_BODY_BYTES = 1 << 20
"""1 MiB. Text is about 4 bytes a token, so even a request that fills a 128k-token context is
about half of this as JSON: no text request a model can take is refused, while no client makes
the server buffer and parse megabytes. Images sent inline (base64 data URLs) need more."""
MAX_N = 8
"""Each of ``n`` choices is a sequence of its own in vLLM's batch (its KV cache, its steps): 8
allows sampling a few answers to pick from, and no request takes more than 8 of the batch's
128-1024 sequence slots (vLLM's ``max_num_seqs``)."""


class Guard:
    """Pure ASGI middleware in front of ``/v1``, as ``vllm serve``'s: the API key (401 without
    ``Authorization: Bearer <key>``), then the body size (413 over ``max_body_bytes``, by its
    ``Content-Length`` or by the bytes as they arrive), before any of the body reaches the app.
    Other paths (``/health``) and CORS preflights (``OPTIONS``) pass."""

    def __init__(self, app: ASGIApp, api_key: str | None, max_body_bytes: int | None) -> None:
        self.app = app
        # Digests have one length: compare_digest then takes the same time for any key sent.
        self.key = hashlib.sha256(api_key.encode()).digest() if api_key else None
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "").removeprefix(scope.get("root_path", ""))
        if (
            scope["type"] not in ("http", "websocket")
            or scope.get("method") == "OPTIONS"
            or not path.startswith("/v1")
        ):
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if self.key is not None:
            scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
            digest = hashlib.sha256(token).digest()
            if not (secrets.compare_digest(digest, self.key) and scheme.lower() == b"bearer"):
                if scope["type"] == "websocket":
                    return await send({"type": "websocket.close", "code": 1008})
                # vllm serve answers {"error": "Unauthorized"}; OpenAI clients read this shape.
                reason = (
                    "the API key is not valid" if scheme else "send Authorization: Bearer <key>"
                )
                error = openai_error(401, f"Unauthorized: {reason}.", code="invalid_api_key")
                error.headers["WWW-Authenticate"] = "Bearer"
                return await error(scope, receive, send)
        if scope["type"] == "http" and self.max_body_bytes is not None:
            length = headers.get(b"content-length", b"")
            too_long = length.isdigit() and int(length) > self.max_body_bytes
            body = None if too_long else await self.read_body(receive)
            if body is None:
                limit = f"this server's limit of {self.max_body_bytes} bytes (--max-body-bytes)"
                message = f"The request body is larger than {limit}."
                error = openai_error(413, message, code="request_too_large")
                return await error(scope, receive, send)
            receive = replay(body, receive)
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


def replay(messages: list[Message], receive: Receive) -> Receive:
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


def create_app(
    model: str | None = None,
    served_model_name: str | None = None,
    *,
    api_key: str | None = None,
    max_body_bytes: int | None = MAX_BODY_BYTES,
    max_tokens_cap: int | None = None,
    max_n: int | None = MAX_N,
    vllm_kwargs: Mapping[str, Any] | None = None,
) -> FastAPI:
    """The app for ``model`` (a hub id or path; default: the embedded scripted demo model),
    listed by ``/v1/models`` as ``served_model_name`` (default: ``model``, or
    ``"vllm-inline-demo"`` for the demo model).

    ``api_key`` (default: ``$VLLM_API_KEY``; ``""`` for none) locks ``/v1``. A request body over
    ``max_body_bytes`` is refused (413), and so is (400) a ``max_tokens`` /
    ``max_completion_tokens`` over ``max_tokens_cap`` (default: the model's context) or an
    ``n`` over ``max_n``; ``None`` lifts a limit. With a cap, a request that names no
    ``max_tokens`` gets the smaller of the cap and the engine's default. ``vllm_kwargs``: the
    engine's options (default: on a CPU the engine picks dtype, KV cache and eager mode itself).
    """
    limits = {"max_body_bytes": max_body_bytes, "max_tokens_cap": max_tokens_cap, "max_n": max_n}
    for name, value in limits.items():
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{name}={value!r} is invalid: a positive integer, or None.")
    if api_key is None:
        api_key = os.environ.get("VLLM_API_KEY")
    model = model or os.environ.get("MODEL") or None
    path = resolve_model(model)
    engine = get_engine(path, **dict(vllm_kwargs or {}))
    model_id = served_model_name or model or "vllm-inline-demo"

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Start the engine with the server, in a thread so the loop runs while the model loads;
        # at the end stop it if this server started it (one already running in the process is
        # shared through get_engine and stays up for its other users).
        started_here = not engine.started
        await asyncio.to_thread(engine.start)
        yield
        if started_here:
            await asyncio.to_thread(engine.shutdown)

    app = FastAPI(lifespan=lifespan)
    app.add_middleware(Guard, api_key=api_key, max_body_bytes=max_body_bytes)

    @app.exception_handler(BadRequestError)
    async def bad_request(request: Request, e: BadRequestError) -> JSONResponse:
        code = "context_length_exceeded" if isinstance(e, ContextLengthExceededError) else None
        return openai_error(400, str(e), e.parameter, code)

    @app.exception_handler(EngineUnavailableError)
    async def unavailable(request: Request, e: EngineUnavailableError) -> JSONResponse:
        return openai_error(503, str(e))

    @app.get("/health")
    async def health() -> Response:
        """200 while the engine runs; open without a key, as ``vllm serve``'s."""
        return Response(status_code=200 if engine.started else 503)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": model_id, "object": "model", "created": 0, "owned_by": "vllm-inline"}
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return openai_error(400, "The request body is not valid JSON.")
        if not isinstance(body, dict):
            return openai_error(400, "The request body must be a JSON object.")
        if body.get("model") != model_id:
            return openai_error(
                404,
                f"The model {body.get('model')!r} does not exist; this server has "
                f"{model_id!r} (see /v1/models).",
                "model",
                "model_not_found",
            )
        check_caps(body, max_tokens_cap, max_n)
        kwargs = engine_kwargs(body)
        if max_tokens_cap is not None and "max_tokens" not in kwargs:
            kwargs["max_tokens"] = min(max_tokens_cap, DEFAULTS["max_tokens"])
        meta = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "model": model_id,
            "created": int(time.time()),
        }
        deltas = engine.astream(body.get("messages"), **kwargs)
        stream = bool(body.get("stream"))
        # A stream waits for its first delta before the 200 goes out, so bad input still gets
        # a 400 (the engine checks the request when the stream starts). Either way, a client
        # that hangs up meanwhile cancels the work, which aborts the request in vLLM.
        work = asyncio.ensure_future(anext(deltas) if stream else collect(deltas))
        if not await cancel_on_disconnect(request, work):
            return Response(status_code=499)  # nobody is listening any more
        if not stream:
            return JSONResponse(completion_from_deltas(work.result(), **meta))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        events = sse_events(work.result(), deltas, meta, include_usage)
        return StreamingResponse(events, media_type="text/event-stream")

    return app


async def collect(deltas: AsyncIterator[Delta]) -> list[Delta]:
    """All deltas of a request (the non-streaming answer is built from the same deltas)."""
    async with aclosing(deltas):
        return [delta async for delta in deltas]


async def sse_events(
    first: Delta, rest: AsyncIterator[Delta], meta: dict[str, Any], include_usage: bool
) -> AsyncIterator[str]:
    """``data: {chunk}`` events, then ``data: [DONE]``.

    When the client disconnects, Starlette cancels this generator; ``aclosing`` then closes the
    engine stream, which aborts the request in vLLM.
    """
    started: set[int] = set()

    def event(delta: Delta) -> str:
        chunk = chunk_from_delta(delta, first=delta.index not in started, **meta)
        started.add(delta.index)
        return f"data: {json.dumps(chunk)}\n\n"

    async with aclosing(rest):
        usage = first.usage
        yield event(first)
        try:
            async for delta in rest:
                usage = delta.usage or usage
                yield event(delta)
        except (BadRequestError, EngineUnavailableError) as e:
            # Headers are gone: report the error in the stream, as `vllm serve` does.
            param = getattr(e, "parameter", None)
            error = {"message": str(e), "type": type(e).__name__, "param": param}
            yield f"data: {json.dumps({'error': error})}\n\n"
        else:
            if include_usage and usage is not None:
                yield f"data: {json.dumps(usage_chunk(usage, **meta))}\n\n"
    yield "data: [DONE]\n\n"


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", help="hub id or local path (default: $MODEL, else the embedded demo model)"
    )
    parser.add_argument("--served-model-name", help="the id clients send as `model`")
    parser.add_argument(
        "--vllm-kwargs",
        type=json.loads,
        help="engine options as JSON, e.g. '{\"max_model_len\": 4096}' (default: the engine's choice)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--api-key", help="require `Authorization: Bearer KEY` on /v1 (default: $VLLM_API_KEY)"
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=MAX_BODY_BYTES,
        help="refuse larger request bodies (413; default: %(default)s)",
    )
    parser.add_argument(
        "--max-tokens-cap",
        type=int,
        help="refuse a larger max_tokens / max_completion_tokens (default: the model's context)",
    )
    parser.add_argument(
        "--max-n", type=int, default=MAX_N, help="refuse a larger n (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    app = create_app(
        args.model,
        args.served_model_name,
        api_key=args.api_key,
        max_body_bytes=args.max_body_bytes,
        max_tokens_cap=args.max_tokens_cap,
        max_n=args.max_n,
        vllm_kwargs=args.vllm_kwargs,
    )
    uvicorn.run(app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
