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
from vllm_inline.engine.request.prompt_options import PromptOptions
from vllm_inline.engine.request.request import Request

__all__ = ["OFFLOAD_CHARS", "prompt_token_ids", "render", "template_kwargs"]

OFFLOAD_CHARS = 8192
"""Chat messages with more text than this, or with images, are rendered by vLLM's async
renderer, which applies the template and tokenizes (and loads media) in its thread pool, so
that the engine loop keeps serving other streams meanwhile. Shorter ones are rendered on the
loop by the renderer's sync entry point (as ``vllm.LLM.chat`` renders): a short prompt takes
less time to render than the hops to the pool and back, which showed as the tasks, futures and
thread switches of a bulk call's profile (docs/performance.md, "Bulk")."""


async def render(runtime: Runtime, request: Request) -> Any:
    """vLLM's engine input for ``request`` (its ``"prompt_token_ids"`` are the prompt)."""
    from vllm_inline.engine.seam import vllm_engine, vllm_render

    options = request.prompt_options
    tok_kwargs = _tok_kwargs(options)
    if request.prompt is not None:
        prompt = request.prompt
        if options.suffix is not None:
            if not isinstance(prompt, str):
                raise BadRequestError(
                    "suffix requires text prompt input for FIM completion rendering",
                    parameter="suffix",
                    value=options.suffix,
                )
            filled = vllm_render.fill_in_the_middle(runtime.running_llm(), prompt, options.suffix)
            if filled is None:
                raise BadRequestError(
                    f"suffix is only supported for models with FIM completion rendering; "
                    f"{runtime.model!r} has none in vLLM.",
                    parameter="suffix",
                    value=options.suffix,
                )
            prompt = filled
        return await vllm_render.render_prompt(
            runtime.running_llm(),
            prompt,
            tok_kwargs=tok_kwargs,
            prompt_extras=options.prompt_extras(),
        )
    check_images(request.images, runtime.media, runtime.model)
    if request.chat_template is not None:
        choice = resolve_chat_template(None, {}, request.chat_template)
    else:
        choice = runtime.template
        require_template(choice, runtime.model)
    try:
        return await vllm_render.render_chat(
            runtime.running_llm(),
            request.messages or [],
            chat_template=choice.template,
            chat_template_kwargs=template_kwargs(request),
            tools=request.tools,
            offload=bool(request.images) or _text_chars(request) > OFFLOAD_CHARS,
            tok_kwargs=tok_kwargs,
            prompt_extras=options.prompt_extras(),
            media_io_kwargs=options.media_io_kwargs,
        )
    except VLLMInlineError:
        raise
    except Exception as e:
        mapped = vllm_engine.map_error(e, runtime.model)
        if isinstance(mapped, (ContextLengthExceededError, EngineDeadError)):
            raise mapped from e
        if request.images and (mapped is not None or vllm_render.is_media_error(e)):
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


def template_kwargs(request: Request) -> dict[str, Any]:
    """Every template variable of a chat request: the caller's ``chat_template_kwargs`` under
    the request's rendering options, as vLLM's ``build_chat_params`` merges them (a
    ``reasoning_effort`` also sets ``enable_thinking``, ``False`` for ``"none"``, unless the
    caller's kwargs set it: templates such as Gemma 4's think only when asked)."""
    user = dict(request.chat_template_kwargs or {})
    extra = request.prompt_options.template_kwargs()
    effort = request.prompt_options.reasoning_effort
    if effort is not None and "enable_thinking" not in user:
        extra["enable_thinking"] = effort != "none"
    return {**user, **extra}


def _tok_kwargs(options: PromptOptions) -> dict[str, Any]:
    """vLLM's ``TokenizeParams`` changes the options ask for (``build_tok_params``)."""
    out: dict[str, Any] = {}
    if options.add_special_tokens is not None:
        out["add_special_tokens"] = options.add_special_tokens
    if options.truncate_prompt_tokens is not None:
        out["truncate_prompt_tokens"] = options.truncate_prompt_tokens
    if options.truncation_side is not None:
        out["truncation_side"] = options.truncation_side
    return out


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
