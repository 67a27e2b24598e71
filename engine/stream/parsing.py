"""Generated text -> answer text, reasoning and tool-call fragments, with vLLM's own parsers.

Plain requests pass text through untouched. With tools or a ``reasoning_parser``, every choice gets
one of vLLM's ``Parser`` objects (``vllm.parser.ParserManager``: tool parsers such as
``hermes``/``llama3_json``, reasoning parsers such as ``qwen3``/``deepseek_r1``), fed the deltas as
they arrive, exactly as vLLM's OpenAI server does. Those parsers take the server's
``ChatCompletionRequest``; building it (in :mod:`vllm_inline.engine.seam.vllm_parsing`, with every
other vLLM name the parsers need) is the only wrapping done here, and it also yields the
structured-output constraint that enforces ``tool_choice="required"`` or a named tool.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any, cast

from vllm_inline.engine.errors import BadRequestError
from vllm_inline.engine.seam.vllm_types import (
    ChatCompletionRequest,
    ModelConfig,
    Parser,
    TokenizerLike,
)
from vllm_inline.engine.stream.deltas import ToolCallDelta

__all__ = [
    "DEFAULT_TOOL_PARSERS",
    "OutputParser",
    "ParserFactory",
    "check_parsers",
    "make_parser_factory",
]

DEFAULT_TOOL_PARSERS: Mapping[str, str] = {"chatml": "hermes", "llama3": "llama3_json"}
"""Tool parser used for a chat family when tools are sent without ``tool_parser``."""

_Parsed = tuple[str, str, tuple[ToolCallDelta, ...]]


class OutputParser:
    """Pass-through: all generated text is answer text."""

    called_tools = False
    """True once a tool-call fragment was produced."""

    def feed(self, text: str, token_ids: Sequence[int], finished: bool) -> _Parsed:
        """Split one delta into ``(text, reasoning, tool_call_fragments)``."""
        return text, "", ()

    def parse(self, text: str, token_ids: Sequence[int]) -> _Parsed:
        """Split a whole answer (a final-only request) as :meth:`feed` splits its deltas."""
        return text, "", ()


class _VLLMOutputParser(OutputParser):
    """One vLLM ``Parser`` per choice, driven by ``parse_delta``."""

    def __init__(
        self,
        parser: Parser,
        request: ChatCompletionRequest,
        prompt_token_ids: list[int],
        hidden: re.Pattern[str] | None = None,
    ) -> None:
        self._parser = parser
        self._request = request
        self._prompt_token_ids: list[int] | None = prompt_token_ids
        self._hidden = hidden
        self.called_tools = False

    def _visible(self, text: str) -> str:
        """``text`` without the special tokens the caller asked to have skipped (a parser needed
        them in the text it reads; those it did not consume are not the caller's text). A special
        token reaches the parser whole in one delta: vLLM detokenizes it as one piece."""
        return self._hidden.sub("", text) if self._hidden is not None and text else text

    def feed(self, text: str, token_ids: Sequence[int], finished: bool) -> _Parsed:
        message = self._parser.parse_delta(
            text, list(token_ids), self._request, self._prompt_token_ids, finished=finished
        )
        self._prompt_token_ids = None  # only looked at once
        if message is None:
            return "", "", ()
        calls = tuple(
            ToolCallDelta(
                index=call.index,
                id=call.id,
                name=call.function.name if call.function else None,
                arguments=(call.function.arguments or "") if call.function else "",
            )
            for call in message.tool_calls or ()
        )
        if calls:
            self.called_tools = True
        return self._visible(message.content or ""), self._visible(message.reasoning or ""), calls

    def parse(self, text: str, token_ids: Sequence[int]) -> _Parsed:
        # As vLLM's server answers a request without stream: ``Parser.parse`` on the whole
        # output (feeding it to ``parse_delta`` as one delta is not what its streaming tool
        # parsers are written for), after the prompt, for parsers that need its state.
        from vllm_inline.engine.seam.vllm_parsing import make_tool_call_id, set_prompt_token_ids

        if self._prompt_token_ids is not None:
            set_prompt_token_ids(self._parser, self._prompt_token_ids)
        reasoning, content, functions = self._parser.parse(
            text, self._request, enable_auto_tools=True, model_output_token_ids=list(token_ids)
        )
        calls = tuple(
            ToolCallDelta(
                index=i, id=f.id or make_tool_call_id(), name=f.name, arguments=f.arguments or ""
            )
            for i, f in enumerate(functions or ())
        )
        if calls:
            self.called_tools = True
        reasoning = (reasoning or "") if self._request.include_reasoning else ""
        return self._visible(content or ""), self._visible(reasoning), calls


class ParserFactory:
    """Makes one :class:`OutputParser` per choice of a request."""

    structured_outputs: Mapping[str, Any] | None = None
    """Constraint the parsers need (``tool_choice="required"`` or a named tool), if any."""
    skip_special_tokens: bool | None = None
    """``False`` when the parsers need special tokens kept in the text; ``None``: no need."""

    def __call__(self, prompt_token_ids: list[int]) -> OutputParser:
        return OutputParser()

    def hide_special_tokens(self) -> None:
        """Have the parsers made from now on remove the tokenizer's special tokens from the text
        and reasoning they return: the caller asked for them skipped, the parsers needed them
        (:attr:`skip_special_tokens`), so the engine kept them. Nothing to do without parsers."""


class _VLLMParserFactory(ParserFactory):
    def __init__(
        self,
        parser_cls: type[Parser],
        tokenizer: TokenizerLike,
        request: ChatCompletionRequest,
        model_config: ModelConfig,
    ) -> None:
        self._parser_cls = parser_cls
        self._tokenizer = tokenizer
        self._model_config = model_config
        # vLLM types a parser's tools as those of all its APIs (a list of their union), and
        # adjust_request as taking and returning either API's request: ours are the chat API's.
        tools: Any = request.tools
        probe = parser_cls(
            tokenizer,
            tools,
            model_config=model_config,
            chat_template_kwargs=request.chat_template_kwargs or {},
        )
        self._request = cast(ChatCompletionRequest, probe.adjust_request(request))
        so = self._request.structured_outputs
        if so is not None and so.structural_tag:
            so.structural_tag = _tighten_structural_tag(so.structural_tag)
        if so is not None:
            self.structured_outputs = {
                k: v
                for k, v in {
                    "json": so.json,
                    "regex": so.regex,
                    "choice": so.choice,
                    "grammar": so.grammar,
                    "structural_tag": so.structural_tag,
                    "json_object": so.json_object,
                }.items()
                if v is not None
            }
        from vllm_inline.engine.seam.vllm_parsing import required_skip_special_tokens

        self.skip_special_tokens = required_skip_special_tokens(self._request)
        self._hidden: re.Pattern[str] | None = None

    def hide_special_tokens(self) -> None:
        self._hidden = _special_tokens(self._tokenizer)

    def __call__(self, prompt_token_ids: list[int]) -> OutputParser:
        tools: Any = self._request.tools  # as in __init__
        parser = self._parser_cls(
            self._tokenizer,
            tools,
            model_config=self._model_config,
            chat_template_kwargs=self._request.chat_template_kwargs or {},
        )
        return _VLLMOutputParser(parser, self._request, prompt_token_ids, self._hidden)


@lru_cache(maxsize=16)
def _special_tokens(tokenizer: TokenizerLike) -> re.Pattern[str] | None:
    """A pattern of the texts ``skip_special_tokens`` leaves out: the added tokens marked special
    (what a Hugging Face fast tokenizer skips), else the tokenizer's named special tokens; longest
    first, so that no match leaves part of a longer token. Once per tokenizer (an engine's)."""
    added: Any = getattr(tokenizer, "added_tokens_decoder", None)
    if isinstance(added, Mapping) and added:
        found = {str(t.content) for t in added.values() if getattr(t, "special", False)}
    else:
        found = {str(t) for t in getattr(tokenizer, "all_special_tokens", ())}
    tokens = sorted((t for t in found if t), key=len, reverse=True)
    return re.compile("|".join(map(re.escape, tokens))) if tokens else None


def _tighten_structural_tag(tag: str) -> str:
    """Make a forced tool call end: compact JSON, and one call.

    vLLM's engine-wide ``disable_any_whitespace`` does not reach structural tags, so a weak model
    can pad the forced arguments with whitespace until ``max_tokens``: allow at most one
    whitespace character between JSON tokens. And after the first call end the constraint
    (``stop_after_first``) instead of letting such a model start call after call.
    """
    spec = json.loads(tag)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "tags_with_separator":
                node["stop_after_first"] = True
            if node.get("type") == "json_schema" and node.get("max_whitespace_cnt") is None:
                node["max_whitespace_cnt"] = 1
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(spec)
    return json.dumps(spec)


def check_parser_name(kind: str, name: Any) -> None:
    """Refuse an unknown ``tool_parser``/``reasoning_parser`` name, listing the known ones."""
    if name is None:
        return
    from vllm_inline.engine.seam.vllm_parsing import registered

    known = registered(kind)
    if not isinstance(name, str) or name not in known:
        raise BadRequestError.invalid(kind, name, f"one of {known}")


def make_parser_factory(
    *,
    tokenizer: TokenizerLike,
    model_config: ModelConfig,
    model: str,
    family: str | None,
    messages: list[dict[str, Any]] | None,
    tools: list[dict[str, Any]] | None,
    tool_choice: str | None,
    tool_parser: str | None,
    reasoning_parser: str | None,
    chat_template_kwargs: Mapping[str, Any] | None,
    parallel_tool_calls: bool | None = None,
) -> ParserFactory:
    """The parser factory for a request: pass-through unless tools or reasoning are involved.
    ``parallel_tool_calls=False`` reaches the parser's request, whose ``adjust_request``
    constrains the calls to one where vLLM does."""
    check_parser_name("tool_parser", tool_parser)
    check_parser_name("reasoning_parser", reasoning_parser)
    wants_tools = bool(tools) and tool_choice != "none"
    if wants_tools and tool_parser is None:
        tool_parser = DEFAULT_TOOL_PARSERS.get(family or "")
        if tool_parser is None:
            raise BadRequestError(
                f"Tools were given but no tool_parser is set and {model!r} is not of a family with a "
                f"default ({dict(DEFAULT_TOOL_PARSERS)}). Pass tool_parser='<name>' "
                "(e.g. 'hermes', 'llama3_json', 'mistral', 'pythonic').",
                parameter="tool_parser",
                value=None,
            )
    if not wants_tools:
        tool_parser = None
    if tool_parser is None and reasoning_parser is None:
        return ParserFactory()
    from vllm_inline.engine.seam.vllm_parsing import chat_completion_request, parser_class

    choice: Any = tool_choice
    if tool_choice not in (None, "auto", "none", "required"):
        choice = {"type": "function", "function": {"name": tool_choice}}
    if tools and tool_choice not in (None, "auto", "none"):
        # A forced call must satisfy the tool's schema, not merely be JSON: vLLM puts a tool's
        # schema into the structured-output constraint only for strict tools.
        tools = [{**t, "function": {**t["function"], "strict": True}} for t in tools]
    try:
        request = chat_completion_request(
            model=model,
            messages=messages or [{"role": "user", "content": ""}],
            tools=tools if wants_tools else None,
            tool_choice=choice if wants_tools else "none",
            chat_template_kwargs=chat_template_kwargs or {},
            parallel_tool_calls=parallel_tool_calls,
        )
        parser_cls = parser_class(tool_parser, reasoning_parser, model)
        return _VLLMParserFactory(parser_cls, tokenizer, request, model_config)
    except BadRequestError:
        raise
    except Exception as e:
        name = "tool_parser" if tool_parser else "reasoning_parser"
        raise BadRequestError(
            f"vLLM's {name} {tool_parser or reasoning_parser!r} cannot serve this request for "
            f"{model!r}: {e}",
            parameter=name,
            value=tool_parser or reasoning_parser,
        ) from e


def check_parsers(
    tokenizer: TokenizerLike, model: str, tool_parser: str | None, reasoning_parser: str | None
) -> None:
    """Start the named parsers once on ``tokenizer``, as ``vllm serve`` does at its start
    (``ParserManager.validate_parser_tokenizer``): a parser whose tokens the tokenizer lacks is
    a :class:`ValueError` naming it and what it misses, before any request."""
    check_parser_name("tool_parser", tool_parser)
    check_parser_name("reasoning_parser", reasoning_parser)
    if tool_parser is None and reasoning_parser is None:
        return
    from vllm_inline.engine.seam.vllm_parsing import parser_class

    try:
        parser_class(tool_parser, reasoning_parser, model)(tokenizer)
    except Exception as e:
        named = " and ".join(
            f"{kind} {name!r}"
            for kind, name in (("tool_parser", tool_parser), ("reasoning_parser", reasoning_parser))
            if name is not None
        )
        msg = f"vLLM's {named} cannot start on the tokenizer of {model!r}: {e}"
        raise ValueError(msg) from e
