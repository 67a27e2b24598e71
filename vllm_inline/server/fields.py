"""The field table: every field of ``vllm serve``'s chat and completion requests (vLLM 0.30-0.34,
``ChatCompletionRequest`` and ``CompletionRequest``) and what this server does with it.

One place, read by :mod:`vllm_inline.server.requests` (which fields reach the engine under
their own name, which are refused unless left at their default) and compared by
``tests/test_server_fields.py`` with vLLM's request models: a field vLLM adds and this table
does not classify fails that test, and the table in docs/server.md is generated from here.

Kinds, each a way the field keeps vLLM's meaning:

- ``sampling``: handed to the engine under its name, a ``SamplingParams`` value in vLLM;
- ``prompt``: handed to the engine under its name, how vLLM's renderer builds the prompt
  (:mod:`vllm_inline.engine.request.prompt_options`);
- ``request``: handed to the engine under its name, a request option of the engine;
- ``route``: read by the route (the response's shape, the model, streaming);
- ``no effect``: taken and left alone, because it has none here (said why);
- ``refused``: a 400 naming it when set to anything but its default, because this package
  cannot honour it (said why).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

__all__ = [
    "ALL_RELEASES",
    "ENGINE_KINDS",
    "KINDS",
    "OPENAI_ONLY",
    "TABLE",
    "Field",
    "fields_of",
    "refused_fields",
    "to_engine",
]

KINDS = ("sampling", "prompt", "request", "route", "no effect", "refused")
"""The kinds a field can be (the module's docstring says what each means)."""
ALL_RELEASES = "0.30-0.34"
"""The releases of a field that every supported vLLM's requests have (:attr:`Field.releases`'
default)."""
OPENAI_ONLY = "none (OpenAI's)"
"""The releases of a field that is OpenAI's and no vLLM request's: clients send it, vLLM
ignores it."""


@dataclass(frozen=True)
class Field:
    """What the server does with one request field."""

    kind: str
    """One of :data:`KINDS`."""
    note: str
    """What it does (or why not), for docs/server.md."""
    routes: tuple[str, ...] = ("chat", "completion")
    """The requests that have it: ``chat`` (``/v1/chat/completions``), ``completion``."""
    default: Any = None
    """For ``refused``: the value that is taken (any other is refused)."""
    releases: str = ALL_RELEASES
    """The vLLM releases whose requests have it (checked: 0.30, 0.31, 0.32, 0.33, 0.34)."""


CHAT, COMPLETION = ("chat",), ("completion",)
"""The routes of a field that only one of the two requests has."""
_SAMPLING = "to vLLM's `SamplingParams`"
_RENDER_ONLY = "read only by vLLM's `/render` endpoints; ignored on generation there too"

TABLE: Mapping[str, Field] = {
    # -- the request itself --
    "model": Field("route", "picks the served model (404 naming it when not served)"),
    "messages": Field("request", "the chat, checked, rendered by the model's template", CHAT),
    "prompt": Field(
        "request", "text or token ids, or a list of either: one request each", COMPLETION
    ),
    "stream": Field("route", "server-sent events"),
    "stream_options": Field(
        "route", "`include_usage`: the usage chunk (a 400 without `stream`, as in vLLM)"
    ),
    "request_id": Field(
        "route",
        "the response's id (`chatcmpl-<request_id>`, `cmpl-...`) unless the `X-Request-Id` "
        "header gives one, as in vLLM",
    ),
    "user": Field("no effect", "OpenAI's end-user label; vLLM ignores it too"),
    "session_id": Field(
        "request",
        "the engine's `session_id`: a label on vLLM's KV-cache events (cache-aware routers)",
    ),
    # -- OpenAI's sampling fields --
    "temperature": Field("sampling", _SAMPLING),
    "top_p": Field("sampling", _SAMPLING),
    "seed": Field("sampling", _SAMPLING),
    "stop": Field("sampling", _SAMPLING),
    "n": Field("sampling", f"{_SAMPLING} (capped by `Limits.max_n`)"),
    "presence_penalty": Field("sampling", _SAMPLING),
    "frequency_penalty": Field("sampling", _SAMPLING),
    "logit_bias": Field("sampling", f"{_SAMPLING}, token-id keys as integers"),
    "max_tokens": Field("route", "the engine's `max_tokens` (capped by `Limits.max_tokens_cap`)"),
    "max_completion_tokens": Field("route", "as `max_tokens`, and wins over it", CHAT),
    "logprobs": Field(
        "route",
        "chat: `true` asks the engine for logprobs; completions: the number of top logprobs, "
        "in the legacy `tokens` / `token_logprobs` / `top_logprobs` / `text_offset` shape",
    ),
    "top_logprobs": Field("route", "alternatives per token, with `logprobs`", CHAT),
    "response_format": Field(
        "route",
        "`json_object` / `json_schema` / `structural_tag`: the engine's `structured_outputs` "
        "(over the same fields of `structured_outputs`, as vLLM)",
    ),
    # -- vLLM's sampling extras --
    "top_k": Field("sampling", _SAMPLING),
    "min_p": Field("sampling", _SAMPLING),
    "repetition_penalty": Field("sampling", _SAMPLING),
    "min_tokens": Field("sampling", _SAMPLING),
    "ignore_eos": Field("sampling", f"{_SAMPLING} (the end-of-turn stops go too)"),
    "stop_token_ids": Field("sampling", f"{_SAMPLING}, next to the model's end-of-turn ids"),
    "include_stop_str_in_output": Field("sampling", _SAMPLING),
    "skip_special_tokens": Field("sampling", _SAMPLING),
    "spaces_between_special_tokens": Field("sampling", _SAMPLING),
    "bad_words": Field("sampling", _SAMPLING),
    "allowed_token_ids": Field("sampling", _SAMPLING),
    "prompt_logprobs": Field("sampling", f"{_SAMPLING}; the response's `prompt_logprobs`"),
    "logprob_token_ids": Field("sampling", f"{_SAMPLING} (with `logprobs`)"),
    "thinking_token_budget": Field(
        "sampling", f"{_SAMPLING} (the engine needs vLLM's `reasoning_config`)"
    ),
    "watermarking": Field("sampling", f"{_SAMPLING} (the engine's watermark, if configured)"),
    "repetition_detection": Field("sampling", f"{_SAMPLING} (`RepetitionDetectionParams`)"),
    "stream_interval": Field("sampling", f"{_SAMPLING}: tokens per streamed chunk"),
    "vllm_xargs": Field("request", "the engine's `vllm_xargs`: `SamplingParams.extra_args`"),
    "structured_outputs": Field("request", "the engine's `structured_outputs` (json, regex, ...)"),
    "priority": Field("request", "vLLM's scheduling priority (needs `scheduling_policy`)"),
    "use_beam_search": Field(
        "refused",
        "beam search is a loop of vLLM's server over its engine, not an engine option; "
        "vllm-inline does not run it",
        default=False,
    ),
    "length_penalty": Field(
        "no effect", "read by beam search only (refused here); vLLM's sampling ignores it too"
    ),
    # -- rendering --
    "add_generation_prompt": Field("prompt", "the template's generation prompt", CHAT),
    "continue_final_message": Field(
        "prompt", "continue the last message (no generation prompt unless asked)", CHAT
    ),
    "documents": Field("prompt", "the template's `documents` (RAG templates)", CHAT),
    "reasoning_effort": Field(
        "prompt", "the template's `reasoning_effort`, and `enable_thinking` unless set", CHAT
    ),
    "chat_template": Field(
        "request", "a template for this request (needs `Limits.trust_request_chat_template`)", CHAT
    ),
    "chat_template_kwargs": Field("request", "template variables", CHAT),
    "add_special_tokens": Field("prompt", "special tokens on top of the template's"),
    "truncate_prompt_tokens": Field("prompt", "keep the last (or first) N prompt tokens"),
    "truncation_side": Field("prompt", "`left` / `right`, with `truncate_prompt_tokens`"),
    "cache_salt": Field("prompt", "salts vLLM's prefix cache for this request"),
    "mm_processor_kwargs": Field(
        "prompt", "the HF processor's options (needs `Limits.trust_request_mm_kwargs`)", CHAT
    ),
    "media_io_kwargs": Field(
        "prompt", "vLLM's media loaders' options (needs `Limits.trust_request_mm_kwargs`)", CHAT
    ),
    "suffix": Field(
        "request", "vLLM's FIM rendering; 400 for models without it, as vLLM", COMPLETION
    ),
    "prompt_embeds": Field(
        "refused",
        "prompt embeddings need an engine started with `enable_prompt_embeds`; the route "
        "takes text",
        COMPLETION,
    ),
    # -- chat: tools and reasoning --
    "tools": Field("request", "function tools, for the template and the tool parser", CHAT),
    "tool_choice": Field(
        "request",
        "`auto`, `none`, `required` or a named function (a 400 without `tools`, as in vLLM)",
        CHAT,
    ),
    "parallel_tool_calls": Field(
        "request",
        "`false`: the engine's `parallel_tool_calls` (one call in vLLM's `required` grammar), "
        "and only the first tool call is kept",
        CHAT,
    ),
    "include_reasoning": Field(
        "request",
        "`false`: a reasoning parser's reasoning is dropped (the engine's `reasoning_parser`)",
        CHAT,
    ),
    # -- the response's extras --
    "echo": Field(
        "route",
        "chat: the last message's text (if the assistant's) before the answer; "
        "completions: the prompt before the text, alone with `max_tokens: 0` (vLLM generates "
        "one token for it, counted in `usage`)",
    ),
    "return_token_ids": Field("route", "`token_ids` and `prompt_token_ids` in the response"),
    "return_tokens_as_token_ids": Field("route", "logprob tokens as `token_id:<id>`"),
    "return_prompt_text": Field("route", "the rendered prompt as `prompt_text`", CHAT),
    "return_token_offsets": Field("no effect", _RENDER_ONLY),
    "mm_payload": Field("no effect", _RENDER_ONLY, releases="0.32-0.34"),
    "return_mm_kwargs": Field("no effect", _RENDER_ONLY, releases="0.32-0.34"),
    "return_assistant_tokens_mask": Field("no effect", _RENDER_ONLY, CHAT, releases="0.30"),
    "return_weight_versions": Field(
        "no effect",
        "the version of weights updated in place (RL); none are here",
        releases="0.33-0.34",
    ),
    "routed_experts_prompt_start": Field(
        "no effect", "for routed-expert capture of MoE models (a vLLM server flag); none here"
    ),
    # -- OpenAI's, not vLLM's: clients send them; vLLM ignores them (debug log), so do we --
    "store": Field("no effect", "OpenAI's stored completions", releases=OPENAI_ONLY),
    "metadata": Field("no effect", "OpenAI's tags for stored completions", releases=OPENAI_ONLY),
    "service_tier": Field("no effect", "OpenAI's processing tier", releases=OPENAI_ONLY),
    "prompt_cache_key": Field(
        "no effect",
        "OpenAI's cache routing hint; vLLM's prefix cache needs none",
        releases=OPENAI_ONLY,
    ),
    "safety_identifier": Field("no effect", "OpenAI's end-user id", releases=OPENAI_ONLY),
    "best_of": Field(
        "no effect",
        "removed from vLLM (no `best_of` in `SamplingParams`); ignored, as vLLM ignores it",
        COMPLETION,
        releases=OPENAI_ONLY,
    ),
    "kv_transfer_params": Field(
        "refused",
        "KV-cache transfer between vLLM instances needs a KV connector, which the engines of "
        "vllm-inline do not run",
    ),
    "ec_transfer_params": Field(
        "refused",
        "encoder-cache transfer between vLLM instances needs an EC connector, which the "
        "engines of vllm-inline do not run",
    ),
}
"""Every field, by name."""

ENGINE_KINDS = ("sampling", "prompt", "request")
"""Kinds handed to the engine under the field's name."""

ROUTES = ("chat", "completion")
"""The requests the table describes."""

# Read on every request: worked out once, here.
_FIELDS = {
    route: MappingProxyType({name: f for name, f in TABLE.items() if route in f.routes})
    for route in ROUTES
}
_TO_ENGINE = {
    route: tuple(
        name
        for name, f in fields.items()
        if f.kind in ENGINE_KINDS and name not in ("messages", "prompt", "logit_bias")
    )
    for route, fields in _FIELDS.items()
}
_REFUSED = {
    route: tuple((name, f) for name, f in fields.items() if f.kind == "refused")
    for route, fields in _FIELDS.items()
}


def fields_of(route: str) -> Mapping[str, Field]:
    """The fields of one request (``chat`` or ``completion``)."""
    return _FIELDS[route]


def to_engine(route: str) -> tuple[str, ...]:
    """The fields of ``route`` handed to the engine as keyword arguments under their names
    (``messages`` and ``prompt`` go their own ways)."""
    return _TO_ENGINE[route]


def refused_fields(route: str) -> tuple[tuple[str, Field], ...]:
    """The ``refused`` fields of ``route``, with their entries."""
    return _REFUSED[route]
