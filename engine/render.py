"""Rendering: a :class:`~.request.Request` becomes the prompt token ids vLLM prefills.

The second step of the request path, on the engine loop. Chat messages go through vLLM's
renderer with the template chosen at start (:mod:`.templates`) or the request's own, tools and
``chat_template_kwargs`` included; a pre-formatted ``prompt`` is tokenized as is. A template
that refuses the messages is a :class:`ChatTemplateError` naming ``messages``.
"""

from __future__ import annotations

from typing import Any

from .errors import (
    BadRequestError,
    ChatTemplateError,
    ContextLengthExceededError,
    EngineDeadError,
    VLLMInlineError,
)
from .images import check_images
from .request import Request
from .runtime import Runtime
from .templates import require_template, resolve_chat_template

__all__ = ["prompt_token_ids", "render"]


async def render(runtime: Runtime, request: Request) -> Any:
    """vLLM's engine input for ``request`` (its ``"prompt_token_ids"`` are the prompt)."""
    from . import _vllm

    if request.prompt is not None:
        return await _vllm.render_prompt(runtime.llm, request.prompt)
    check_images(request.images, runtime.media, runtime.model)
    if request.chat_template is not None:
        choice = resolve_chat_template(None, {}, request.chat_template)
    else:
        choice = runtime.template
        require_template(choice, runtime.model)
    try:
        return await _vllm.render_chat(
            runtime.llm,
            request.messages,
            chat_template=choice.template,
            chat_template_kwargs=request.chat_template_kwargs,
            tools=request.tools,
        )
    except VLLMInlineError:
        raise
    except Exception as e:
        mapped = _vllm.map_error(e, runtime.model)
        if isinstance(mapped, (ContextLengthExceededError, EngineDeadError)):
            raise mapped from e
        if request.images and (mapped is not None or _vllm.is_media_error(e)):
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


async def prompt_token_ids(runtime: Runtime, request: Request) -> list[int]:
    """The token ids a stream of ``request`` would prefill (on the engine loop)."""
    async with runtime.guard("prompt rendering"):
        return list((await render(runtime, request))["prompt_token_ids"])
