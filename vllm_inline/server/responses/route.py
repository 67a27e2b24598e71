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
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from vllm_inline.engine import DEFAULTS, BadRequestError, Delta, VLLMInlineError
from vllm_inline.server.chat import read_body, until_disconnect
from vllm_inline.server.errors import error_response, status_of
from vllm_inline.server.limits import Limits
from vllm_inline.server.models import ServedModel, ServedModels
from vllm_inline.server.responses.inputs import conversation, output_messages
from vllm_inline.server.responses.output import OutputFold, response_object, usage_object
from vllm_inline.server.responses.params import echoed_fields, engine_kwargs, function_tools
from vllm_inline.server.responses.store import ResponseStore, StoredResponse

__all__ = ["LazyStore", "responses_router"]

logger = logging.getLogger("vllm_inline")

_NOT_FOUND = "invalid_request_error"
"""The ``type`` of ``vllm serve``'s 404 for an unknown response id (OpenAI's too)."""


class LazyStore:
    """The store, opened at the first request that needs it (a server that never serves
    ``/v1/responses`` writes no file)."""

    def __init__(self, opener: Callable[[], ResponseStore]) -> None:
        self._opener = opener
        self._store: ResponseStore | None = None
        self._lock = threading.Lock()

    def __call__(self) -> ResponseStore:
        with self._lock:
            if self._store is None:
                self._store = self._opener()
            return self._store

    def close(self) -> None:
        """Close the store if it was opened."""
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None


class _Turn:
    """One request's state: the fold, the response object's fields, what to store."""

    def __init__(self, body: Mapping[str, Any], served: ServedModel, kwargs: dict[str, Any],
                 echoed: dict[str, Any], history: list[dict[str, Any]],
                 new: list[dict[str, Any]]) -> None:  # fmt: skip
        self.served = served
        self.echoed = echoed
        self.history = [*history, *new]
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created_at = int(time.time())
        self.store = body.get("store", True) is not False
        self.fold = OutputFold(
            include_reasoning=body.get("include_reasoning", True) is not False,
            parallel_tool_calls=echoed["parallel_tool_calls"],
            top_logprobs=kwargs.get("logprobs"),
            whole=not body.get("stream"),
        )
        self.sampling = _sampling(served, kwargs)

    def response(
        self, status: str, error: dict[str, Any] | None = None, streamed: bool = True
    ) -> dict[str, Any]:
        fold = self.fold
        usage = None
        if fold.usage is not None:
            # vLLM's reasoning parsers count the tokens between their markers; the text's own
            # tokens are that count (the markers are not in it).
            tokenizer = self.served.engine.tokenizer
            reasoning = len(tokenizer.encode(fold.reasoning, add_special_tokens=False))
            usage = usage_object(fold.usage, reasoning if fold.reasoning else 0)
        output = list(fold.output) if status != "in_progress" else []
        if not streamed:  # as vllm serve builds a whole answer: a reasoning item has no status
            output = [{**i, "status": None} if i["type"] == "reasoning" else i for i in output]
        return response_object(
            response_id=self.id,
            created_at=self.created_at,
            model=self.served.name,
            echoed=self.echoed,
            sampling=self.sampling,
            output=output,
            status=status,
            usage=usage if status != "in_progress" else None,
            error=error,
        )

    def status(self) -> str:
        return "incomplete" if self.fold.finish_reason == "length" else "completed"

    async def keep(self, store: Callable[[], ResponseStore], response: dict[str, Any]) -> None:
        if not self.store:
            return
        messages = [*self.history, *output_messages(response["output"])]
        try:
            await asyncio.to_thread(lambda: store().put(StoredResponse(response, messages)))
        except ValueError as e:  # larger than the whole store: answered, not kept
            logger.warning("Response %s not stored: %s", self.id, e)


def _sampling(served: ServedModel, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling values a response reports: the request's, else the model's
    ``generation_config``, else vLLM's defaults; ``max_output_tokens`` the request's, else the
    engine's default cap."""
    defaults = served.engine.runtime.model_defaults if served.engine.started else {}
    layered = {"temperature": 1.0, "top_p": 1.0, "presence_penalty": 0.0,
               "frequency_penalty": 0.0, **defaults}  # fmt: skip
    for key in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        if kwargs.get(key) is not None:
            layered[key] = kwargs[key]
    max_tokens = kwargs.get("max_tokens") or DEFAULTS["max_tokens"]
    greedy = float(layered["temperature"]) < 1e-5  # vLLM's SamplingParams then sets top_p 1
    return {
        "temperature": float(layered["temperature"]),
        "top_p": 1.0 if greedy else float(layered["top_p"]),
        "presence_penalty": float(layered["presence_penalty"]),
        "frequency_penalty": float(layered["frequency_penalty"]),
        "max_output_tokens": int(max_tokens),
    }


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
    reasoning_parser: str | Mapping[str, str] | None = None,
) -> APIRouter:
    """The Responses routes for the chat models of ``models``, keeping responses in ``store()``;
    ``reasoning_parser``: vLLM's parser that makes reasoning items (one name, or by served
    model name)."""
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
        if previous is not None:
            stored = await asyncio.to_thread(lambda: store().get(str(previous)))
            if stored is None:
                return _not_found(str(previous), "previous_response_id")
            history = stored.messages
        tools = function_tools(body.get("tools"))
        kwargs = engine_kwargs(body, tools)
        if cap is not None and "max_tokens" not in kwargs:
            kwargs["max_tokens"] = min(cap, int(DEFAULTS["max_tokens"]))
        parser = (
            reasoning_parser.get(served.name)
            if isinstance(reasoning_parser, Mapping)
            else reasoning_parser
        )
        if parser is not None:
            kwargs["reasoning_parser"] = parser
        messages, new = conversation(body.get("input"), body.get("instructions"), history)
        try:  # the engine checks the values here, before any work
            deltas = served.engine.astream(messages, **kwargs)
        except BadRequestError as e:
            raise _input_named(e) from None
        turn = _Turn(body, served, kwargs, echoed_fields(body, kwargs), history, new)
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
        # Only a background response can be cancelled (vllm serve's rule), and this server
        # runs none: a stored response is finished.
        stored = await asyncio.to_thread(lambda: store().get(response_id))
        if stored is None:
            return _not_found(response_id, "response_id")
        return error_response(
            400, "Cannot cancel a synchronous response.", "response_id", _NOT_FOUND
        )

    return router


async def _whole(
    request: Request, turn: _Turn, deltas: AsyncIterator[Delta], store: Callable[[], ResponseStore]
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
    turn: _Turn, first: Delta, deltas: AsyncIterator[Delta], store: Callable[[], ResponseStore]
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
