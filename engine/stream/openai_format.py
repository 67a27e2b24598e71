"""OpenAI's chat-completion wire format from :class:`~.deltas.Delta` objects, as ``vllm serve``
sends it: pure functions.

For an app that serves the engine over HTTP to OpenAI clients (``vllm_inline.server``):

- :func:`role_chunk` is a choice's first ``chat.completion.chunk`` (the role, empty content), and
  :func:`chunk_from_delta` turns one delta into the next one, carrying only the delta's new text
  (and tool-call fragments), ``finish_reason`` and ``stop_reason`` on the choice's last;
- :func:`usage_chunk` is the extra last chunk of ``stream_options={"include_usage": true}``;
- :func:`completion_from_deltas` builds the whole ``chat.completion`` from a request's deltas,
  so the streamed and the non-streamed answer come from the same deltas;
- :func:`text_chunk_from_delta` and :func:`text_completion_from_deltas` do the same for the
  legacy ``text_completion`` (``/v1/completions``), and :func:`usage_chunk` serves both.

Nothing here does I/O or knows the engine: dicts in, dicts out, ready for ``json.dumps``. The
fields, their nesting and their nulls are ``vllm serve``'s (vLLM 0.32, ``openai.types.chat``
plus vLLM's ``stop_reason``, ``token_ids``, ``prompt_token_ids``, ...; tests/test_server_parity.py
compares the two servers), as the installed vLLM's server sends them: from 0.34 it leaves
``message.annotations`` and ``usage.prompt_tokens_details`` out when they are null, where
earlier releases send the nulls (:func:`empty_fields_left_out`). Three differences are kept on purpose: ``usage`` always reports
cached prompt tokens (``prompt_tokens_details.cached_tokens``, which ``vllm serve`` sends only
with ``--enable-prompt-tokens-details``); the fragments of one tool call in one chunk are one
entry (clients read two entries of one chunk as two calls); vLLM's internal fields
(``kv_transfer_params``, ``ec_transfer_params``, ``routed_experts``, ``metrics``: transfers
between vLLM instances, MoE routing capture, per-request metrics, all null unless a server flag
asks) are left out. Reasoning text goes to ``reasoning``, as ``vllm serve`` calls it
(``reasoning_field="reasoning_content"`` for clients that read DeepSeek's name).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vllm_inline.engine.seam.versions import installed_at_least
from vllm_inline.engine.stream.deltas import Delta, TokenLogprob, ToolCallDelta, Usage

__all__ = [
    "EMPTY_FIELDS_LEFT_OUT_SINCE",
    "LOWEST_LOGPROB",
    "chunk_from_delta",
    "completion_from_deltas",
    "empty_fields_left_out",
    "logprobs_dict",
    "pooling_usage",
    "role_chunk",
    "text_chunk_from_delta",
    "text_completion_from_deltas",
    "usage_chunk",
    "usage_dict",
]

LOWEST_LOGPROB = -9999.0
"""vLLM's server clamps log probabilities here (``-inf`` is not JSON)."""

EMPTY_FIELDS_LEFT_OUT_SINCE = "0.34.0"
"""The vLLM release whose server leaves ``ChatMessage.annotations`` and
``UsageInfo.prompt_tokens_details`` out when they are null (pydantic's ``exclude_if`` on both
fields)."""


def empty_fields_left_out() -> bool:
    """Whether the installed vLLM's server leaves the null ``annotations`` and
    ``prompt_tokens_details`` out (0.34 and newer) rather than sending them as null."""
    return installed_at_least(EMPTY_FIELDS_LEFT_OUT_SINCE)


def usage_dict(usage: Usage, *, streamed: bool = False) -> dict[str, Any]:
    """OpenAI's ``usage`` object from the real token counts (cached prompt tokens from vLLM's
    prefix cache as ``prompt_tokens_details.cached_tokens``). ``streamed``: the usage chunk's,
    which has no ``completion_tokens_details`` (``vllm serve`` leaves its nulls out there)."""
    out: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "total_tokens": usage.total_tokens,
        "completion_tokens": usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }
    if not streamed:
        out["completion_tokens_details"] = None
    return out


def pooling_usage(tokens: int) -> dict[str, Any]:
    """``vllm serve``'s ``usage`` of an embedding or scoring answer: the prompt tokens, no
    details (their null left out from vLLM 0.34, :func:`empty_fields_left_out`)."""
    usage: dict[str, Any] = {
        "prompt_tokens": tokens,
        "total_tokens": tokens,
        "completion_tokens": 0,
    }
    if not empty_fields_left_out():
        usage["prompt_tokens_details"] = None
    usage["completion_tokens_details"] = None
    return usage


def logprobs_dict(logprobs: Iterable[TokenLogprob], top: int | None = None) -> dict[str, Any]:
    """OpenAI's ``logprobs`` object (``{"content": [...]}``) for some generated tokens.

    ``top_logprobs`` of each token lists the generated token first, then its alternatives by
    rank, ``top`` of them in all (the request's ``top_logprobs``; ``None``: all the engine
    returned), as ``vllm serve`` lists them."""

    def entry(token: str, logprob: float) -> dict[str, Any]:
        return {
            "token": token,
            "logprob": max(logprob, LOWEST_LOGPROB),
            "bytes": list(token.encode("utf-8", errors="replace")),
        }

    def ranked(lp: TokenLogprob) -> list[tuple[str, float]]:
        chosen = (lp.token, lp.logprob)
        listed = [chosen, *(t for t in lp.top_logprobs if t != chosen)]
        return listed if top is None else listed[:top]

    return {
        "content": [
            {
                **entry(lp.token, lp.logprob),
                "top_logprobs": [entry(text, value) for text, value in ranked(lp)],
            }
            for lp in logprobs
        ]
    }


def _tool_call_fragments(calls: Iterable[ToolCallDelta]) -> list[dict[str, Any]]:
    """OpenAI's streamed ``tool_calls``: one entry per call ``index``.

    OpenAI sends ``id``, ``type`` and ``name`` only in a call's first fragment; later ones add
    ``arguments``. A delta can hold several fragments of one call (the parser saw the name and
    the arguments in one step): they are merged, because clients merge entries *across* chunks
    by ``index`` but take two entries of one chunk for two calls.
    """
    merged: dict[int, dict[str, Any]] = {}
    for call in calls:
        fragment = merged.setdefault(
            call.index, {"index": call.index, "function": {"arguments": ""}}
        )
        if call.id is not None:
            fragment["id"] = call.id
            fragment["type"] = "function"
        if call.name is not None:
            fragment["function"]["name"] = call.name
        fragment["function"]["arguments"] += call.arguments
    return list(merged.values())


def _chunk(
    choice: dict[str, Any], *, id: str, model: str, created: int, **more: Any
) -> dict[str, Any]:
    return {
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
        **more,
    }


def role_chunk(index: int, *, id: str, model: str, created: int) -> dict[str, Any]:
    """A choice's first ``chat.completion.chunk``: ``"role": "assistant"`` and empty content,
    sent once the engine has started the request (``vllm serve``'s first chunk)."""
    choice = {
        "index": index,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": None,
        "finish_reason": None,
    }
    return _chunk(
        choice, id=id, model=model, created=created, prompt_token_ids=None, prompt_text=None
    )


def chunk_from_delta(
    delta: Delta,
    *,
    id: str,
    model: str,
    created: int,
    reasoning_field: str = "reasoning",
    after_tool_calls: bool = False,
    top_logprobs: int | None = None,
    system_fingerprint: str | None = None,
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` for ``delta``: its new text only, never earlier text.

    The delta holds ``content`` (``None`` next to tool calls), ``reasoning`` and ``tool_calls``
    as the delta has them; a delta with none of them is ``{"content": ""}``, or ``{}`` once
    the choice has streamed tool calls (``after_tool_calls``), as ``vllm serve`` sends it.
    ``finish_reason`` and ``stop_reason`` are the delta's (on the choice's last chunk, which
    also carries ``system_fingerprint`` when given). Usage is not included: send
    :func:`usage_chunk` after the last delta when the client asked for it, as OpenAI does.
    """
    message: dict[str, Any] = {}
    if delta.reasoning:
        message[reasoning_field] = delta.reasoning
    if delta.tool_calls:
        message["content"] = delta.text or None
        message["tool_calls"] = _tool_call_fragments(delta.tool_calls)
    elif delta.text or not (delta.reasoning or after_tool_calls):
        message["content"] = delta.text
    logprobs = logprobs_dict(delta.logprobs, top_logprobs) if delta.logprobs is not None else None
    choice: dict[str, Any] = {
        "index": delta.index,
        "delta": message,
        "logprobs": logprobs,
        "finish_reason": delta.finish_reason,
    }
    if delta.finish_reason is None:
        return _chunk({**choice, "token_ids": None}, id=id, model=model, created=created)
    choice.update(stop_reason=delta.stop_reason, token_ids=None)
    more = {"system_fingerprint": system_fingerprint} if system_fingerprint else {}
    return _chunk(choice, id=id, model=model, created=created, **more)


def usage_chunk(
    usage: Usage,
    *,
    id: str,
    model: str,
    created: int,
    object: str = "chat.completion.chunk",
    system_fingerprint: str | None = None,
) -> dict[str, Any]:
    """The last chunk of a stream with ``stream_options.include_usage``: no choices, the usage
    (``object="text_completion"`` for a completions stream)."""
    chunk: dict[str, Any] = {
        "id": id,
        "object": object,
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_dict(usage, streamed=True),
    }
    if system_fingerprint:
        chunk["system_fingerprint"] = system_fingerprint
    return chunk


def completion_from_deltas(
    deltas: Iterable[Delta],
    *,
    id: str,
    model: str,
    created: int,
    reasoning_field: str = "reasoning",
    top_logprobs: int | None = None,
    system_fingerprint: str | None = None,
) -> dict[str, Any]:
    """The whole ``chat.completion`` for all the deltas of one request (every choice).

    Text and reasoning are joined, tool-call fragments merged by their index into complete
    ``tool_calls`` (``content`` is ``None`` when a choice holds only tool calls, as OpenAI has it);
    ``usage`` comes from the delta that carries it (zeros if none did).
    """
    texts: dict[int, list[str]] = {}
    reasoning: dict[int, list[str]] = {}
    calls: dict[int, dict[int, dict[str, Any]]] = {}
    logprobs: dict[int, list[TokenLogprob]] = {}
    last: dict[int, Delta] = {}
    usage = Usage(0, 0)
    for delta in deltas:
        i = delta.index
        texts.setdefault(i, []).append(delta.text)
        if delta.reasoning:
            reasoning.setdefault(i, []).append(delta.reasoning)
        for fragment in delta.tool_calls:
            call = calls.setdefault(i, {}).setdefault(
                fragment.index,
                {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
            )
            if fragment.id is not None:
                call["id"] = fragment.id
            if fragment.name is not None:
                call["function"]["name"] = fragment.name
            call["function"]["arguments"] += fragment.arguments
        if delta.logprobs is not None:
            logprobs.setdefault(i, []).extend(delta.logprobs)
        if delta.finish_reason is not None or i not in last:
            last[i] = delta
        if delta.usage is not None:
            usage = delta.usage
    choices = []
    for i in sorted(texts):
        text = "".join(texts[i])
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        if not empty_fields_left_out():
            message["annotations"] = None
        message.update(audio=None, function_call=None)
        if i in calls:
            message["tool_calls"] = [calls[i][k] for k in sorted(calls[i])]
            message["content"] = text or None
        message[reasoning_field] = "".join(reasoning[i]) if i in reasoning else None
        choices.append(
            {
                "index": i,
                "message": message,
                "logprobs": logprobs_dict(logprobs[i], top_logprobs) if i in logprobs else None,
                "finish_reason": last[i].finish_reason,
                "stop_reason": last[i].stop_reason,
                "token_ids": None,
            }
        )
    return {
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": system_fingerprint,
        "usage": usage_dict(usage),
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "prompt_text": None,
    }


def text_chunk_from_delta(
    delta: Delta,
    *,
    id: str,
    model: str,
    created: int,
    index: int | None = None,
    system_fingerprint: str | None = None,
) -> dict[str, Any]:
    """One streamed ``text_completion`` chunk for ``delta`` (``index``: the choice's index in
    the response, when several prompts share one; ``system_fingerprint`` on a choice's last)."""
    chunk: dict[str, Any] = {
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": delta.index if index is None else index,
                "text": delta.text,
                "logprobs": None,
                "finish_reason": delta.finish_reason,
                "stop_reason": delta.stop_reason,
                "prompt_token_ids": None,
                "token_ids": None,
            }
        ],
    }
    if system_fingerprint and delta.finish_reason is not None:
        chunk["system_fingerprint"] = system_fingerprint
    return chunk


def text_completion_from_deltas(
    choices: Iterable[Iterable[Delta]],
    *,
    id: str,
    model: str,
    created: int,
    system_fingerprint: str | None = None,
) -> dict[str, Any]:
    """The whole ``text_completion`` for the deltas of each prompt's request, in order: choice
    ``i * n + j`` is choice ``j`` of prompt ``i``; usage summed over the prompts."""
    out: list[dict[str, Any]] = []
    prompt_tokens = completion_tokens = cached = 0
    for deltas in choices:
        texts: dict[int, list[str]] = {}
        last: dict[int, Delta] = {}
        for delta in deltas:
            texts.setdefault(delta.index, []).append(delta.text)
            last[delta.index] = delta
            if delta.usage is not None:
                prompt_tokens += delta.usage.prompt_tokens
                completion_tokens += delta.usage.completion_tokens
                cached += delta.usage.cached_tokens
        base = len(out)
        for i in sorted(texts):
            out.append(
                {
                    "index": base + i,
                    "text": "".join(texts[i]),
                    "logprobs": None,
                    "finish_reason": last[i].finish_reason,
                    "stop_reason": last[i].stop_reason,
                    "token_ids": None,
                    "prompt_logprobs": None,
                    "prompt_token_ids": None,
                }
            )
    return {
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": out,
        "service_tier": None,
        "system_fingerprint": system_fingerprint,
        "usage": usage_dict(Usage(prompt_tokens, completion_tokens, cached)),
    }
