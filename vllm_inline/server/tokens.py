"""``/tokenize``, ``/detokenize`` and ``/version``, as ``vllm serve`` has them (vLLM 0.30-0.34,
``vllm/entrypoints/serve/tokenize/``).

``/tokenize`` renders chat ``messages`` (with ``tools``, the template options) or tokenizes a
``prompt`` exactly as a chat or completion request would be rendered: through the engine's
own rendering (:meth:`Engine.aprompt_token_ids <vllm_inline.engine.Engine.aprompt_token_ids>`,
vLLM's renderer), so ``count`` is the prompt size a request pays. ``/detokenize`` turns ids
back into text with the model's tokenizer. ``/version`` names the vLLM release underneath,
which is what ``vllm serve`` answers and what clients read to know the API they talk to.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, Request

from vllm_inline.engine import BadRequestError
from vllm_inline.engine.request.request import non_token_id_at
from vllm_inline.server.chat import read_body
from vllm_inline.server.errors import InvalidBodyError
from vllm_inline.server.limits import Limits
from vllm_inline.server.models import ServedModel, ServedModels
from vllm_inline.server.requests import check_fields, check_unknown

__all__ = ["CHAT_FIELDS", "CHAT_OPTIONS", "DETOKENIZE_FIELDS", "PROMPT_FIELDS", "tokens_router"]

CHAT_OPTIONS = (
    "tools",
    "chat_template",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "mm_processor_kwargs",
    "media_io_kwargs",
)
"""The rendering fields of vLLM's ``TokenizeChatRequest``, handed to the engine by name."""

CHAT_FIELDS = ("model", "messages", "return_token_strs", *CHAT_OPTIONS, "response_format")
"""Every field of vLLM's ``TokenizeChatRequest`` (0.30-0.34; ``response_format``, 0.34's, has
no effect on the ids). Others are ignored with a log line, or refused on a strict server, as on
the chat routes."""

PROMPT_FIELDS = ("model", "prompt", "add_special_tokens", "return_token_strs")
"""Every field of vLLM's ``TokenizeCompletionRequest`` (0.30-0.34)."""

DETOKENIZE_FIELDS = ("model", "tokens")
"""Every field of vLLM's ``DetokenizeRequest`` (0.30-0.34)."""


def tokens_router(models: ServedModels, limits: Limits) -> APIRouter:
    """The three routes, on the models of ``models``."""
    router = APIRouter()

    @router.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        body = await read_body(request)
        served = models.find(None, body.get("model"))
        check_unknown(body, CHAT_FIELDS if "messages" in body else PROMPT_FIELDS, limits)
        if "messages" in body:
            _trusted(body, limits)
            options = {k: body[k] for k in CHAT_OPTIONS if body.get(k) is not None}
            if served.chat_template is not None:  # the server's --chat-template
                options.setdefault("chat_template", served.chat_template)
            ids = await served.engine.aprompt_token_ids(body["messages"], **options)
        elif "prompt" in body:
            prompt = body["prompt"]
            if not isinstance(prompt, str):
                raise InvalidBodyError("body.prompt", "Input should be a valid string")
            special = body.get("add_special_tokens")
            options = {} if special is None else {"add_special_tokens": special}
            ids = await served.engine.aprompt_token_ids(prompt=prompt, **options)
        else:
            raise InvalidBodyError("body.messages", "Field required (or prompt)")
        tokenizer = await _tokenizer(served)
        strs = list(tokenizer.convert_ids_to_tokens(ids)) if body.get("return_token_strs") else None
        return {
            "count": len(ids),
            "max_model_len": served.engine.max_model_len,
            "tokens": ids,
            "token_strs": strs,
        }

    @router.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        body = await read_body(request)
        served = models.find(None, body.get("model"))
        check_unknown(body, DETOKENIZE_FIELDS, limits)
        tokens = body.get("tokens")
        if not isinstance(tokens, list):
            problem = "Field required" if tokens is None else "Input should be a valid list"
            raise InvalidBodyError("body.tokens", problem)
        bad = non_token_id_at(tokens)
        if bad is not None:
            raise InvalidBodyError(f"body.tokens.{bad}", "Input should be a non-negative integer")
        tokenizer = await _tokenizer(served)
        try:
            text = tokenizer.decode(tokens)
        except (OverflowError, TypeError, ValueError, IndexError) as e:
            raise BadRequestError.invalid("tokens", tokens, f"token ids of the model ({e})") from e
        return {"prompt": text}

    @router.get("/version")
    async def version() -> dict[str, str]:
        from vllm_inline.engine.seam.versions import installed_vllm

        found = installed_vllm()
        return {"version": found[1] if found else "unknown"}

    return router


def _trusted(body: Mapping[str, Any], limits: Limits) -> None:
    """The chat template and multimodal options only from trusted clients, as for a chat."""
    check_fields(
        {k: v for k, v in body.items() if k in CHAT_OPTIONS},
        "chat",
        Limits(
            trust_request_chat_template=limits.trust_request_chat_template,
            trust_request_mm_kwargs=limits.trust_request_mm_kwargs,
        ),
    )


async def _tokenizer(served: ServedModel) -> Any:
    """The model's tokenizer (starting its engine off the loop, if nothing has yet)."""
    return await asyncio.to_thread(lambda: served.engine.tokenizer)
