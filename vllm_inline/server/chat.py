"""``/v1/chat/completions`` and ``/v1/completions``: a request body becomes one ``Engine.astream``
call per prompt, its deltas OpenAI's chunks (``engine/stream/openai_format.py``).

The streamed and the whole answer come from the same deltas. A stream waits for its first delta
before the 200 goes out, so bad input still gets a 400 (the engine checks the request when the
stream starts); a client that hangs up at any point cancels the work, which aborts the request
in vLLM.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import aclosing, contextmanager
from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from vllm_inline.engine import (
    DEFAULTS,
    BadRequestError,
    ContextLengthExceededError,
    Delta,
    Usage,
    VLLMInlineError,
)
from vllm_inline.engine.stream.openai_format import (
    chunk_from_delta,
    completion_from_deltas,
    role_chunk,
    text_chunk_from_delta,
    text_completion_from_deltas,
    usage_chunk,
)
from vllm_inline.server.errors import InvalidBodyError, error_body, status_of
from vllm_inline.server.extras import (
    chat_extras,
    chat_stream_extras,
    echo_text,
    next_offset,
    text_choice_extras,
)
from vllm_inline.server.guard import check_caps
from vllm_inline.server.limits import Limits
from vllm_inline.server.models import ServedModels
from vllm_inline.server.requests import chat_kwargs, completion_kwargs, prompts_of

__all__ = ["chat_router", "read_body"]


async def read_body(request: Request) -> dict[str, Any]:
    """The request's JSON object (a 400 naming the problem otherwise)."""
    try:
        body = await request.json()
    except ValueError as e:
        raise InvalidBodyError("body", f"not valid JSON ({e})") from None
    if not isinstance(body, dict):
        raise InvalidBodyError("body", "not a JSON object")
    check_text(body, "body")
    return body


def check_text(value: Any, place: str) -> None:
    """Refuse a string of ``value`` (at ``place``) that is no Unicode text: JSON's ``\\udc80``
    escapes a lone surrogate, valid JSON that no UTF-8 encoder takes; left in, it failed the
    request later, as a plain-text 500 or as the engine's failure (a 503)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            bad = ascii(value[e.start : e.end])
            raise InvalidBodyError(
                place, f"holds {bad}, a lone surrogate: no Unicode text"
            ) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            check_text(key, place)
            check_text(item, f"{place}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_text(item, f"{place}.{index}")


def chat_router(models: ServedModels, limits: Limits, reasoning_field: str) -> APIRouter:
    """The two generation routes for the chat models of ``models``."""
    router = APIRouter()

    def prepare(body: Mapping[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        check_caps(body, limits.max_tokens_cap, limits.max_n)
        if limits.max_tokens_cap is not None and "max_tokens" not in kwargs:
            kwargs["max_tokens"] = min(limits.max_tokens_cap, int(DEFAULTS["max_tokens"]))
        # What the client sent, as vLLM's check_logprobs reads it: prompt logprobs that an
        # echo asks for are computed in a stream too, and not sent.
        prompt_logprobs = body.get("prompt_logprobs")
        if body.get("stream") and prompt_logprobs is not None and prompt_logprobs != 0:
            raise BadRequestError(
                "`prompt_logprobs` are not available when `stream=True`.",
                parameter="prompt_logprobs",
                value=prompt_logprobs,
            )
        return kwargs

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await read_body(request)
        served = models.find("chat", body.get("model"))
        kwargs = chat_kwargs(body, limits)
        served.check_chat_tool_choice(kwargs)
        kwargs.update(served.request_options(kwargs))  # adapter, template, parsers
        if body.get("echo") and kwargs.get("prompt_logprobs") is None:
            # As vLLM's to_sampling_params: an echo comes with the prompt's logprobs.
            kwargs["prompt_logprobs"] = body.get("top_logprobs") or 0
        if body.get("return_token_ids") or body.get("return_prompt_text"):
            kwargs["return_prompt_token_ids"] = True
        kwargs = prepare(body, kwargs)
        meta: dict[str, Any] = {
            "id": f"chatcmpl-{request_id(request, body)}",
            "model": served.name,
            "created": now(),
        }
        decode = decoder(served.engine)
        top_logprobs = kwargs.get("logprobs")
        deltas = served.engine.astream(body.get("messages"), **kwargs)
        if not body.get("stream"):
            answer = await until_disconnect(request, collect(deltas))
            if answer is None:
                return Response(status_code=499)  # nobody is listening any more
            whole = completion_from_deltas(
                answer,
                reasoning_field=reasoning_field,
                top_logprobs=top_logprobs,
                system_fingerprint=served.fingerprint,
                **meta,
            )
            return JSONResponse(chat_extras(whole, answer, body, decode))
        usage = include_usage(body)
        echo = echo_text(body)
        # As `vllm serve`: the fingerprint ends the stream, on the usage chunk when there is one.
        fingerprint = None if usage else served.fingerprint
        tool_calls_sent: set[int] = set()

        def chunks(delta: Delta, first: bool, prompt: int) -> list[dict[str, Any]]:
            """The role chunk first (as `vllm serve` sends it), then the delta's."""
            after_tool_calls = delta.index in tool_calls_sent
            if delta.tool_calls:
                tool_calls_sent.add(delta.index)
            chunk = chunk_from_delta(
                delta,
                reasoning_field=reasoning_field,
                after_tool_calls=after_tool_calls,
                top_logprobs=top_logprobs,
                system_fingerprint=fingerprint,
                **meta,
            )
            chunk = chat_stream_extras(chunk, delta, body, decode)
            if not first:
                return [chunk]
            role = chat_stream_extras(role_chunk(delta.index, **meta), delta, body, decode)
            if not echo:
                return [role, chunk]
            said = {  # as vLLM's echo chunk: no prompt fields
                **{k: v for k, v in role_chunk(delta.index, **meta).items() if "prompt" not in k},
                "choices": [
                    {
                        "index": delta.index,
                        "delta": {"content": echo},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
            return [role, said, chunk]

        ending = partial(usage_chunk, system_fingerprint=served.fingerprint) if usage else None
        return await streamed(request, [deltas], chunks, meta, ending, "chat.completion.chunk")

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await read_body(request)
        served = models.find("chat", body.get("model"))
        kwargs = prepare(body, completion_kwargs(body, limits))
        kwargs.update(served.sampling_defaults(kwargs))
        if served.lora is not None:  # an adapter served as a model
            kwargs["lora"] = served.lora
        if body.get("return_token_ids") or body.get("echo"):
            kwargs["return_prompt_token_ids"] = True
        prompts = prompts_of(body)
        meta: dict[str, Any] = {
            "id": f"cmpl-{request_id(request, body)}",
            "model": served.name,
            "created": now(),
        }
        decode = decoder(served.engine)

        def as_text(prompt: str | list[int]) -> str:
            """The prompt as an echo writes it (token ids decoded, only for an echo)."""
            if isinstance(prompt, str) or not body.get("echo"):
                return prompt if isinstance(prompt, str) else ""
            return decode(prompt)

        streams = [served.engine.astream(prompt=p, **kwargs) for p in prompts]
        if not body.get("stream"):
            work = asyncio.gather(*(collect(s) for s in streams))
            with prompt_too_long():
                answers = await until_disconnect(request, work)
            if answers is None:
                return Response(status_code=499)
            whole = text_completion_from_deltas(
                answers, system_fingerprint=served.fingerprint, **meta
            )
            choices = iter(whole["choices"])
            for prompt, deltas in zip(prompts, answers):  # in text_completion_from_deltas' order
                for index in sorted({d.index for d in deltas}):
                    mine = [d for d in deltas if d.index == index]
                    text_choice_extras(next(choices), mine, body, as_text(prompt), decode)
            return JSONResponse(whole)
        n = int(kwargs.get("n") or 1)
        offsets: dict[int, int] = {}  # each streamed choice's logprobs text offset so far
        usage = include_usage(body)
        fingerprint = None if usage else served.fingerprint

        def chunks(delta: Delta, first: bool, prompt: int) -> list[dict[str, Any]]:
            index = prompt * n + delta.index
            chunk = text_chunk_from_delta(
                delta, index=index, system_fingerprint=fingerprint, **meta
            )
            text = as_text(prompts[prompt]) if first else ""
            choice, at = chunk["choices"][0], offsets.get(index, 0)
            text_choice_extras(choice, [delta], body, text, decode, first, at)
            offsets[index] = next_offset(choice, at)
            return [chunk]

        ending = partial(usage_chunk, system_fingerprint=served.fingerprint) if usage else None
        with prompt_too_long():
            return await streamed(request, streams, chunks, meta, ending, "text_completion")

    return router


def now() -> int:
    return int(time.time())


def request_id(request: Request, body: Mapping[str, Any]) -> str:
    """The response id's tail, as ``vllm serve`` takes it: the ``X-Request-Id`` header, else
    the body's ``request_id`` (checked to be a string), else a fresh one."""
    header = request.headers.get("x-request-id")
    if header is not None:
        return header
    given = body.get("request_id")
    return given if isinstance(given, str) and given else uuid.uuid4().hex


def decoder(engine: Any) -> Callable[[Sequence[int]], str]:
    """Token ids to text with the engine's tokenizer, special tokens kept (the prompt as it was
    rendered: ``return_prompt_text``, an echo's first token)."""

    def decode(ids: Sequence[int]) -> str:
        return str(engine.tokenizer.decode(list(ids), skip_special_tokens=False))

    return decode


@contextmanager
def prompt_too_long() -> Iterator[None]:
    """An over-long prompt of ``/v1/completions``: the engine names ``messages`` (its chat
    argument), the body has it as ``prompt``."""
    try:
        yield
    except ContextLengthExceededError as e:
        e.parameter = "prompt"
        raise


def include_usage(body: Mapping[str, Any]) -> bool:
    return bool((body.get("stream_options") or {}).get("include_usage"))


async def collect(deltas: AsyncIterator[Delta]) -> list[Delta]:
    """All deltas of a request (the non-streaming answer is built from the same deltas)."""
    async with aclosing(deltas):  # type: ignore[type-var]  # an async generator
        return [delta async for delta in deltas]


async def until_disconnect(request: Request, work: Any) -> Any:
    """``work``'s result, or ``None`` once it is cancelled (aborting its engine requests)
    because the client left first. The body has been read, so the next ASGI message the server
    has for us is the disconnect."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return None
    return task.result()


async def streamed(
    request: Request,
    streams: list[AsyncIterator[Delta]],
    chunks: Callable[[Delta, bool, int], list[dict[str, Any]]],
    meta: dict[str, Any],
    usage: Callable[..., dict[str, Any]] | None,
    object_name: str,
) -> Response:
    """The SSE response for ``streams`` (one per prompt), once each has its first delta."""
    firsts = await until_disconnect(request, asyncio.gather(*(anext(s) for s in streams)))
    if firsts is None:
        for s in streams:
            await s.aclose()  # type: ignore[attr-defined]
        return Response(status_code=499)
    events = _events(list(zip(firsts, streams)), chunks, meta, usage, object_name)
    return StreamingResponse(events, media_type="text/event-stream")


async def _events(
    started: list[tuple[Delta, AsyncIterator[Delta]]],
    chunks: Callable[[Delta, bool, int], list[dict[str, Any]]],
    meta: dict[str, Any],
    usage: Callable[..., dict[str, Any]] | None,
    object_name: str,
) -> AsyncIterator[str]:
    """``data: {chunk}`` events of every stream as they come, then the usage (when asked for)
    and ``data: [DONE]``. When the client disconnects, Starlette cancels this generator, which
    closes every engine stream and so aborts the requests in vLLM."""
    queue: asyncio.Queue[tuple[int, Delta | BaseException | None]] = asyncio.Queue()

    async def pump(prompt: int, first: Delta, rest: AsyncIterator[Delta]) -> None:
        try:
            await queue.put((prompt, first))
            async with aclosing(rest):  # type: ignore[type-var]
                async for delta in rest:
                    await queue.put((prompt, delta))
            await queue.put((prompt, None))
        except Exception as e:  # noqa: BLE001 - reported in the stream, below
            await queue.put((prompt, e))

    pumps = [asyncio.ensure_future(pump(k, f, r)) for k, (f, r) in enumerate(started)]
    seen: set[tuple[int, int]] = set()
    totals = [0, 0, 0]
    try:
        open_streams = len(pumps)
        while open_streams:
            prompt, item = await queue.get()
            if item is None:
                open_streams -= 1
                continue
            if isinstance(item, BaseException):
                # Headers are gone: the error is the stream's last event, as `vllm serve` does.
                status = status_of(item) if isinstance(item, VLLMInlineError) else 500
                param = getattr(item, "parameter", None)
                yield f"data: {json.dumps(error_body(status, str(item), param))}\n\n"
                break
            first = (prompt, item.index) not in seen
            seen.add((prompt, item.index))
            for event in chunks(item, first, prompt):
                yield f"data: {json.dumps(event)}\n\n"
            if item.usage is not None:
                for k, value in enumerate(
                    (
                        item.usage.prompt_tokens,
                        item.usage.completion_tokens,
                        item.usage.cached_tokens,
                    )
                ):
                    totals[k] += value
        else:
            if usage is not None:
                summed = usage(Usage(*totals), object=object_name, **meta)
                yield f"data: {json.dumps(summed)}\n\n"
    finally:
        for p in pumps:
            p.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
    yield "data: [DONE]\n\n"
