"""How a request's prompt is rendered, beyond the messages: the options of ``vllm serve``'s chat
and completion requests that reach vLLM's renderer, under vLLM's own names.

:func:`pop_prompt_options` takes them out of a call's keyword arguments and checks them (a bad
one is a :class:`BadRequestError` naming it, before any engine work);
:mod:`vllm_inline.engine.request.render` hands them to vLLM's renderer as vLLM's server does
(``ChatCompletionRequest.build_chat_params`` / ``build_tok_params`` and the renderer's
``prompt_extras``, vLLM 0.30-0.34).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_inline.engine.errors import BadRequestError

__all__ = ["REASONING_EFFORTS", "PromptOptions", "pop_prompt_options"]

REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
"""``reasoning_effort`` values ``vllm serve`` takes (OpenAI's, and DeepSeek V4's ``max``)."""


@dataclass(frozen=True)
class PromptOptions:
    """A request's rendering options (the defaults render as ``vllm serve`` does unasked)."""

    add_generation_prompt: bool = True
    """End the prompt with the template's generation prompt (the assistant's header)."""
    continue_final_message: bool = False
    """Leave the last message open for the model to continue (a prefilled answer). It turns
    the generation prompt off unless ``add_generation_prompt=True`` is also given, which is
    refused as vLLM refuses it."""
    documents: tuple[Mapping[str, str], ...] | None = None
    """Documents for a RAG chat template (its ``documents`` variable; no effect on others)."""
    reasoning_effort: str | None = None
    """OpenAI's ``reasoning_effort``: a template variable, and ``enable_thinking`` (``False``
    for ``"none"``) unless ``chat_template_kwargs`` sets it, as vLLM's server does."""
    add_special_tokens: bool | None = None
    """Add the tokenizer's special tokens (BOS) on top of the template's. ``None``: no for
    chat messages (the template adds them), yes for a ``prompt``."""
    truncate_prompt_tokens: int | None = None
    """Keep only this many prompt tokens (``-1``: the context window)."""
    truncation_side: str | None = None
    """``"left"`` (keep the last tokens) or ``"right"`` (keep the first), with
    ``truncate_prompt_tokens``; ``None``: the tokenizer's side."""
    cache_salt: str | None = None
    """Salt for vLLM's prefix cache: requests with other salts never share cached blocks."""
    mm_processor_kwargs: Mapping[str, Any] | None = None
    """Keyword arguments for the model's multimodal (HF) processor."""
    media_io_kwargs: Mapping[str, Mapping[str, Any]] | None = None
    """Keyword arguments for vLLM's media loaders, by modality (``{"image": {...}}``)."""
    suffix: str | None = None
    """With a ``prompt``: the text after the gap to fill (fill-in-the-middle), rendered by
    vLLM's renderer for models that have FIM rendering (a 400 for others, as vLLM)."""

    def template_kwargs(self) -> dict[str, Any]:
        """The template variables these options set (``ChatCompletionRequest.build_chat_params``
        of vLLM's server); unset ones left out."""
        out: dict[str, Any] = {
            "add_generation_prompt": self.add_generation_prompt,
            "continue_final_message": self.continue_final_message,
        }
        if self.documents is not None:
            out["documents"] = [dict(d) for d in self.documents]
        if self.reasoning_effort is not None:
            out["reasoning_effort"] = self.reasoning_effort
        return out

    def prompt_extras(self) -> dict[str, Any]:
        """What vLLM's renderer adds to the engine input (``prompt_extras``)."""
        extras: dict[str, Any] = {}
        if self.mm_processor_kwargs is not None:
            extras["mm_processor_kwargs"] = dict(self.mm_processor_kwargs)
        if self.cache_salt is not None:
            extras["cache_salt"] = self.cache_salt
        return extras


def _flag(options: dict[str, Any], name: str, default: bool | None) -> bool | None:
    value = options.pop(name, None)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequestError.invalid(name, value, "true or false")
    return value


def _mapping(options: dict[str, Any], name: str) -> Mapping[str, Any] | None:
    value = options.pop(name, None)
    if value is not None and not isinstance(value, Mapping):
        raise BadRequestError.invalid(name, value, "a mapping")
    return value


def pop_prompt_options(options: dict[str, Any]) -> PromptOptions:
    """The rendering options of a call, taken out of ``options`` and checked."""
    continue_final = bool(_flag(options, "continue_final_message", False))
    generation = _flag(options, "add_generation_prompt", None)
    if continue_final and generation:
        raise BadRequestError(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True: "
            "continue the last message, or start a new one after it.",
            parameter="continue_final_message",
            value=True,
        )
    documents = options.pop("documents", None)
    if documents is not None and not (
        isinstance(documents, (list, tuple))
        and all(
            isinstance(d, Mapping) and all(isinstance(v, str) for v in d.values())
            for d in documents
        )
    ):
        raise BadRequestError.invalid(
            "documents", documents, "a list of {'title': str, 'text': str, ...} mappings"
        )
    effort = options.pop("reasoning_effort", None)
    if effort is not None and effort not in REASONING_EFFORTS:
        raise BadRequestError.invalid("reasoning_effort", effort, f"one of {REASONING_EFFORTS}")
    truncate = options.pop("truncate_prompt_tokens", None)
    if truncate is not None and (
        isinstance(truncate, bool) or not isinstance(truncate, numbers.Integral) or truncate < -1
    ):
        raise BadRequestError.invalid(
            "truncate_prompt_tokens", truncate, "an integer >= 1, or -1 (the context window)"
        )
    side = options.pop("truncation_side", None)
    if side not in (None, "left", "right"):
        raise BadRequestError.invalid("truncation_side", side, "'left' or 'right'")
    salt = options.pop("cache_salt", None)
    if salt is not None and not (isinstance(salt, str) and 1 <= len(salt) <= 1024):
        raise BadRequestError.invalid("cache_salt", salt, "a string of 1 to 1024 characters")
    media = _mapping(options, "media_io_kwargs")
    if media is not None and not all(isinstance(v, Mapping) for v in media.values()):
        raise BadRequestError.invalid(
            "media_io_kwargs", media, "a mapping of modality to a mapping of options"
        )
    suffix = options.pop("suffix", None)
    if suffix is not None and not isinstance(suffix, str):
        raise BadRequestError.invalid("suffix", suffix, "a string")
    if suffix is not None and truncate is not None:
        raise BadRequestError(
            "suffix is not supported with truncate_prompt_tokens", parameter="suffix", value=suffix
        )
    return PromptOptions(
        suffix=suffix,
        add_generation_prompt=not continue_final if generation is None else generation,
        continue_final_message=continue_final,
        documents=tuple(documents) if documents is not None else None,
        reasoning_effort=effort,
        add_special_tokens=_flag(options, "add_special_tokens", None),
        truncate_prompt_tokens=int(truncate) if truncate is not None else None,
        truncation_side=side,
        cache_salt=salt,
        mm_processor_kwargs=_mapping(options, "mm_processor_kwargs"),
        media_io_kwargs=media,
    )
