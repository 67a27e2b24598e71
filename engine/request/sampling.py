"""Sampling values: package defaults, the model's generation_config, the caller's; and checks.

Layering, lowest first: :data:`DEFAULTS` < the model's ``generation_config`` sampling values
(``AsyncLLM`` does not apply them by itself) < values of the integration object < per-call
values < what the request's output parsers need (a tool parser that reads special tokens:
``skip_special_tokens=False``), which wins as it does in vLLM's server, where the parser's
``adjust_request`` sets the request's field whatever the client sent. The text a caller gets
still follows its own ``skip_special_tokens`` (:func:`special_tokens_hidden`): the output
parsers remove the special tokens it would have hidden from the text and reasoning they return.
:func:`final_sampling` does that layering for one request and adds what the engine decides
(the room left in the context window, the stop policy's token ids).

:func:`check_sampling` refuses bad values with the parameter's name when a call is made (or an
integration object is built), before the engine starts. It restates a few of vLLM's
``SamplingParams`` range checks on purpose: ``SamplingParams`` only exists once vLLM is imported,
which happens on the engine's loop thread at start (see :mod:`vllm_inline.engine.life.runtime`), and
a bad ``temperature`` should not cost an engine start to be refused. vLLM's own checks run again
when the request is sent and are mapped to the same error type.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

from vllm_inline.engine.errors import BadRequestError

__all__ = [
    "DEFAULTS",
    "check_sampling",
    "final_sampling",
    "layer_sampling",
    "special_tokens_hidden",
]

DEFAULTS: Mapping[str, Any] = {"max_tokens": 512, "repetition_penalty": 1.1}
"""vllm-inline's own defaults, under everything else."""


def layer_sampling(*layers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Merge sampling layers, later ones winning; ``None`` values mean "not set"."""
    merged: dict[str, Any] = {}
    for layer in layers:
        for key, value in (layer or {}).items():
            if value is not None:
                merged[key] = value
    return merged


def _number(
    name: str, value: Any, lo: float | None, hi: float | None, *, lo_open: bool = False
) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise BadRequestError.invalid(name, value, "a finite number")
    number = float(value)
    too_low = lo is not None and (number <= lo if lo_open else number < lo)
    too_high = hi is not None and number > hi
    if too_low or too_high:
        left = "(" if lo_open else "["
        raise BadRequestError.invalid(name, value, f"must be in {left}{lo}, {hi}]")


_INT64_MAX = 2**63 - 1
"""The largest integer vLLM's engine core takes (its messages carry 64-bit integers)."""


def _integer(name: str, value: Any, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise BadRequestError.invalid(name, value, "an integer")
    if value < lo:
        raise BadRequestError.invalid(name, value, f"must be >= {lo}")
    if int(value) > _INT64_MAX:
        raise BadRequestError.invalid(name, value, f"must be <= {_INT64_MAX}")


def _stop(value: Any) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) and s for s in items):
        raise BadRequestError.invalid(
            "stop", value, "a non-empty string or a list of non-empty strings"
        )
    return list(items)


def check_sampling(
    values: Mapping[str, Any], *, max_model_len: int | None = None
) -> dict[str, Any]:
    """Check the values vllm-inline knows and return them normalised (``stop`` as a list)."""
    out = dict(values)
    checks: dict[str, Callable[[Any], None]] = {
        "temperature": lambda v: _number("temperature", v, 0.0, 2.0),
        "top_p": lambda v: _number("top_p", v, 0.0, 1.0, lo_open=True),
        "min_p": lambda v: _number("min_p", v, 0.0, 1.0),
        "repetition_penalty": lambda v: _number("repetition_penalty", v, 0.0, None, lo_open=True),
        "presence_penalty": lambda v: _number("presence_penalty", v, -2.0, 2.0),
        "frequency_penalty": lambda v: _number("frequency_penalty", v, -2.0, 2.0),
        "top_k": lambda v: _integer("top_k", v, -1),
        "max_tokens": lambda v: _integer("max_tokens", v, 1),
        "min_tokens": lambda v: _integer("min_tokens", v, 0),
        "n": lambda v: _integer("n", v, 1),
        "seed": lambda v: _integer("seed", v, -(2**63)),
        # vLLM's own default is None (the engine's --stream-interval); it compares with < 1.
        "stream_interval": lambda v: None if v is None else _integer("stream_interval", v, 1),
    }
    for key, check in checks.items():
        if key in out:
            check(out[key])
    if "stop" in out:
        out["stop"] = _stop(out["stop"])
    if "logprobs" in out:
        logprobs = out["logprobs"]
        if isinstance(logprobs, bool):
            out["logprobs"] = 0 if logprobs else None
        else:
            _integer("logprobs", logprobs, 0)
    if max_model_len is not None and out.get("max_tokens", 0) > max_model_len:
        raise BadRequestError.invalid(
            "max_tokens",
            out["max_tokens"],
            f"larger than the model's context window ({max_model_len} tokens)",
        )
    return out


def special_tokens_hidden(call: Mapping[str, Any], model_defaults: Mapping[str, Any]) -> bool:
    """Whether the caller asked for special tokens to be left out of the text: its own
    ``skip_special_tokens``, else the model's ``generation_config`` value, else vLLM's default
    (``True``). When a parser's need turned it off for the engine, the parsers hide them again."""
    value = layer_sampling({"skip_special_tokens": True}, model_defaults, call)
    return bool(value["skip_special_tokens"])


def final_sampling(
    call: Mapping[str, Any],
    *,
    model_defaults: Mapping[str, Any],
    parser_needs: Mapping[str, Any] | None = None,
    stop_token_ids: tuple[int, ...],
    max_model_len: int,
    prompt_tokens: int,
) -> dict[str, Any]:
    """The sampling values sent for one request: :data:`DEFAULTS` < ``model_defaults`` <
    ``call`` < ``parser_needs``, ``max_tokens`` capped to the room left after the prompt, and the
    stop policy's ``stop_token_ids`` added (unless ``ignore_eos``).

    ``parser_needs`` wins as in vLLM's server, where a parser's ``adjust_request`` sets the
    request's field over what the client sent, and the model's ``generation_config`` only fills
    it when unset (vLLM 0.33 reads ``skip_special_tokens`` from it too). Parsers that read special
    tokens need them in the text they parse: vLLM 0.34's ``llama3_json`` matches
    ``<|python_tag|>`` by token id and by text; given the ids without the text, it found the
    call only once the output ended, not as it streamed (0.34's parser tried over 0.32 here).
    """
    values = layer_sampling(DEFAULTS, model_defaults, call, parser_needs)
    values["max_tokens"] = min(values["max_tokens"], max_model_len - prompt_tokens)
    if values["max_tokens"] < 1:
        raise BadRequestError(
            f"The prompt fills the whole context window ({prompt_tokens} of "
            f"{max_model_len} tokens): no room to generate. Shorten the messages.",
            parameter="messages",
            value=prompt_tokens,
        )
    if not values.get("ignore_eos"):
        # ignore_eos (fixed-length benchmarks) turns off the end-of-turn policy too.
        values["stop_token_ids"] = list(
            dict.fromkeys([*stop_token_ids, *values.get("stop_token_ids", ())])
        )
    return values
