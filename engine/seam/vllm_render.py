"""vLLM's renderer as the request path uses it: chat messages and prompts become engine inputs
(prompt token ids), with the request's template variables, tokenization options and prompt
extras, as vLLM's OpenAI server renders them (``vllm/renderers/online_renderer.py``).

Imported only when an engine starts, as :mod:`.vllm_engine`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from vllm.renderers.inputs.preprocess import parse_model_prompt
from vllm.renderers.params import ChatParams
from vllm.v1.engine.async_llm import AsyncLLM

__all__ = ["fill_in_the_middle", "is_media_error", "render_chat", "render_prompt"]


async def render_chat(
    llm: AsyncLLM,
    messages: list[dict[str, Any]],
    *,
    chat_template: str | None,
    chat_template_kwargs: Mapping[str, Any] | None,
    tools: list[dict[str, Any]] | None,
    offload: bool = True,
    tok_kwargs: Mapping[str, Any] | None = None,
    prompt_extras: Mapping[str, Any] | None = None,
    media_io_kwargs: Mapping[str, Any] | None = None,
) -> Any:
    """Render ``messages`` with the model's template through vLLM's renderer; an engine input.
    ``offload``: in the renderer's thread pool (its async entry point, as vLLM's server), else
    on this thread, the engine loop (its sync entry point, as ``vllm.LLM.chat``).

    ``chat_template_kwargs`` are every template variable (``add_generation_prompt`` and the
    other request options included, as vLLM's ``build_chat_params`` merges them); ``tok_kwargs``
    change the tokenization (``add_special_tokens``, ``truncate_prompt_tokens``,
    ``truncation_side``: ``build_tok_params``); ``prompt_extras`` go into the engine input
    (``mm_processor_kwargs``, ``cache_salt``), as the server's ``preprocess_chat`` passes them."""
    renderer = llm.renderer
    extras = dict(prompt_extras or {})
    params = ChatParams(
        chat_template=chat_template,
        chat_template_kwargs={
            "add_generation_prompt": True,
            "continue_final_message": False,
            **(chat_template_kwargs or {}),
            "tools": tools,
        },
        media_io_kwargs=dict(media_io_kwargs) if media_io_kwargs else None,
        mm_processor_kwargs=extras.get("mm_processor_kwargs"),
    )
    # The template emits BOS itself, as in vLLM's chat API.
    tok_params = renderer.default_chat_tok_params.with_kwargs(
        **{"add_special_tokens": False, **(tok_kwargs or {})}
    )
    # Checked OpenAI-style dicts (request/messages.py); vLLM types them as its TypedDicts.
    conversations: list[Any] = [_renderer_copy(messages)]
    more: dict[str, Any] = {"prompt_extras": extras} if extras else {}
    if offload:
        _, (engine_input,) = await renderer.render_chat_async(
            conversations, params, tok_params, **more
        )
    else:
        _, (engine_input,) = renderer.render_chat(conversations, params, tok_params, **more)
    return engine_input


def _renderer_copy(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` as vLLM's renderer may take them.

    The renderer decodes tool-call arguments in place (``_postprocess_messages``): messages with
    ``tool_calls`` are deep-copied, so the request's messages (also given to the output parsers)
    keep their JSON-string arguments. The others are handed over as they are: the renderer
    builds new messages from them and changes nothing in them, and a deep copy of every message
    of every request was 6 % of the caller's CPU in a 256-input batch.
    """
    out = []
    for message in messages:
        if message.get("tool_calls"):
            # PIL images are shared, not copied: the memo maps each to itself.
            content = message.get("content")
            memo = {
                id(part["image_pil"]): part["image_pil"]
                for part in (content if isinstance(content, list) else ())
                if part.get("type") == "image_pil"
            }
            message = copy.deepcopy(message, memo)
        out.append(message)
    return out


def is_media_error(e: BaseException) -> bool:
    """True for an error of vLLM's media loading (a fetch that failed or timed out)."""
    import asyncio

    import aiohttp

    return isinstance(e, (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError))


async def render_prompt(
    llm: AsyncLLM,
    prompt: str | list[int],
    *,
    tok_kwargs: Mapping[str, Any] | None = None,
    prompt_extras: Mapping[str, Any] | None = None,
) -> Any:
    """Tokenize a pre-formatted prompt as is (no template; token ids are taken as they are)
    into an engine input;
    ``tok_kwargs`` and ``prompt_extras`` as in :func:`render_chat`."""
    renderer = llm.renderer
    parsed = parse_model_prompt(llm.model_config, prompt)
    if not tok_kwargs and not prompt_extras:
        (engine_input,) = await renderer.render_cmpl_async([parsed])
        return engine_input
    tok_params = renderer.default_cmpl_tok_params.with_kwargs(**(tok_kwargs or {}))
    (engine_input,) = await renderer.render_cmpl_async(
        [parsed], tok_params, prompt_extras=dict(prompt_extras or {})
    )
    return engine_input


def fill_in_the_middle(llm: AsyncLLM, prompt: str, suffix: str) -> str | None:
    """The prompt of a fill-in-the-middle request, as vLLM's renderer writes it for models
    that have FIM rendering (``render_completion_suffix``, vLLM 0.31+: in the contract with its
    ``since``); ``None`` for others."""
    render_suffix = getattr(llm.renderer, "render_completion_suffix", None)
    if render_suffix is None:  # vLLM 0.30 has no FIM rendering
        return None
    rendered = render_suffix(prompt, suffix)
    return None if rendered is None else str(rendered)
