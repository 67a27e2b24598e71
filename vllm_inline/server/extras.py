"""vLLM's extra response fields, asked for by request fields: pure functions that fill in the
answers :mod:`vllm_inline.engine.stream.openai_format` builds (where those have the fields as
nulls), as ``vllm serve`` fills them (vLLM 0.32's ``chat_completion/serving.py`` and
``completion/serving.py``):

- ``return_token_ids``: each choice's ``token_ids``, the prompt's ``prompt_token_ids``;
- ``prompt_logprobs``: ``{token_id: {"logprob", "rank", "decoded_token"}}`` per prompt token;
- ``echo``: the last message's text (chat, when it has the answer's role) or the prompt
  (completions) before the answer;
- ``return_tokens_as_token_ids``: logprob tokens written ``token_id:<id>``;
- ``parallel_tool_calls=false``: only the first tool call;
- ``return_prompt_text``: the rendered prompt;
- completions' ``logprobs``: OpenAI's legacy ``tokens`` / ``token_logprobs`` /
  ``top_logprobs`` / ``text_offset``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from vllm_inline.engine import Delta
from vllm_inline.engine.stream.deltas import RankedLogprob, TokenLogprob
from vllm_inline.engine.stream.openai_format import LOWEST_LOGPROB
from vllm_inline.server.requests import echo_without_generation

__all__ = [
    "chat_extras",
    "chat_stream_extras",
    "echo_text",
    "next_offset",
    "prompt_logprobs_json",
    "text_choice_extras",
    "text_logprobs",
]


def _as_id(token_id: int) -> str:
    return f"token_id:{token_id}"


def prompt_logprobs_json(
    positions: Sequence[Sequence[RankedLogprob] | None] | None,
) -> list[dict[str, Any] | None] | None:
    """The response's ``prompt_logprobs``, as vLLM serializes its ``Logprob`` dicts."""
    if positions is None:
        return None
    return [
        None
        if step is None
        else {
            str(lp.token_id): {
                "logprob": max(lp.logprob, LOWEST_LOGPROB),
                "rank": lp.rank,
                "decoded_token": lp.token,
            }
            for lp in step
        }
        for step in positions
    ]


def echo_text(body: Mapping[str, Any]) -> str:
    """Chat ``echo``: the last message's text when it has the role of the answer (the
    assistant's, or the last message's own role without a generation prompt), else ``""``."""
    messages = body.get("messages")
    if not body.get("echo") or not isinstance(messages, list) or not messages:
        return ""
    if not isinstance(messages[-1], Mapping):
        return ""
    last = messages[-1]
    generation = body.get("add_generation_prompt")
    if generation is None:
        generation = not body.get("continue_final_message")
    role = "assistant" if generation else last.get("role")
    if last.get("role") != role:
        return ""
    content = last.get("content") or ""
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content)


def _first(deltas: Iterable[Delta]) -> Delta | None:
    """The delta that carries the prompt's ids or logprobs (a choice's first)."""
    return next(
        (d for d in deltas if d.prompt_token_ids is not None or d.prompt_logprobs is not None),
        None,
    )


def _ids_in_logprobs(logprobs: dict[str, Any], steps: Sequence[TokenLogprob]) -> None:
    """``return_tokens_as_token_ids`` on a chat ``logprobs`` object built from ``steps``."""
    for entry, step in zip(logprobs.get("content") or [], steps):
        entry["token"] = _as_id(step.token_id)  # its bytes stay the text's, as vLLM sends them
        ids = [step.token_id, *(t for t in step.top_token_ids if t != step.token_id)]
        for top, token_id in zip(entry.get("top_logprobs") or [], ids):
            top["token"] = _as_id(token_id)
            top["bytes"] = list(top["token"].encode())


def chat_extras(
    whole: dict[str, Any],
    deltas: Sequence[Delta],
    body: Mapping[str, Any],
    decode: Callable[[Sequence[int]], str],
) -> dict[str, Any]:
    """A whole ``chat.completion`` with the extras ``body`` asks for."""
    first = _first(deltas)
    if first is not None:
        whole["prompt_logprobs"] = prompt_logprobs_json(first.prompt_logprobs)
        if body.get("return_token_ids"):
            whole["prompt_token_ids"] = list(first.prompt_token_ids or ())
        if body.get("return_prompt_text"):
            whole["prompt_text"] = decode(first.prompt_token_ids or ())
    echo = echo_text(body)
    for choice in whole["choices"]:
        mine = [d for d in deltas if d.index == choice["index"]]
        if body.get("return_token_ids"):
            choice["token_ids"] = [t for d in mine for t in d.token_ids]
        if body.get("return_tokens_as_token_ids") and choice["logprobs"]:
            _ids_in_logprobs(choice["logprobs"], [lp for d in mine for lp in d.logprobs or ()])
        message = choice["message"]
        if body.get("parallel_tool_calls") is False and message.get("tool_calls"):
            message["tool_calls"] = message["tool_calls"][:1]
        if echo:
            message["content"] = echo + (message["content"] or "")
    return whole


def chat_stream_extras(
    chunk: dict[str, Any], delta: Delta, body: Mapping[str, Any], decode: Callable[..., str]
) -> dict[str, Any]:
    """One streamed ``chat.completion.chunk`` of ``delta`` with the extras ``body`` asks for
    (the prompt's on the request's first chunk: pass the role chunk there)."""
    for choice in chunk["choices"]:
        if body.get("return_token_ids") and "role" not in choice.get("delta", {}):
            choice["token_ids"] = list(delta.token_ids)
        if body.get("return_tokens_as_token_ids") and choice.get("logprobs"):
            _ids_in_logprobs(choice["logprobs"], delta.logprobs or ())
        calls = choice.get("delta", {}).get("tool_calls")
        if calls and body.get("parallel_tool_calls") is False:
            choice["delta"]["tool_calls"] = [c for c in calls if c["index"] == 0]
    if "prompt_token_ids" in chunk and delta.prompt_token_ids is not None:
        if body.get("return_token_ids"):
            chunk["prompt_token_ids"] = list(delta.prompt_token_ids)
        if body.get("return_prompt_text"):
            chunk["prompt_text"] = decode(delta.prompt_token_ids)
    return chunk


def text_logprobs(
    steps: Sequence[TokenLogprob | int],
    top: int,
    tokens_as_ids: bool,
    decode: Callable[[Sequence[int]], str],
    initial_offset: int = 0,
) -> dict[str, Any]:
    """Completions' ``logprobs``: per token its text, logprob and the ``top`` most likely
    (a bare token id is a token without logprobs, the prompt's first: its text decoded), and
    each token's offset in the text (from ``initial_offset``: a stream's chunk goes on from
    the tokens of the chunks before it, as vLLM counts)."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    for step in steps:
        offsets.append(offsets[-1] + len(tokens[-1]) if offsets else initial_offset)
        if isinstance(step, int):
            tokens.append(_as_id(step) if tokens_as_ids else decode([step]))
            token_logprobs.append(None)
            tops.append(None)
            continue
        token = _as_id(step.token_id) if tokens_as_ids else step.token
        tokens.append(token)
        token_logprobs.append(max(step.logprob, LOWEST_LOGPROB))
        ranked = [(token, step.logprob)]
        for (text, value), token_id in zip(step.top_logprobs, step.top_token_ids or ()):
            if token_id != step.token_id:
                ranked.append((_as_id(token_id) if tokens_as_ids else text, value))
        keep = ranked if top == -1 else ranked[: top + 1]
        tops.append({text: max(value, LOWEST_LOGPROB) for text, value in keep})
    return {
        "text_offset": offsets,
        "token_logprobs": token_logprobs,
        "tokens": tokens,
        "top_logprobs": tops,
    }


def _prompt_steps(first: Delta | None) -> list[TokenLogprob | int]:
    """The prompt's tokens as logprob steps (the first, without one, as its id), for an echo
    with logprobs."""
    if first is None or first.prompt_logprobs is None:
        return []
    steps: list[TokenLogprob | int] = []
    for token_id, step in zip(first.prompt_token_ids or (), first.prompt_logprobs):
        chosen = next((lp for lp in step or () if lp.token_id == token_id), None)
        if step is None or chosen is None:
            steps.append(token_id)
            continue
        others = sorted((lp for lp in step if lp.token_id != token_id), key=lambda x: x.rank or 0)
        steps.append(
            TokenLogprob(
                token=chosen.token or "",
                token_id=token_id,
                logprob=chosen.logprob,
                top_logprobs=tuple((lp.token or "", lp.logprob) for lp in others),
                top_token_ids=tuple(lp.token_id for lp in others),
            )
        )
    return steps


def text_choice_extras(
    choice: dict[str, Any],
    deltas: Sequence[Delta],
    body: Mapping[str, Any],
    prompt: str,
    decode: Callable[[Sequence[int]], str],
    first: bool = True,
    offset: int = 0,
) -> dict[str, Any]:
    """One ``text_completion`` choice (whole, or a streamed chunk's: ``first`` when it is its
    first, ``offset`` where its logprobs' text starts) with the extras ``body`` asks for;
    ``deltas`` are its own."""
    head = _first(deltas) if first else None
    echo = bool(body.get("echo")) and first
    only_prompt = echo_without_generation(body)  # the one token generated is not shown
    if body.get("return_token_ids"):
        choice["token_ids"] = [t for d in deltas for t in d.token_ids]
        if head is not None:
            choice["prompt_token_ids"] = list(head.prompt_token_ids or ())
    if head is not None and "prompt_logprobs" in choice:
        choice["prompt_logprobs"] = prompt_logprobs_json(head.prompt_logprobs)
    logprobs = body.get("logprobs")
    if logprobs is not None:
        steps: list[TokenLogprob | int] = _prompt_steps(head) if echo else []
        if not only_prompt:
            steps += [lp for d in deltas for lp in d.logprobs or ()]
        # With logprob_token_ids every alternative the engine returned is listed, as vLLM's.
        top = -1 if body.get("logprob_token_ids") else int(logprobs)
        tokens_as_ids = bool(body.get("return_tokens_as_token_ids"))
        choice["logprobs"] = text_logprobs(steps, top, tokens_as_ids, decode, offset)
    # An echo writes the prompt before the text, unless the ids are returned (vLLM's way).
    echoed = prompt if echo and not body.get("return_token_ids") else ""
    choice["text"] = echoed if only_prompt else echoed + choice["text"]
    return choice


def next_offset(choice: Mapping[str, Any], offset: int) -> int:
    """Where the next chunk's logprobs start: after the tokens this chunk reported (not its
    text: text held back for a stop string lags the tokens), as vLLM advances it."""
    logprobs = choice.get("logprobs")
    if not logprobs or not logprobs.get("tokens"):
        return offset
    return int(logprobs["text_offset"][-1]) + len(logprobs["tokens"][-1])
