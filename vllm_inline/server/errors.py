"""Errors on the wire, in ``vllm serve``'s shape: ``{"error": {"message", "type", "param",
"code"}}`` with the HTTP status as ``code`` and its phrase as ``type`` (``BadRequestError``,
``NotFoundError``, ...), which OpenAI clients read as they read OpenAI's own."""

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

__all__ = ["error_body", "error_response", "install_error_handlers", "status_of"]

_TYPES = {
    400: "BadRequestError",
    401: "Unauthorized",
    404: "NotFoundError",
    413: "Request Entity Too Large",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """The error object ``vllm serve`` sends (also inside a stream, as its last event)."""
    kind = _TYPES.get(status) or HTTPStatus(status).phrase
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    """:func:`error_body` as a response with ``status``."""
    return JSONResponse(error_body(status, message, param), status_code=status)


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
        return error_response(status_of(e), str(e), getattr(e, "parameter", None))

    async def invalid(request: Request, e: Exception) -> JSONResponse:
        errors = e.errors() if isinstance(e, RequestValidationError) else []
        first = errors[0] if errors else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return error_response(400, str(first.get("msg") or e), param)

    for kind in (
        BadRequestError,
        EngineUnavailableError,
        GenerationFailedError,
        RequestTimeoutError,
    ):
        app.add_exception_handler(kind, typed)
    app.add_exception_handler(RequestValidationError, invalid)
