"""An OpenAI request body as the engine's call: the names and shapes translated, the values left
for the engine to check (a bad one raises :class:`BadRequestError` naming it, a 400). A body
without the request's shape (no ``messages``, a tool that is no function) is refused here, as
``vllm serve``'s request model refuses it (:class:`~vllm_inline.server.errors.InvalidBodyError`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_inline.engine import BadRequestError
from vllm_inline.server.errors import InvalidBodyError

__all__ = ["chat_kwargs", "completion_kwargs", "prompts_of"]

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
    "skip_special_tokens",
    "include_stop_str_in_output",
    "priority",
)
# Read by the route itself, or OpenAI fields with no effect on a model in this process.
IGNORED = (
    "model",
    "stream",
    "stream_options",
    "user",
    "store",
    "metadata",
    "service_tier",
    "parallel_tool_calls",
    "prompt_cache_key",
    "safety_identifier",
    "request_id",
)
# Translated below.
HANDLED = (
    "max_tokens",
    "max_completion_tokens",
    "response_format",
    "logit_bias",
)
CHAT_ONLY = ("messages", "tools", "tool_choice", "logprobs", "top_logprobs", "chat_template_kwargs")
COMPLETION_ONLY = ("prompt", "echo", "suffix", "best_of", "logprobs")


def _common(body: Mapping[str, Any], own: tuple[str, ...]) -> dict[str, Any]:
    unknown = sorted(set(body) - {*OPENAI_SAMPLING, *VLLM_EXTRAS, *IGNORED, *HANDLED, *own})
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


def chat_kwargs(body: Mapping[str, Any]) -> dict[str, Any]:
    """The ``Engine.astream`` keyword arguments for a ``/v1/chat/completions`` body."""
    if "messages" not in body:
        raise InvalidBodyError("body.messages", "Field required")
    _check_tools(body.get("tools"))
    kwargs = _common(body, CHAT_ONLY)
    if body.get("tools"):
        kwargs["tools"] = body["tools"]
        kwargs["tool_choice"] = body.get("tool_choice")
    if body.get("logprobs"):
        kwargs["logprobs"] = body.get("top_logprobs") or 0
    if body.get("chat_template_kwargs") is not None:
        kwargs["chat_template_kwargs"] = body["chat_template_kwargs"]
    return kwargs


def completion_kwargs(body: Mapping[str, Any]) -> dict[str, Any]:
    """The ``Engine.astream`` keyword arguments for a ``/v1/completions`` body (without the
    prompt: each prompt of the body is a request of its own)."""
    for name in ("echo", "suffix", "logprobs"):
        if body.get(name):
            raise BadRequestError.invalid(name, body[name], "not supported by vllm-inline")
    if body.get("best_of") not in (None, 1):
        raise BadRequestError.invalid("best_of", body["best_of"], "1 (vLLM has no best_of)")
    return _common(body, COMPLETION_ONLY)


def prompts_of(body: Mapping[str, Any]) -> list[str]:
    """The body's ``prompt``: one string or a list of strings."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return list(prompt)
    raise BadRequestError.invalid("prompt", prompt, "a string or a non-empty list of strings")
