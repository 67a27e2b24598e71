"""vLLM's tool and reasoning parsers, as :mod:`vllm_inline.engine.stream.parsing` uses them (the
companion of :mod:`.vllm_engine`).

vLLM's parsers take its OpenAI server's ``ChatCompletionRequest``, an internal type that changes
between releases (0.33 made ``skip_special_tokens`` optional); everything vllm-inline reads or
sets on it, and every parser call whose shape differs between the supported releases, is here.

Imported only when a request needs a parser (it imports vLLM).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser import ParserManager
from vllm.reasoning import ReasoningParserManager
from vllm.tool_parsers import ToolParserManager

try:
    from vllm.renderers.chat_utils import make_tool_call_id
except ImportError:  # vLLM < 0.32 keeps it with the server's chat utilities
    from vllm.entrypoints.chat_utils import (  # type: ignore[import-not-found,no-redef]
        make_tool_call_id,
    )

__all__ = [
    "chat_completion_request",
    "import_tool_parser",
    "make_tool_call_id",
    "parser_class",
    "registered",
    "required_skip_special_tokens",
    "set_prompt_token_ids",
]


@lru_cache(maxsize=64)
def parser_class(tool_parser: str | None, reasoning_parser: str | None, model: str) -> Any:
    """vLLM's ``Parser`` class composing the named tool and reasoning parsers."""
    return ParserManager.get_parser(
        tool_parser_name=tool_parser,
        reasoning_parser_name=reasoning_parser,
        enable_auto_tools=True,
        model_name=model,
    )


def import_tool_parser(path: str) -> None:
    """Run a ``--tool-parser-plugin`` file, which registers its parser with vLLM."""
    ToolParserManager.import_tool_parser(path)


def registered(kind: str) -> list[str]:
    """The names vLLM registers for ``kind`` (``"tool_parser"`` or ``"reasoning_parser"``)."""
    manager: Any = ToolParserManager if kind == "tool_parser" else ReasoningParserManager
    names = getattr(manager, "list_registered", None)
    if callable(names):
        return sorted(names())
    return sorted(set(getattr(manager, "lazy_parsers", {})) | set(getattr(manager, "parsers", {})))


def chat_completion_request(
    *,
    model: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    tool_choice: Any,
    chat_template_kwargs: Mapping[str, Any],
    parallel_tool_calls: bool | None = None,
) -> Any:
    """The server request the parsers read: reasoning included, streamed; ``parallel_tool_calls``
    as the client's (``None``: the request's default), which ``adjust_request`` reads (vLLM 0.32+
    puts ``maxItems: 1`` in the ``required`` grammar for ``False``; 0.30 and 0.31 ignore it)."""
    # Any: the server's pydantic model, whose fields mypy reads without pydantic's plugin (every
    # field looks required) and whose message and tool types are the server's TypedDicts; the
    # checked OpenAI-style dicts are what it validates.
    request_type: Any = ChatCompletionRequest
    more = {} if parallel_tool_calls is None else {"parallel_tool_calls": parallel_tool_calls}
    return request_type(
        model=model,
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        chat_template_kwargs=dict(chat_template_kwargs),
        include_reasoning=True,
        stream=True,
        **more,
    )


def required_skip_special_tokens(request: Any) -> bool | None:
    """``False`` when the parsers need special tokens kept in the text, else ``None``.

    A parser's ``adjust_request`` sets ``request.skip_special_tokens = False`` when it reads
    special tokens (``hermes``: ``<tool_call>``). What it leaves differs between releases: up to
    0.32 the field defaults to ``True``, from 0.33 to ``None`` (the server then takes the model's
    ``generation_config`` value, else ``True``). Only an explicit ``False`` is a requirement, so
    both shapes read the same; the model's default and the caller's value are layered by
    :func:`vllm_inline.engine.request.sampling.final_sampling`, as vLLM's server does.
    """
    return False if request.skip_special_tokens is False else None


def set_prompt_token_ids(parser: Any, prompt_token_ids: Sequence[int]) -> None:
    """Give a parser the rendered prompt before a whole-output ``parse``.

    vLLM 0.32 added ``Parser.set_prompt_token_ids`` (a no-op there, state for some parsers
    later); older releases have no such call, and their parsers need nothing.
    """
    setter = getattr(parser, "set_prompt_token_ids", None)
    if setter is not None:
        setter(list(prompt_token_ids))
