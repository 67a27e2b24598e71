"""Rendering: a :class:`~.request.Request` becomes the prompt token ids vLLM prefills.

The second step of the request path, on the engine loop. Chat messages go through vLLM's renderer
with the template chosen at start (:mod:`vllm_inline.engine.life.templates`) or the request's own,
tools and ``chat_template_kwargs`` included; a pre-formatted ``prompt`` is tokenized as is. A
template that refuses the messages is a :class:`ChatTemplateError` naming ``messages``.
"""

from __future__ import annotations

from typing import Any

from vllm_inline.engine.errors import (
    BadRequestError,
    ChatTemplateError,
    ContextLengthExceededError,
    EngineDeadError,
    VLLMInlineError,
)
from vllm_inline.engine.life.runtime import Runtime
from vllm_inline.engine.life.templates import require_template, resolve_chat_template
from vllm_inline.engine.request.images import check_images
from vllm_inline.engine.request.request import Request

__all__ = ["OFFLOAD_CHARS", "prompt_token_ids", "render"]

OFFLOAD_CHARS = 8192
"""Chat messages with more text than this, or with images, are rendered by vLLM's async
renderer, which applies the template and tokenizes (and loads media) in its thread pool, so
that the engine loop keeps serving other streams meanwhile. Shorter ones are rendered on the
loop by the renderer's sync entry point (as ``vllm.LLM.chat`` renders): a short prompt takes
less time to render than the hops to the pool and back, which showed as the tasks, futures and
thread switches of a bulk call's profile (docs/performance.md, "Bulk")."""


async def render(runtime: Runtime, request: Request) -> Any:
    """vLLM's engine input for ``request`` (its ``"prompt_token_ids"`` are the prompt)."""
    from vllm_inline.engine.seam import vllm_engine

    if request.prompt is not None:
        return await vllm_engine.render_prompt(runtime.running_llm(), request.prompt)
    check_images(request.images, runtime.media, runtime.model)
    if request.chat_template is not None:
        choice = resolve_chat_template(None, {}, request.chat_template)
    else:
        choice = runtime.template
        require_template(choice, runtime.model)
    try:
        return await vllm_engine.render_chat(
            runtime.running_llm(),
            request.messages or [],
            chat_template=choice.template,
            chat_template_kwargs=request.chat_template_kwargs,
            tools=request.tools,
            offload=bool(request.images) or _text_chars(request) > OFFLOAD_CHARS,
        )
    except VLLMInlineError:
        raise
    except Exception as e:
        mapped = vllm_engine.map_error(e, runtime.model)
        if isinstance(mapped, (ContextLengthExceededError, EngineDeadError)):
            raise mapped from e
        if request.images and (mapped is not None or vllm_engine.is_media_error(e)):
            # The model's processor (or vLLM's media loader) refused an image.
            raise BadRequestError(
                f"{runtime.model!r} could not take the images of these messages: "
                f"{type(e).__name__}: {e}. Check the images (format, size, count).",
                parameter="messages",
                value=None,
            ) from e
        raise ChatTemplateError(
            f"The chat template of {runtime.model!r} ({choice.source}) failed to render these "
            f"messages: {type(e).__name__}: {e}. Check the roles and order the template "
            "accepts, or pass chat_template=...",
            parameter="messages",
            value=None,
        ) from e


def _text_chars(request: Request) -> int:
    """The characters of a chat request's contents, tool-call arguments and tools: about the
    size of what the template renders and the tokenizer encodes."""
    total = len(str(request.tools)) if request.tools else 0
    for message in request.messages or ():
        content = message.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(part.get("text") or "") for part in content if isinstance(part, dict))
        for call in message.get("tool_calls") or ():
            total += len(str(call.get("function", {}).get("arguments") or ""))
    return total


async def prompt_token_ids(runtime: Runtime, request: Request) -> list[int]:
    """The token ids a stream of ``request`` would prefill (on the engine loop)."""
    async with runtime.guard("prompt rendering"):
        return list((await render(runtime, request))["prompt_token_ids"])
