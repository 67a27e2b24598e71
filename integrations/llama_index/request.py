"""The engine arguments of one ``VLLM`` call: the LLM's fields under the call's keyword
arguments.

:func:`request_kwargs` is ``VLLM``'s one request builder, as ``request_kwargs`` of the LangChain
integration is ``ChatVLLM``'s: sampling values layered field, ``additional_kwargs``, call (unset
ones dropped), then the request options (template, parsers, LoRA, timeout, priority, tools,
structured outputs) layered likewise. It checks only what is this integration's to check
(``stop`` given twice, ``n``); the engine checks the rest when the request is handed over,
before anything starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_inline.engine import BadRequestError
from vllm_inline.engine.request.sampling import layer_sampling

__all__ = ["REQUEST_FIELDS", "REQUEST_OPTIONS", "SAMPLING_FIELDS", "request_kwargs"]

SAMPLING_FIELDS = ("temperature", "max_tokens", "top_p", "repetition_penalty", "stop")
"""``VLLM``'s sampling fields."""

REQUEST_FIELDS = (
    "chat_template",
    "chat_template_kwargs",
    "tool_parser",
    "reasoning_parser",
    "lora",
    "timeout",
    "priority",
    "reasoning_effort",
)
"""``VLLM``'s request fields: engine options that are not sampling values."""

REQUEST_OPTIONS = ("tools", "tool_choice", "structured_outputs", *REQUEST_FIELDS)
"""A call's keyword arguments that are request options (the others are sampling values)."""


def request_kwargs(
    sampling: Mapping[str, Any],
    options: Mapping[str, Any],
    additional: Mapping[str, Any],
    call: Mapping[str, Any],
) -> dict[str, Any]:
    """The engine keyword arguments of one call: the LLM's ``sampling`` fields and
    ``additional`` sampling values, its request ``options``, each overridden by the ``call``'s
    keyword arguments; ``None`` values dropped, except that a call's ``lora=None`` means the
    base model whatever the LLM's ``lora``.

    ``stop`` set both on the LLM and in the call, and ``n`` other than 1, are refused
    (:class:`~vllm_inline.engine.BadRequestError`).
    """
    call = dict(call)
    if call.get("stop") is not None and sampling.get("stop") is not None:
        raise BadRequestError(
            "stop was given both to VLLM(...) and to this call; pass it one way.",
            parameter="stop",
            value=call["stop"],
        )
    call_options = {k: call.pop(k) for k in REQUEST_OPTIONS if k in call}
    layered = layer_sampling(sampling, additional, call)
    if layered.get("n", 1) != 1:
        raise BadRequestError.invalid("n", layered["n"], "VLLM returns one answer: n must be 1")
    request = layer_sampling(options, call_options, layered)
    if "lora" in call_options and call_options["lora"] is None:
        request.pop("lora", None)  # a call's lora=None: the base model, whatever the field
    return request
