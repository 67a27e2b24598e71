"""Errors on the wire, in ``vllm serve``'s shape: ``{"error": {"message", "type", "param",
"code"}}`` with the HTTP status as ``code`` and vLLM's name for it as ``type``
(``BadRequestError``, ``NotFoundError``, ...), which OpenAI clients read as they read OpenAI's
own. As in ``vllm serve``, a body that does not have the request's shape (not JSON, a required
field missing, a tool without a function name) is ``"type": "Bad Request"`` with the field's
place in the body as ``param`` (``body.tools.0.function``): FastAPI's validation error there;
a bad value in a well-formed body is ``BadRequestError``."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from vllm_inline.engine import (
    BadRequestError,
    EngineBusyError,
    EngineUnavailableError,
    GenerationFailedError,
    RequestTimeoutError,
)

__all__ = [
    "InvalidBodyError",
    "error_body",
    "error_response",
    "install_error_handlers",
    "status_of",
]

_TYPES = {
    400: "BadRequestError",
    401: "Unauthorized",
    404: "NotFoundError",
    413: "Request Entity Too Large",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


BODY_ERROR_TYPE = HTTPStatus.BAD_REQUEST.phrase
"""``"Bad Request"``: the ``type`` of a body that does not validate, as ``vllm serve`` has it."""


class InvalidBodyError(BadRequestError):
    """The body does not have the request's shape (400, ``"type": "Bad Request"``);
    ``parameter`` is the field's place in the body, ``body.tools.0.function.name``."""

    def __init__(self, place: str, problem: str) -> None:
        super().__init__(f"{place}: {problem}", parameter=place)


def error_body(
    status: int, message: str, param: str | None = None, kind: str | None = None
) -> dict[str, Any]:
    """The error object ``vllm serve`` sends (also inside a stream, as its last event)."""
    kind = kind or _TYPES.get(status) or HTTPStatus(status).phrase
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error_response(
    status: int, message: str, param: str | None = None, kind: str | None = None
) -> JSONResponse:
    """:func:`error_body` as a response with ``status``."""
    return JSONResponse(error_body(status, message, param, kind), status_code=status)


def status_of(error: Exception) -> int:
    """The HTTP status of one of the engine's typed errors."""
    if isinstance(error, (EngineBusyError, EngineUnavailableError)):
        return 503
    if isinstance(error, RequestTimeoutError):
        return 504
    if isinstance(error, BadRequestError):
        return 400
    return 500


def install_error_handlers(app: FastAPI) -> None:
    """The engine's typed errors, and FastAPI's own validation errors, as :func:`error_body`."""

    async def typed(request: Request, e: Exception) -> JSONResponse:
        kind = BODY_ERROR_TYPE if isinstance(e, InvalidBodyError) else None
        return error_response(status_of(e), str(e), getattr(e, "parameter", None), kind)

    async def invalid(request: Request, e: Exception) -> JSONResponse:
        errors = e.errors() if isinstance(e, RequestValidationError) else []
        first = errors[0] if errors else {}
        param = ".".join(str(p) for p in first.get("loc", ())) or None
        return error_response(400, str(first.get("msg") or e), param, BODY_ERROR_TYPE)

    for kind in (
        BadRequestError,
        EngineUnavailableError,
        GenerationFailedError,
        RequestTimeoutError,
    ):
        app.add_exception_handler(kind, typed)
    app.add_exception_handler(RequestValidationError, invalid)
