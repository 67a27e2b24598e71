"""A Responses request body's fields as :meth:`Engine.astream
<vllm_inline.engine.Engine.astream>`'s keyword arguments, and the fields its response object
echoes: pure functions.

The fields are those of ``vllm serve``'s ``ResponsesRequest`` (vLLM 0.32: OpenAI's, then vLLM's
sampling extras), with its meanings: ``max_output_tokens`` is ``max_tokens``; ``text.format``
(``json_schema``, ``json_object``) becomes the engine's ``structured_outputs``; tools become chat
tools (:mod:`.tools`: namespaces flattened, custom tools as vLLM's shim, hosted tools dropped);
``reasoning.effort`` reaches the
chat template as ``reasoning_effort`` and ``enable_thinking``; ``include`` with
``message.output_text.logprobs`` asks for ``top_logprobs`` alternatives. What this package
cannot honour is refused with a 400 naming the field (``background`` without ``store``,
``prompt``, ``conversation``, ``truncation: "auto"``). The route ignores a field
neither request has (not in :data:`KNOWN_FIELDS`) with a log line, as ``vllm serve`` does, or
refuses it on a strict server (``Limits.strict_fields``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_inline.engine import BadRequestError
from vllm_inline.server.errors import InvalidBodyError
from vllm_inline.server.responses.tools import flat_name

__all__ = ["KNOWN_FIELDS", "echoed_fields", "engine_kwargs"]

# Sampling fields handed to the engine under the same name.
_SAMPLING = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "ignore_eos",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "priority",
)
# Read by the route or the converters, echoed, or without effect on a model in this process.
_OTHERS = (
    "model",
    "input",
    "instructions",
    "stream",
    "store",
    "previous_response_id",
    "max_output_tokens",
    "tools",
    "tool_choice",
    "text",
    "reasoning",
    "include",
    "top_logprobs",
    "logit_bias",
    "chat_template_kwargs",
    "structured_outputs",
    "include_reasoning",
    "metadata",
    "user",
    "service_tier",
    "truncation",
    "parallel_tool_calls",
    "max_tool_calls",
    "background",
    "prompt",
    "conversation",
    "request_id",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
    "stream_options",
)
KNOWN_FIELDS = frozenset((*_SAMPLING, *_OTHERS))
"""Every field of OpenAI's and vLLM's Responses requests; the route ignores others with a log
line, or refuses them on a strict server (as the chat routes)."""
_INCLUDABLE = (
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "message.input_image.image_url",
    "message.output_text.logprobs",
    "reasoning.encrypted_content",
)


def _tool_choice(choice: Any, tools: list[dict[str, Any]]) -> Any:
    """OpenAI's Responses ``tool_choice`` as the engine's (``"auto"``, ``"none"``,
    ``"required"`` or a tool's name)."""
    if choice is None:
        return "auto" if tools else "none"
    if isinstance(choice, Mapping):
        if choice.get("type") not in ("function", "custom") or not isinstance(
            choice.get("name"), str
        ):
            raise BadRequestError.invalid(
                "tool_choice",
                choice,
                "'auto', 'none', 'required' or {'type': 'function' or 'custom', 'name': ...}",
            )
        namespace = choice.get("namespace")
        choice = flat_name(namespace if isinstance(namespace, str) else None, choice["name"])
    if not tools and choice in ("auto", "none"):
        return "none"
    return choice


def _structured_outputs(body: Mapping[str, Any]) -> dict[str, Any] | None:
    text = body.get("text")
    if text is not None and not isinstance(text, Mapping):
        raise InvalidBodyError("body.text", "Input should be a valid dictionary")
    fmt = (text or {}).get("format")
    given = body.get("structured_outputs")
    if fmt is None or (isinstance(fmt, Mapping) and fmt.get("type") == "text"):
        return dict(given) if isinstance(given, Mapping) else given
    if given is not None:
        raise BadRequestError.invalid(
            "structured_outputs", given, "not both structured_outputs and text.format"
        )
    kind = fmt.get("type") if isinstance(fmt, Mapping) else None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, Mapping):
            raise InvalidBodyError("body.text.format.schema", "Field required")
        return {"json": dict(schema)}
    raise InvalidBodyError(
        "body.text.format.type", "Input should be 'text', 'json_object' or 'json_schema'"
    )


def _refuse_what_is_not_served(body: Mapping[str, Any]) -> None:
    if body.get("background") and body.get("store") is False:
        raise BadRequestError.invalid(
            "background", True, "background can only be used when `store` is true"
        )
    for name, why in (
        ("prompt", "prompt templates are not supported (as in vllm serve)"),
        ("conversation", "the Conversations API is not served; use previous_response_id"),
    ):
        if body.get(name):
            raise BadRequestError.invalid(name, body[name], why)
    if body.get("truncation") not in (None, "disabled"):
        raise BadRequestError.invalid(
            "truncation", body["truncation"], "'disabled' (an over-long input is a 400)"
        )
    include = body.get("include") or []
    if not isinstance(include, list) or any(i not in _INCLUDABLE for i in include):
        raise BadRequestError.invalid("include", include, f"a list of {list(_INCLUDABLE)}")


def engine_kwargs(body: Mapping[str, Any], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``Engine.astream`` keyword arguments for a ``/v1/responses`` body (the messages
    come from :func:`~.inputs.conversation`)."""
    _refuse_what_is_not_served(body)
    kwargs = {k: body[k] for k in _SAMPLING if body.get(k) is not None}
    if body.get("max_output_tokens") is not None:
        kwargs["max_tokens"] = body["max_output_tokens"]
    if body.get("logit_bias"):
        try:
            kwargs["logit_bias"] = {int(k): float(v) for k, v in body["logit_bias"].items()}
        except (AttributeError, TypeError, ValueError):
            raise BadRequestError.invalid(
                "logit_bias", body["logit_bias"], "a mapping of token ids to biases"
            ) from None
    choice = _tool_choice(body.get("tool_choice"), tools)
    if tools:
        kwargs["tools"] = tools
        kwargs["tool_choice"] = choice
        if body.get("parallel_tool_calls") is False:  # one call, constrained as in chat
            kwargs["parallel_tool_calls"] = False
    structured = _structured_outputs(body)
    if structured is not None:
        kwargs["structured_outputs"] = structured
    if "message.output_text.logprobs" in (body.get("include") or []):
        kwargs["logprobs"] = body.get("top_logprobs") or 0
    for name in ("chat_template_kwargs", "reasoning"):
        if body.get(name) is not None and not isinstance(body[name], Mapping):
            raise InvalidBodyError(f"body.{name}", "Input should be a valid dictionary")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise InvalidBodyError("body.parallel_tool_calls", "Input should be a valid boolean")
    template_kwargs = dict(body.get("chat_template_kwargs") or {})
    effort = (body.get("reasoning") or {}).get("effort")
    if effort is not None:
        # As vllm serve: the effort for templates that read it, and thinking on unless "none"
        # for templates that need it switched on (a template ignores variables it lacks).
        template_kwargs.setdefault("reasoning_effort", effort)
        template_kwargs.setdefault("enable_thinking", effort != "none")
    if template_kwargs:
        kwargs["chat_template_kwargs"] = template_kwargs
    return kwargs


def echoed_fields(body: Mapping[str, Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The request's fields a response object repeats, in ``vllm serve``'s order and shape."""
    tools = []
    for tool in body.get("tools") or ():
        if tool.get("type") != "function":
            tools.append(dict(tool))  # namespace, custom and hosted tools, as sent
            continue
        tools.append(
            {
                "name": tool["name"],
                "parameters": tool.get("parameters"),
                "strict": tool.get("strict"),
                "type": "function",
                "description": tool.get("description"),
            }
        )
    text = body.get("text")
    if isinstance(text, Mapping):
        fmt = text.get("format")
        if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema":
            fmt = {
                "name": fmt.get("name"),
                "schema": fmt.get("schema"),
                "type": "json_schema",
                "description": fmt.get("description"),
                "strict": fmt.get("strict"),
            }
        text = {"format": fmt, "verbosity": text.get("verbosity")}
    reasoning = body.get("reasoning")
    if isinstance(reasoning, Mapping):
        reasoning = {
            "effort": reasoning.get("effort"),
            "generate_summary": reasoning.get("generate_summary"),
            "summary": reasoning.get("summary"),
        }
    choice = body.get("tool_choice", "auto")
    if not tools and choice in ("auto", "none", None):
        choice = "none"
    return {
        "instructions": body.get("instructions"),
        "metadata": body.get("metadata"),
        "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
        "tool_choice": choice,
        "tools": tools,
        "background": bool(body.get("background")),
        "max_tool_calls": body.get("max_tool_calls"),
        "previous_response_id": body.get("previous_response_id"),
        "prompt": None,
        "reasoning": reasoning,
        "service_tier": body.get("service_tier") or "auto",
        "text": text,
        "top_logprobs": kwargs.get("logprobs"),
        "truncation": body.get("truncation") or "disabled",
        "user": body.get("user"),
    }
