"""An OpenAI request body as the engine's call: the names and shapes translated, the values left
for the engine to check (a bad one raises :class:`BadRequestError` naming it, a 400). A body
without the request's shape (no ``messages``, a tool that is no function) is refused here, as
``vllm serve``'s request model refuses it (:class:`~vllm_inline.server.errors.InvalidBodyError`).

Which field goes where is :mod:`vllm_inline.server.fields`' table. A field the table does not
have is ignored with one warning line, as ``vllm serve`` ignores it (its words), or refused
when the server is strict (``Limits.strict_fields``)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from vllm_inline.engine import BadRequestError
from vllm_inline.server.errors import InvalidBodyError
from vllm_inline.server.fields import fields_of, to_engine
from vllm_inline.server.limits import Limits

__all__ = ["IGNORED_FIELDS_LOG", "chat_kwargs", "check_fields", "completion_kwargs", "prompts_of"]

logger = logging.getLogger("vllm_inline.server")

IGNORED_FIELDS_LOG = "The following fields were present in the request but ignored: %s"
"""``vllm serve``'s words for the fields of a request it does not know (vLLM 0.30-0.34's
``OpenAIBaseModel``, which logs them at debug level; here a warning: a client's typo is worth
seeing)."""


def check_fields(body: Mapping[str, Any], route: str, limits: Limits) -> None:
    """Refuse what ``route``'s table refuses, and what only trusted clients may send; warn
    about (or, strict, refuse) fields the table does not have."""
    table = fields_of(route)
    unknown = sorted(set(body) - set(table))
    if unknown and limits.strict_fields:
        name = unknown[0]
        raise BadRequestError.invalid(
            name,
            body[name],
            "an unrecognized request argument (the server refuses unknown fields: "
            "Limits(strict_fields=True), --strict-fields)",
        )
    if unknown:
        logger.warning(IGNORED_FIELDS_LOG, set(unknown))
    for name, field in table.items():
        value = body.get(name)
        if field.kind == "refused" and value is not None and value != field.default:
            raise BadRequestError(
                f"{name}={value!r} is not supported by vllm-inline's server: {field.note}.",
                parameter=name,
                value=value,
            )
    template = body.get("chat_template")
    if template is None:
        template = (body.get("chat_template_kwargs") or {}).get("chat_template")
    if template is not None and not limits.trust_request_chat_template:
        raise BadRequestError(
            "Chat template is passed with request, but the server does not trust request chat "
            "templates (Limits(trust_request_chat_template=True), "
            "--trust-request-chat-template). Refused request with untrusted chat template.",
            parameter="chat_template",
            value=template,
        )
    for name in ("mm_processor_kwargs", "media_io_kwargs"):
        if body.get(name) and not limits.trust_request_mm_kwargs:
            raise BadRequestError(
                f"Per-request {name} are refused because they can change how much multimodal "
                "work a request costs: start the server with Limits(trust_request_mm_kwargs="
                "True) (--trust-request-mm-kwargs) only when clients are trusted.",
                parameter=name,
                value=body[name],
            )


def _common(body: Mapping[str, Any], route: str) -> dict[str, Any]:
    kwargs = {k: body[k] for k in to_engine(route) if body.get(k) is not None}
    # max_completion_tokens replaced max_tokens in OpenAI's API; both are still sent.
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    if max_tokens is not None:
        kwargs["max_tokens"] = max_tokens
    if body.get("logit_bias"):
        try:  # JSON keys are strings; vLLM wants token ids
            kwargs["logit_bias"] = {int(k): float(v) for k, v in body["logit_bias"].items()}
        except (AttributeError, TypeError, ValueError):
            raise BadRequestError.invalid(
                "logit_bias", body["logit_bias"], "a mapping of token ids to biases"
            ) from None
    response_format = body.get("response_format") or {"type": "text"}
    kind = response_format.get("type") if isinstance(response_format, Mapping) else None
    overrides: dict[str, Any] = {}
    if kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        overrides = {"json": schema or {"type": "object"}}
    elif kind == "json_object":
        overrides = {"json_object": True}
    elif kind == "structural_tag":
        overrides = {"structural_tag": json.dumps(response_format)}
    elif kind != "text":
        raise BadRequestError.invalid(
            "response_format",
            response_format,
            "{'type': 'text' | 'json_object' | 'json_schema' | 'structural_tag'}",
        )
    if overrides:
        # As vLLM's structured_outputs_from_response_format: response_format wins over the
        # same fields of structured_outputs, the others stay.
        given = body.get("structured_outputs")
        kwargs["structured_outputs"] = {
            **(given if isinstance(given, Mapping) else {}),
            **overrides,
        }
    return kwargs


def _check_tools(tools: Any) -> None:
    """``tools`` as ``vllm serve``'s request model takes them: a list of
    ``{"type": "function", "function": {"name": str, "parameters": dict | None, ...}}``."""
    if tools is None:
        return
    if not isinstance(tools, list):
        raise InvalidBodyError("body.tools", "Input should be a valid list")
    for i, tool in enumerate(tools):
        place = f"body.tools.{i}"
        if not isinstance(tool, Mapping):
            raise InvalidBodyError(place, "Input should be a valid dictionary")
        if tool.get("type", "function") != "function":
            raise InvalidBodyError(f"{place}.type", "Input should be 'function'")
        function = tool.get("function")
        if not isinstance(function, Mapping):
            problem = "Field required" if function is None else "Input should be a valid dictionary"
            raise InvalidBodyError(f"{place}.function", problem)
        name = function.get("name")
        if not isinstance(name, str):
            problem = "Field required" if name is None else "Input should be a valid string"
            raise InvalidBodyError(f"{place}.function.name", problem)
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, Mapping):
            raise InvalidBodyError(
                f"{place}.function.parameters", "Input should be a valid dictionary"
            )


def _check_stream_options(body: Mapping[str, Any]) -> None:
    """``stream_options`` only with ``stream``, as vLLM's request models check it."""
    if body.get("stream_options") and not body.get("stream"):
        raise BadRequestError(
            "Stream options can only be defined when `stream=True`.",
            parameter="stream_options",
            value=body["stream_options"],
        )


def chat_kwargs(body: Mapping[str, Any], limits: Limits | None = None) -> dict[str, Any]:
    """The ``Engine.astream`` keyword arguments for a ``/v1/chat/completions`` body."""
    if "messages" not in body:
        raise InvalidBodyError("body.messages", "Field required")
    _check_tools(body.get("tools"))
    check_fields(body, "chat", limits or Limits())
    _check_stream_options(body)
    if body.get("tools") is None and body.get("tool_choice") not in (None, "none"):
        # As vLLM's request model: a choice among no tools is a client's mistake, not a no-op.
        raise BadRequestError(
            "When using `tool_choice`, `tools` must be set.",
            parameter="tool_choice",
            value=body["tool_choice"],
        )
    kwargs = _common(body, "chat")
    if not body.get("tools"):  # `tools: []` is no tools (vLLM 0.34 takes it so; 0.32 refuses)
        kwargs.pop("tool_choice", None)
    if body.get("logprobs"):
        kwargs["logprobs"] = body.get("top_logprobs") or 0
    else:
        for name in ("logprob_token_ids", "top_logprobs"):
            if body.get(name):  # as vLLM's check_logprobs
                raise BadRequestError(
                    f"when using `{name}`, `logprobs` must be set to true.",
                    parameter=name,
                    value=body[name],
                )
    return kwargs


def completion_kwargs(body: Mapping[str, Any], limits: Limits | None = None) -> dict[str, Any]:
    """The ``Engine.astream`` keyword arguments for a ``/v1/completions`` body (without the
    prompt: each prompt of the body is a request of its own)."""
    check_fields(body, "completion", limits or Limits())
    _check_stream_options(body)
    kwargs = _common(body, "completion")
    logprobs = body.get("logprobs")
    if logprobs is not None:
        if isinstance(logprobs, bool) or not isinstance(logprobs, int) or logprobs < 0:
            raise BadRequestError.invalid("logprobs", logprobs, "an integer >= 0 (top logprobs)")
        kwargs["logprobs"] = logprobs
    elif body.get("logprob_token_ids"):
        raise BadRequestError(
            "when using `logprob_token_ids`, `logprobs` must be set.",
            parameter="logprob_token_ids",
            value=body["logprob_token_ids"],
        )
    if body.get("echo") and body.get("suffix") is not None:
        raise BadRequestError("Echo is unsupported with suffix.", parameter="suffix")
    if body.get("echo") and kwargs.get("prompt_logprobs") is None and logprobs is not None:
        kwargs["prompt_logprobs"] = logprobs  # as vLLM: echoed text comes with its logprobs
    return kwargs


def prompts_of(body: Mapping[str, Any]) -> list[str | list[int]]:
    """The body's ``prompt``: a string, a list of strings, a list of token ids or a list of
    those, as ``vllm serve`` takes it; one request each."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if all(_token_ids(p) for p in prompt):
            return [list(p) for p in prompt]
        if _token_ids(prompt):
            return [list(prompt)]
    raise BadRequestError.invalid(
        "prompt",
        prompt,
        "a string, a non-empty list of strings, a list of token ids, or a list of those",
    )


def _token_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
    )
