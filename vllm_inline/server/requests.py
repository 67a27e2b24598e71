"""An OpenAI request body as the engine's call: the names and shapes translated, the values left
for the engine to check (a bad one raises :class:`BadRequestError` naming it, a 400). A body
without the request's shape (no ``messages``, a tool that is no function) is refused here, as
``vllm serve``'s request model refuses it (:class:`~vllm_inline.server.errors.InvalidBodyError`).

Which field goes where is :mod:`vllm_inline.server.fields`' table. A field the table does not
have is ignored, as ``vllm serve`` ignores it, with a line in its words (a warning the first
time a set of such names is seen, then at debug level: :func:`check_unknown`), or refused when
the server is strict (``Limits.strict_fields``)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Collection, Mapping
from typing import Any

from vllm_inline.engine import BadRequestError
from vllm_inline.engine.request.request import is_token_ids
from vllm_inline.server.errors import InvalidBodyError
from vllm_inline.server.fields import fields_of, refused_fields, to_engine
from vllm_inline.server.limits import Limits

__all__ = [
    "IGNORED_FIELDS_LOG",
    "WARNED_SETS",
    "chat_kwargs",
    "check_fields",
    "check_request_id",
    "check_unknown",
    "completion_kwargs",
    "echo_without_generation",
    "prompts_of",
]

logger = logging.getLogger("vllm_inline.server")

IGNORED_FIELDS_LOG = "The following fields were present in the request but ignored: %s"
"""``vllm serve``'s words for the fields of a request it does not know (vLLM 0.30-0.34's
``OpenAIBaseModel``, which logs them at debug level; here a warning the first time a set of
names is seen: a client's typo is worth seeing once, not on every request)."""

WARNED_SETS = 256
"""How many distinct sets of unknown names are remembered (each warned about once); past that,
every new set is logged at debug level too, so that a client sending ever new names cannot
flood the log or grow the memory."""

_warned: set[frozenset[str]] = set()
_warned_lock = threading.Lock()


def check_unknown(body: Mapping[str, Any], known: Collection[str], limits: Limits) -> None:
    """The body's fields not in ``known``: refused on a strict server (``--strict-fields``),
    else ignored with :data:`IGNORED_FIELDS_LOG` (at warning level the first time that set of
    names is seen, then at debug level)."""
    unknown = sorted(name for name in body if name not in known)
    if not unknown:
        return
    if limits.strict_fields:
        name = unknown[0]
        raise BadRequestError.invalid(
            name,
            body[name],
            "an unrecognized request argument (the server refuses unknown fields: "
            "Limits(strict_fields=True), --strict-fields)",
        )
    names = frozenset(unknown)
    with _warned_lock:
        first = names not in _warned and len(_warned) < WARNED_SETS
        if first:
            _warned.add(names)
    logger.log(logging.WARNING if first else logging.DEBUG, IGNORED_FIELDS_LOG, set(unknown))


def check_request_id(body: Mapping[str, Any]) -> None:
    """``request_id``, when sent, is a string (a 400 otherwise, as vLLM's request models)."""
    given = body.get("request_id")
    if given is not None and not isinstance(given, str):
        raise InvalidBodyError("body.request_id", "Input should be a valid string")


def check_fields(body: Mapping[str, Any], route: str, limits: Limits) -> None:
    """Refuse what ``route``'s table refuses, and what only trusted clients may send; warn
    about (or, strict, refuse) fields the table does not have."""
    check_unknown(body, fields_of(route), limits)
    for name, field in refused_fields(route):
        value = body.get(name)
        if value is not None and value != field.default:
            raise BadRequestError(
                f"{name}={value!r} is not supported by vllm-inline's server: {field.note}.",
                parameter=name,
                value=value,
            )
    check_request_id(body)
    template_kwargs = body.get("chat_template_kwargs")
    if template_kwargs is not None and not isinstance(template_kwargs, Mapping):
        raise InvalidBodyError("body.chat_template_kwargs", "Input should be a valid dictionary")
    template = body.get("chat_template")
    if template is None:
        template = (template_kwargs or {}).get("chat_template")
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
    given = body.get("structured_outputs")
    if given is not None and not isinstance(given, Mapping):  # even beside a response_format
        raise InvalidBodyError("body.structured_outputs", "Input should be a valid dictionary")
    response_format = body.get("response_format") or {"type": "text"}
    kind = response_format.get("type") if isinstance(response_format, Mapping) else None
    overrides: dict[str, Any] = {}
    if kind == "json_schema":
        overrides = {"json": _json_schema(response_format)}
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
        kwargs["structured_outputs"] = {**(given or {}), **overrides}
    return kwargs


def _json_schema(response_format: Mapping[str, Any]) -> dict[str, Any]:
    """The schema of a ``json_schema`` ``response_format``, as vLLM's request model takes it
    (its ``json_schema`` required, a mapping whose ``schema`` is the constraint)."""
    spec = response_format.get("json_schema")
    if spec is None:
        raise BadRequestError(
            "When response_format type is 'json_schema', the 'json_schema' field must be provided.",
            parameter="response_format",
            value=dict(response_format),
        )
    if not isinstance(spec, Mapping):
        raise InvalidBodyError(
            "body.response_format.json_schema", "Input should be a valid dictionary"
        )
    schema = spec.get("schema")
    if not isinstance(schema, Mapping):
        # vLLM's structured outputs then have no constraint, which it refuses.
        problem = "Field required" if schema is None else "Input should be a valid dictionary"
        raise InvalidBodyError("body.response_format.json_schema.schema", problem)
    return dict(schema)


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
    """``stream_options`` a mapping, and only with ``stream``, as vLLM's request models check
    it."""
    options = body.get("stream_options")
    if options is not None and not isinstance(options, Mapping):
        raise InvalidBodyError("body.stream_options", "Input should be a valid dictionary")
    if options and not body.get("stream"):
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
        if not body.get("logprob_token_ids"):
            kwargs["logprobs"] = body.get("top_logprobs") or 0
        # else as vLLM's to_sampling_params: no count, the engine returns the ids' logprobs
        # (SamplingParams refuses a count other than len(logprob_token_ids)).
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
        if not body.get("logprob_token_ids"):  # as in chat_kwargs
            kwargs["logprobs"] = logprobs
    elif body.get("logprob_token_ids"):
        raise BadRequestError(
            "when using `logprob_token_ids`, `logprobs` must be set.",
            parameter="logprob_token_ids",
            value=body["logprob_token_ids"],
        )
    if body.get("echo") and body.get("suffix") is not None:
        raise BadRequestError("Echo is unsupported with suffix.", parameter="suffix")
    if echo_without_generation(body):
        if body.get("logprob_token_ids"):
            raise BadRequestError(
                "`logprob_token_ids` is not supported when `echo=True` and `max_tokens=0` "
                "because no output tokens are generated.",
                parameter="logprob_token_ids",
                value=body["logprob_token_ids"],
            )
        # As vLLM: one token is generated (an engine request generates at least one), the
        # answer is the prompt alone (lm-evaluation-harness' loglikelihood requests).
        kwargs["max_tokens"] = 1
    if body.get("echo") and kwargs.get("prompt_logprobs") is None and logprobs is not None:
        kwargs["prompt_logprobs"] = logprobs  # as vLLM: echoed text comes with its logprobs
    return kwargs


def echo_without_generation(body: Mapping[str, Any]) -> bool:
    """A completion that asks for its prompt back and nothing else (``echo`` with
    ``max_tokens: 0``), as vLLM's completion request names it."""
    max_tokens = body.get("max_tokens")
    return bool(body.get("echo")) and max_tokens == 0 and not isinstance(max_tokens, bool)


def prompts_of(body: Mapping[str, Any]) -> list[str | list[int]]:
    """The body's ``prompt``: a string, a list of strings, a list of token ids or a list of
    those, as ``vllm serve`` takes it; one request each."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if all(isinstance(p, list) and is_token_ids(p) for p in prompt):
            return [list(p) for p in prompt]
        if is_token_ids(prompt):
            return [list(prompt)]
    raise BadRequestError.invalid(
        "prompt",
        prompt,
        "a string, a non-empty list of strings, a list of token ids, or a list of those",
    )
