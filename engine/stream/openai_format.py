"""OpenAI's chat-completion wire format from :class:`~.deltas.Delta` objects: pure functions.

For an app that serves the engine over HTTP to OpenAI clients (``examples/openai_server.py``):

- :func:`chunk_from_delta` turns one delta into a ``chat.completion.chunk`` dict, carrying only
  the delta's new text (and tool-call fragments); ``role`` on a choice's first chunk,
  ``finish_reason`` on its last;
- :func:`usage_chunk` is the extra last chunk of ``stream_options={"include_usage": true}``;
- :func:`completion_from_deltas` builds the whole ``chat.completion`` from a request's deltas,
  so the streamed and the non-streamed answer come from the same deltas;
- :func:`text_chunk_from_delta` and :func:`text_completion_from_deltas` do the same for the
  legacy ``text_completion`` (``/v1/completions``), and :func:`usage_chunk` serves both.

Nothing here does I/O or knows the engine: dicts in, dicts out, ready for ``json.dumps``. The
field names are OpenAI's (``openai.types.chat``). Reasoning text, which OpenAI's API never returns,
goes to ``reasoning_content`` (the name DeepSeek's API and most clients use; ``vllm serve`` calls it
``reasoning``: pass ``reasoning_field="reasoning"`` for that).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vllm_inline.engine.stream.deltas import Delta, TokenLogprob, ToolCallDelta, Usage

__all__ = [
    "chunk_from_delta",
    "completion_from_deltas",
    "logprobs_dict",
    "text_chunk_from_delta",
    "text_completion_from_deltas",
    "usage_chunk",
    "usage_dict",
]


def usage_dict(usage: Usage) -> dict[str, Any]:
    """OpenAI's ``usage`` object from the real token counts (cached prompt tokens from vLLM's
    prefix cache as ``prompt_tokens_details.cached_tokens``)."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def logprobs_dict(logprobs: Iterable[TokenLogprob]) -> dict[str, Any]:
    """OpenAI's ``logprobs`` object (``{"content": [...]}``) for some generated tokens."""

    def entry(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}

    return {
        "content": [
            {
                **entry(lp.token, lp.logprob),
                "top_logprobs": [entry(text, value) for text, value in lp.top_logprobs],
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


def chunk_from_delta(
    delta: Delta,
    *,
    id: str,
    model: str,
    created: int,
    first: bool = False,
    reasoning_field: str = "reasoning_content",
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` for ``delta``: its new text only, never earlier text.

    ``first=True`` (the choice's first chunk) adds ``"role": "assistant"``. ``finish_reason`` is
    the delta's (``None`` until the choice's last chunk). Usage is not included: send
    :func:`usage_chunk` after the last delta when the client asked for it, as OpenAI does.
    """
    message: dict[str, Any] = {"role": "assistant"} if first else {}
    if delta.text or first:
        message["content"] = delta.text
    if delta.reasoning:
        message[reasoning_field] = delta.reasoning
    if delta.tool_calls:
        message["tool_calls"] = _tool_call_fragments(delta.tool_calls)
    return {
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": delta.index,
                "delta": message,
                "logprobs": logprobs_dict(delta.logprobs) if delta.logprobs is not None else None,
                "finish_reason": delta.finish_reason,
            }
        ],
    }


def usage_chunk(
    usage: Usage, *, id: str, model: str, created: int, object: str = "chat.completion.chunk"
) -> dict[str, Any]:
    """The last chunk of a stream with ``stream_options.include_usage``: no choices, the usage
    (``object="text_completion"`` for a completions stream)."""
    return {
        "id": id,
        "object": object,
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_dict(usage),
    }


def completion_from_deltas(
    deltas: Iterable[Delta],
    *,
    id: str,
    model: str,
    created: int,
    reasoning_field: str = "reasoning_content",
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
    finish: dict[int, str | None] = {}
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
        if delta.finish_reason is not None or i not in finish:
            finish[i] = delta.finish_reason
        if delta.usage is not None:
            usage = delta.usage
    choices = []
    for i in sorted(texts):
        text = "".join(texts[i])
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if i in calls:
            message["tool_calls"] = [calls[i][k] for k in sorted(calls[i])]
            message["content"] = text or None
        if i in reasoning:
            message[reasoning_field] = "".join(reasoning[i])
        choices.append(
            {
                "index": i,
                "message": message,
                "logprobs": logprobs_dict(logprobs[i]) if i in logprobs else None,
                "finish_reason": finish[i],
            }
        )
    return {
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage_dict(usage),
    }


def text_chunk_from_delta(
    delta: Delta, *, id: str, model: str, created: int, index: int | None = None
) -> dict[str, Any]:
    """One streamed ``text_completion`` chunk for ``delta`` (``index``: the choice's index in
    the response, when several prompts share one)."""
    return {
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
            }
        ],
    }


def text_completion_from_deltas(
    choices: Iterable[Iterable[Delta]], *, id: str, model: str, created: int
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
                }
            )
    return {
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": out,
        "usage": usage_dict(Usage(prompt_tokens, completion_tokens, cached)),
    }
