"""Scenarios: the scripted models, what each one emits and what a correct integration returns.

A :class:`Scenario` names a family, a chat template and one or more :class:`Chain` s (the token
scripts greedy decoding follows after a given prompt end). :data:`SCENARIOS` holds the ones the
kit builds; :func:`expected_answer` is the text a correct integration returns for a chat turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .families import FAMILIES, chat_template

__all__ = ["SCENARIOS", "Chain", "Scenario", "expected_answer"]


@dataclass(frozen=True)
class Chain:
    """One scripted path: the tokens greedy decoding emits after a given prompt end."""

    script: tuple[str, ...]
    """Token strings in emission order: answer, then ``stop``, then the hallucinated tail
    (after its last token the model emits ``stop`` again, so the tail repeats)."""
    stop: str
    """The end token a correct integration stops at (its first occurrence in ``script``)."""
    answer: str
    """Decoded text before ``stop``: what a correct integration returns."""
    tail: str
    """Decoded text after ``stop`` (special tokens skipped): must never reach the user."""


def _chain(family: str, *pieces: str, stop: str) -> Chain:
    specials = set(FAMILIES[family].specials)

    def text(ps: tuple[str, ...]) -> str:
        return "".join(p for p in ps if p not in specials)

    cut = pieces.index(stop)
    return Chain(script=pieces, stop=stop, answer=text(pieces[:cut]), tail=text(pieces[cut + 1 :]))


@dataclass(frozen=True)
class Scenario:
    """A scripted model: its family, its scripts and what tests should expect from it."""

    name: str
    """Key in :data:`SCENARIOS` and prefix of the built model directory."""
    family: str
    """``"llama3"``, ``"chatml"`` (Qwen) or ``"gemma"``: special tokens and template style."""
    chat: Chain
    """Emitted after the chat template's generation prompt (a user turn, or any turn for
    models without other chains)."""
    tokenizer_eos: str
    """``eos_token`` in ``tokenizer_config.json``; its id is ``config.json``'s
    ``eos_token_id``."""
    eos_tokens: tuple[str, ...]
    """``generation_config.json``'s ``eos_token_id`` list (as token strings): the engine's stop
    set. It can hold more than ``tokenizer_eos`` (Llama 3, Gemma, Qwen do)."""
    chat_template: str
    """The Jinja chat template saved in ``tokenizer_config.json`` (one of the kit's
    ``templates/*.jinja``, read by :func:`~vllm_inline.testing.families.chat_template`)."""
    generation_defaults: tuple[tuple[str, Any], ...] = ()
    """Sampling defaults written to ``generation_config.json`` (as the real model ships them);
    none of them can move greedy decoding off the script."""
    completion_prompt: str | None = None
    """A plain (no chat template) prompt whose last token starts ``completion``."""
    completion: Chain | None = None
    """Emitted after ``completion_prompt`` (with the tokenizer's BOS, if any); it stops at the
    family's end-of-text token (``<|end_of_text|>``, ``<|endoftext|>``, ``<eos>``)."""
    after_tool: Chain | None = None
    """Emitted instead of ``chat`` when the prompt contains a rendered tool result
    (``</tool_response>``)."""
    no_think: Chain | None = None
    """Emitted after the generation prompt rendered with ``enable_thinking=False``."""
    reasoning: str | None = None
    """Reasoning text the ``reasoning_parser`` extracts from ``chat.answer`` (stripped)."""
    content: str | None = None
    """Final content once reasoning (and tool calls) are parsed out of ``chat.answer``."""
    tool_call: tuple[str, str] | None = None
    """``(name, arguments JSON)`` the ``tool_parser`` extracts from ``chat.answer``."""
    reasoning_parser: str | None = None
    """vLLM reasoning parser name for this model, if any."""
    tool_parser: str | None = None
    """vLLM tool parser name for this model, if any."""
    context: int = 4096
    """``max_position_embeddings``: the longest prompt and answer the model takes."""

    @property
    def script(self) -> tuple[str, ...]:
        """The chat script (tokens)."""
        return self.chat.script

    @property
    def answer(self) -> str:
        """Text a correct integration returns for a plain chat turn."""
        return self.chat.answer

    @property
    def hallucinated_tail(self) -> str:
        """Text after the chat stop token: must never appear in any output."""
        return self.chat.tail

    @property
    def special_tokens(self) -> tuple[str, ...]:
        """The family's special tokens: none may appear in output text."""
        return FAMILIES[self.family].specials

    @property
    def generation_prompt(self) -> str:
        """Text the chat template appends with ``add_generation_prompt=True``."""
        return FAMILIES[self.family].generation_prompt


_ONCE = "Once upon a time"
_QWEN_DEFAULTS = (("repetition_penalty", 1.05), ("temperature", 0.7), ("top_k", 20), ("top_p", 0.8))
_TOOL_JSON = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
_LONG_ANSWER = (
    "Alpha bravo charlie delta echo foxtrot golf hotel india juliett kilo lima mike november "
    "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu mercury venus "
    "earth mars jupiter saturn uranus neptune red orange yellow green blue indigo violet white "
    "black grey apple banana cherry date fig grape lemon mango peach plum cat dog horse sheep "
    "goat cow"
)

# The demo's embedded default model (``python -m vllm_inline demo``): a Llama-3 model whose
# chat answer explains the package, one added token per word (no word repeats, so each token has
# one successor).
_DEMO_ANSWER = (
    "vllm-inline runs vLLM inside your LangChain or LlamaIndex process, with no HTTP hop. "
    "This answer streams one token at a time from the tiny scripted model built on this "
    "machine: nothing was downloaded. Set MODEL to any hub id (or local path) for real weights."
)


def _completion(family: str, stop: str) -> Chain:
    return _chain(
        family,
        " there",
        " lived",
        " a",
        " tiny",
        " model.",
        stop,
        " Unwanted",
        " continuation",
        stop=stop,
    )


def _words(text: str) -> tuple[str, ...]:
    """One script piece per word: the first word, then each next one with its leading space."""
    first, *rest = text.split(" ")
    return (first, *(" " + w for w in rest))


def _llama3(name: str, *answer: str, **more: Any) -> Scenario:
    """A Llama 3 model answering ``answer``, then ``<|eot_id|>`` and an invented turn."""
    return Scenario(
        name=name,
        family="llama3",
        chat=_chain(
            "llama3",
            *answer,
            "<|eot_id|>",
            "\nUser:",
            " hallucinated",
            " turn",
            stop="<|eot_id|>",
        ),
        tokenizer_eos="<|end_of_text|>",
        eos_tokens=("<|end_of_text|>", "<|eot_id|>"),
        chat_template=chat_template("llama3"),
        generation_defaults=(("do_sample", True), ("temperature", 0.6), ("top_p", 0.9)),
        **more,
    )


def _chatml_chain(*answer: str) -> Chain:
    """``answer``, then ``<|im_end|>`` and an invented user turn."""
    tail = ("<|im_end|>", "<|im_start|>", "user\n", "A", " hallucinated", " turn")
    return _chain("chatml", *answer, *tail, stop="<|im_end|>")


def _chatml(name: str, *answer: str, template: str = "qwen2.5", **more: Any) -> Scenario:
    """A Qwen (ChatML) model answering ``answer`` with the Qwen2.5 or Qwen3 template."""
    return Scenario(
        name=name,
        family="chatml",
        chat=_chatml_chain(*answer),
        tokenizer_eos="<|im_end|>",
        eos_tokens=("<|im_end|>", "<|endoftext|>"),
        chat_template=chat_template(template),
        **more,
    )


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        _llama3(
            "llama3",
            "The",
            " answer",
            " is",
            " complete",
            ".",
            completion_prompt=_ONCE,
            completion=_completion("llama3", "<|end_of_text|>"),
        ),
        # An agent's prompt (Codex CLI's: about 17k of these tokens) fits the demo model.
        _llama3("demo", *_words(_DEMO_ANSWER), context=32768),
        _chatml(
            "chatml",
            "Hello",
            " from",
            " ChatML",
            "!",
            generation_defaults=(("do_sample", True), *_QWEN_DEFAULTS),
            completion_prompt=_ONCE,
            completion=_completion("chatml", "<|endoftext|>"),
        ),
        Scenario(
            name="gemma",
            family="gemma",
            chat=_chain(
                "gemma",
                "Gemma",
                " says",
                " hi",
                ".",
                "<end_of_turn>",
                "<start_of_turn>",
                "user\n",
                "A",
                " hallucinated",
                " turn",
                stop="<end_of_turn>",
            ),
            tokenizer_eos="<eos>",
            eos_tokens=("<eos>", "<end_of_turn>"),
            chat_template=chat_template("gemma3"),
            generation_defaults=(("top_k", 64), ("top_p", 0.95)),
            completion_prompt=_ONCE,
            completion=_completion("gemma", "<eos>"),
        ),
        # "\n\n" is the base vocabulary's merged token, which also ends the
        # enable_thinking=False prompt: `no_think` joins this chain at "The".
        _chatml(
            "chatml_reasoning",
            "<think>",
            "\nNeed",
            " to",
            " think\n",
            "</think>",
            "\n\n",
            "The",
            " answer",
            " is",
            " 42",
            ".",
            template="qwen3",
            no_think=_chatml_chain("The", " answer", " is", " 42", "."),
            reasoning="Need to think",
            content="The answer is 42.",
            reasoning_parser="qwen3",
            tool_parser="hermes",
        ),
        _chatml(
            "chatml_tools",
            "<tool_call>",
            "\n" + _TOOL_JSON + "\n",
            "</tool_call>",
            after_tool=_chatml_chain("The", " weather", " in", " Oslo", " is", " sunny", "."),
            content=None,
            tool_call=("get_weather", '{"city": "Oslo"}'),
            tool_parser="hermes",
        ),
        # Llama 3.1's JSON tool call (the format its template asks for, "parameters" as Llama
        # writes it), after <|python_tag|> (a special token: skip_special_tokens decides
        # whether the parser sees it), split inside the arguments so that a parser that
        # streams them sends fragments.
        _llama3(
            "llama3_tools",
            "<|python_tag|>",
            '{"name": "get_weather", ',
            '"parameters": {"city": "Os',
            "l",
            "o",
            '"}}',
            content=None,
            tool_call=("get_weather", '{"city": "Oslo"}'),
            tool_parser="llama3_json",
        ),
        _chatml("long", *_words(_LONG_ANSWER)),  # no word repeats: one successor each
    )
}
"""Scenario name -> :class:`Scenario`: what :func:`~vllm_inline.testing.build_scripted_model`
builds (see ``docs/testing.md`` for what each one proves)."""


def expected_answer(scenario: str) -> str:
    """Text a correct integration returns for a plain chat turn with ``scenario``'s model.

    That is the decoded chat script up to its stop token: no special token, no invented turn.
    For ``chatml_reasoning`` it still holds the ``<think>`` block and for ``chatml_tools`` the
    ``<tool_call>`` markup (both are plain text tokens, as in Qwen); see
    :attr:`Scenario.reasoning`, :attr:`Scenario.content` and :attr:`Scenario.tool_call` for
    what the parsers extract.
    """
    return SCENARIOS[scenario].answer
