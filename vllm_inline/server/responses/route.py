"""``POST /v1/responses``, ``GET /v1/responses/{id}`` and ``POST /v1/responses/{id}/cancel``:
a Responses request becomes one ``Engine.astream`` call on the conversation it continues, its
deltas output items and stream events (:mod:`.output`), and the response is kept in the store
(:mod:`.store`) for ``previous_response_id`` and ``GET``.

As in the chat route, a stream waits for its first delta before the 200 goes out (bad input
still gets a 400), and a client that leaves cancels the work, which aborts the request in vLLM.
A response is stored, in one transaction, before its last event (``response.completed`` /
``response.incomplete``) or its JSON goes out, so a client may name it at once in its next
request, on any worker. A request that fails in the foreground stores nothing (a background
one stores its failed response).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import TypeAdapter, ValidationError

from vllm_inline.engine import DEFAULTS, BadRequestError, Delta
from vllm_inline.server.chat import read_body, until_disconnect
from vllm_inline.server.errors import InvalidBodyError, error_response
from vllm_inline.server.limits import Limits
from vllm_inline.server.models import ServedModels
from vllm_inline.server.requests import check_request_id, check_unknown
from vllm_inline.server.responses.background import BackgroundResponses
from vllm_inline.server.responses.events import LAST_EVENTS, sse, turn_events
from vllm_inline.server.responses.inputs import conversation
from vllm_inline.server.responses.params import (
    KNOWN_FIELDS,
    echoed_fields,
    engine_kwargs,
)
from vllm_inline.server.responses.store import CANCELLABLE, ResponseStore
from vllm_inline.server.responses.tools import chat_tools
from vllm_inline.server.responses.turn import Turn

__all__ = ["responses_router"]

logger = logging.getLogger("vllm_inline")

_NOT_FOUND = "invalid_request_error"
"""The ``type`` of ``vllm serve``'s 404 for an unknown response id (OpenAI's too)."""


_PAST_ANY = 1 << 62
"""A ``starting_after`` past any event: the store's answer then only says whether the response
has events (``[]``) or none (``None``), without reading them."""


_BOOL: TypeAdapter[bool] = TypeAdapter(bool)
_INT: TypeAdapter[int] = TypeAdapter(int)
"""How FastAPI reads ``vllm serve``'s query parameters (built once: a GET reads two)."""


def _not_found(response_id: str, param: str) -> JSONResponse:
    return error_response(404, f"Response with id '{response_id}' not found.", param, _NOT_FOUND)


def _input_named(e: BadRequestError) -> BadRequestError:
    """The engine names the chat ``messages`` it was given; the body has them as ``input``."""
    if isinstance(e.parameter, str) and e.parameter.startswith("messages"):
        e.parameter = "input" + e.parameter.removeprefix("messages")
    return e


def responses_router(
    models: ServedModels,
    limits: Limits,
    store: Callable[[], ResponseStore],
    background: BackgroundResponses,
) -> APIRouter:
    """The Responses routes for the chat models of ``models`` (reasoning items from each one's
    ``reasoning_parser``), keeping responses in ``store()`` and running background ones in
    ``background``."""
    router = APIRouter()

    @router.post("/v1/responses")
    async def create(request: Request) -> Response:
        body = await read_body(request)
        served = models.find("chat", body.get("model"))
        cap = limits.max_tokens_cap
        given = body.get("max_output_tokens")
        if cap is not None and isinstance(given, int) and given > cap:
            raise BadRequestError.invalid(
                "max_output_tokens", given, f"at most {cap} on this server (--max-tokens-cap)"
            )
        history: list[dict[str, Any]] = []
        previous = body.get("previous_response_id")
        if previous is not None and not isinstance(previous, str):
            raise InvalidBodyError("body.previous_response_id", "Input should be a valid string")
        if previous is not None:
            stored = await asyncio.to_thread(lambda: store().get(previous))
            if stored is None:
                return _not_found(previous, "previous_response_id")
            history = stored.messages
        check_unknown(body, KNOWN_FIELDS, limits)
        check_request_id(body)
        tools, tool_names = chat_tools(body.get("tools"))
        kwargs = engine_kwargs(body, tools)
        if cap is not None and "max_tokens" not in kwargs:
            kwargs["max_tokens"] = min(cap, int(DEFAULTS["max_tokens"]))
        kwargs.update(served.request_options(kwargs))
        messages, new = conversation(body.get("input"), body.get("instructions"), history)
        try:  # the engine checks the values here, before any work
            deltas = served.engine.astream(messages, **kwargs)
        except BadRequestError as e:
            raise _input_named(e) from None
        turn = Turn(body, served, kwargs, echoed_fields(body, kwargs), history, new, tool_names)
        if body.get("background") and body.get("stream"):
            await background.start_streamed(turn, deltas)
            events = background.follow(turn.id, after=-1)
            return StreamingResponse(events, media_type="text/event-stream")
        if body.get("background"):
            queued = turn.response("queued", streamed=False)
            await turn.keep(store, queued)
            background.start(turn, deltas)
            return JSONResponse(queued)
        if not body.get("stream"):
            return await _whole(request, turn, deltas, store)
        try:
            first = await until_disconnect(request, anext(deltas))
        except BadRequestError as e:
            raise _input_named(e) from None
        if first is None:
            await deltas.aclose()  # type: ignore[attr-defined]
            return Response(status_code=499)
        events = _events(turn, first, deltas, store)
        return StreamingResponse(events, media_type="text/event-stream")

    @router.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str, request: Request) -> Response:
        """The stored response; with ``stream=true``, the events of one streamed in the
        background, after ``starting_after`` (a number; from the first without it)."""
        stream, after = _stream_query(request)
        stored = await asyncio.to_thread(lambda: store().get(response_id))
        if stored is None:
            return _not_found(response_id, "response_id")
        if not stream:
            return JSONResponse(stored.response)
        if await asyncio.to_thread(lambda: store().events(response_id, _PAST_ANY)) is None:
            message = (
                f"Response '{response_id}' was not created with background and stream, so it "
                "has no events to stream: GET it without stream."
            )
            return error_response(400, message, "stream", "invalid_request_error")
        return StreamingResponse(
            background.follow(response_id, after), media_type="text/event-stream"
        )

    @router.post("/v1/responses/{response_id}/cancel")
    async def cancel(response_id: str) -> Response:
        """A background response still queued or running is marked ``cancelled`` in the
        store, which its worker (any) sees; another is refused, as ``vllm serve`` refuses it."""
        stored = await asyncio.to_thread(lambda: store().get(response_id))
        if stored is None:
            return _not_found(response_id, "response_id")
        if stored.response["status"] in CANCELLABLE:
            stored = await asyncio.to_thread(lambda: store().cancel(response_id))
            background.cancel(response_id)
            if stored is not None and stored.response["status"] == "cancelled":
                return JSONResponse(stored.response)
        # Finished, or cancelled before: nothing to cancel.
        message = "Cannot cancel a synchronous response."
        return error_response(400, message, "response_id", _NOT_FOUND)

    return router


def _stream_query(request: Request) -> tuple[bool, int]:
    """``stream`` and ``starting_after`` of a GET (``-1``: from the first event), read as
    FastAPI reads ``vllm serve``'s (pydantic's ``bool`` and ``int``)."""
    query = request.query_params
    values: dict[str, Any] = {}
    for name, adapter, default in (("stream", _BOOL, False), ("starting_after", _INT, -1)):
        try:
            values[name] = adapter.validate_python(query.get(name, default))
        except ValidationError as e:
            problem = e.errors()[0]["msg"]
            raise InvalidBodyError(f"query.{name}", problem) from None
    return values["stream"], values["starting_after"]


async def _whole(
    request: Request, turn: Turn, deltas: AsyncIterator[Delta], store: Callable[[], ResponseStore]
) -> Response:
    async def run() -> bool:
        async with aclosing(deltas):  # type: ignore[type-var]
            async for delta in deltas:
                turn.fold.feed(delta)
        turn.fold.close()
        return True

    try:
        done = await until_disconnect(request, run())
    except BadRequestError as e:
        raise _input_named(e) from None
    if done is None:
        return Response(status_code=499)  # nobody is listening any more
    response = turn.response(turn.status(), streamed=False)
    await turn.keep(store, response)
    return JSONResponse(response)


async def _events(
    turn: Turn, first: Delta, deltas: AsyncIterator[Delta], store: Callable[[], ResponseStore]
) -> AsyncIterator[str]:
    """The SSE frames of :func:`.events.turn_events`; the response is stored before its last
    event goes out (a failed one is not). Starlette closes this generator when the client
    leaves, which closes the engine stream."""
    async with aclosing(turn_events(turn, first, deltas)) as events:
        async for event in events:
            if event["type"] in LAST_EVENTS and event["type"] != "response.failed":
                await turn.keep(store, event["response"])
            yield sse(event)
