"""``POST /v1/responses``, ``GET /v1/responses/{id}`` and ``POST /v1/responses/{id}/cancel``:
a Responses request becomes one ``Engine.astream`` call on the conversation it continues, its
deltas output items and stream events (:mod:`.output`), and the response is kept in the store
(:mod:`.store`) for ``previous_response_id`` and ``GET``.

As in the chat route, a stream waits for its first delta before the 200 goes out (bad input
still gets a 400), and a client that leaves cancels the work, which aborts the request in vLLM.
A response is stored, in one transaction, before its last event (``response.completed`` /
``response.incomplete``) or its JSON goes out, so a client may name it at once in its next
request, on any worker. A request that fails stores nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from vllm_inline.engine import DEFAULTS, BadRequestError, Delta, VLLMInlineError
from vllm_inline.server.chat import read_body, until_disconnect
from vllm_inline.server.errors import InvalidBodyError, error_response, status_of
from vllm_inline.server.limits import Limits
from vllm_inline.server.models import ServedModels
from vllm_inline.server.requests import check_request_id, check_unknown
from vllm_inline.server.responses.background import BackgroundResponses
from vllm_inline.server.responses.inputs import conversation
from vllm_inline.server.responses.params import (
    KNOWN_FIELDS,
    echoed_fields,
    engine_kwargs,
    function_tools,
)
from vllm_inline.server.responses.store import CANCELLABLE, ResponseStore
from vllm_inline.server.responses.turn import Turn

__all__ = ["responses_router"]

logger = logging.getLogger("vllm_inline")

_NOT_FOUND = "invalid_request_error"
"""The ``type`` of ``vllm serve``'s 404 for an unknown response id (OpenAI's too)."""


def _not_found(response_id: str, param: str) -> JSONResponse:
    return error_response(404, f"Response with id '{response_id}' not found.", param, _NOT_FOUND)


def _input_named(e: BadRequestError) -> BadRequestError:
    """The engine names the chat ``messages`` it was given; the body has them as ``input``."""
    if isinstance(e.parameter, str) and e.parameter.startswith("messages"):
        e.parameter = "input" + e.parameter.removeprefix("messages")
    return e


def _sse(event: Mapping[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


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
        tools = function_tools(body.get("tools"))
        kwargs = engine_kwargs(body, tools)
        if cap is not None and "max_tokens" not in kwargs:
            kwargs["max_tokens"] = min(cap, int(DEFAULTS["max_tokens"]))
        if served.reasoning_parser is not None:
            kwargs["reasoning_parser"] = served.reasoning_parser
        messages, new = conversation(body.get("input"), body.get("instructions"), history)
        try:  # the engine checks the values here, before any work
            deltas = served.engine.astream(messages, **kwargs)
        except BadRequestError as e:
            raise _input_named(e) from None
        turn = Turn(body, served, kwargs, echoed_fields(body, kwargs), history, new)
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
    async def retrieve(response_id: str) -> Response:
        stored = await asyncio.to_thread(lambda: store().get(response_id))
        if stored is None:
            return _not_found(response_id, "response_id")
        return JSONResponse(stored.response)

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
    """The SSE events: ``response.created`` and ``response.in_progress``, each delta's, the last
    item's ``done``, then ``response.completed`` (or ``.incomplete``), each with its
    ``sequence_number``; an engine error ends the stream with ``response.failed``. Starlette
    cancels this generator when the client leaves, which closes the engine stream."""
    number = 0

    def numbered(event: dict[str, Any]) -> str:
        nonlocal number
        event["sequence_number"] = number
        number += 1
        return _sse(event)

    start = turn.response("in_progress")
    yield numbered({"response": start, "sequence_number": 0, "type": "response.created"})
    yield numbered({"response": start, "sequence_number": 0, "type": "response.in_progress"})
    try:
        for event in turn.fold.feed(first):
            yield numbered(event)
        async with aclosing(deltas):  # type: ignore[type-var]
            async for delta in deltas:
                for event in turn.fold.feed(delta):
                    yield numbered(event)
        for event in turn.fold.close():
            yield numbered(event)
    except Exception as e:  # noqa: BLE001 - headers are gone: the stream's last event says it
        http = status_of(e) if isinstance(e, VLLMInlineError) else 500
        code = "server_error" if http >= 500 else "invalid_request"
        failed = turn.response("failed", error={"code": code, "message": str(e)})
        yield numbered({"response": failed, "sequence_number": 0, "type": "response.failed"})
        return
    status = turn.status()
    response = turn.response(status)
    await turn.keep(store, response)
    kind = "response.incomplete" if status == "incomplete" else "response.completed"
    yield numbered({"response": response, "sequence_number": 0, "type": kind})
