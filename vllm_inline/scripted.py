"""Scripted tiny models: real checkpoints whose greedy output is known in advance.

Each scenario builds a complete Hugging Face model directory (``config.json``,
``model.safetensors``, ``generation_config.json``, ``tokenizer.json``,
``tokenizer_config.json`` with the family's chat template) that vLLM and
``transformers`` load like any other ``LlamaForCausalLM``. The demo uses one as its embedded
default model; the tests use them as fixtures on a real engine.

How a model follows its script: one layer, hidden size 1024 (>= vocabulary), identity
embeddings, all RMSNorm weights 1, zero MLP, and ``lm_head[next, prev] = 10`` for each
consecutive pair of a script. The residual stream carries the current token unchanged, so the
model is a bigram table: the token that ends the prompt picks the first script token, and each
script token picks the next. Every script piece is its own token (an added token unless it is
already a single token of the base vocabulary), and the tokens that end the prompts are never
script tokens with a different successor (checked at build time).

A script is: the answer, the end-of-turn token a correct integration stops at, then a
hallucinated tail (an invented next turn) that loops back to the stop token, so with
``ignore_eos=True`` the model keeps inventing turns until ``max_tokens``.

One model can hold several chains when their prompts end differently (a completion prompt,
Qwen3's ``enable_thinking=False`` prompt). The ``chatml_tools`` model tells "after a tool
result" from "after a user turn" although both prompts end with ``<|im_start|>assistant\\n``:
its one attention head lets the prompt-ending token attend to ``</tool_response>``, which
writes a flag into the last (spare) hidden dimension that switches the first token from the tool
call to the final answer. So the real Qwen2.5 template is used unchanged, and the answer comes
only if the integration really rendered the tool result into the prompt.

Nothing heavy is imported at module import: ``numpy``, ``tokenizers`` and ``safetensors``
(all ``transformers`` dependencies) load inside :func:`build_scripted_model`. Building takes
well under a second and is safe when several processes build the same scenario at once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Chain",
    "Scenario",
    "SCENARIOS",
    "build_scripted_model",
    "expected_answer",
    "default_root",
]

#: Part of the cache key, with the scenario and this module's source (any edit rebuilds).
_BUILD_VERSION = "1"

_HIDDEN = 1024  # >= vocabulary (identity embeddings), with room for a BPE that keeps prompts short
_HEADS = 4  # x head_dim 64 (the CPU attention kernel rejects head_dim 16); 4 * 64 < hidden is fine
_HEAD_DIM = 64
_INTERMEDIATE = 64
_STEP = 10.0  # lm_head weight of a script step; logit ~ 10 * sqrt(1024) = 320
_FLAG_DIM = _HIDDEN - 1  # spare residual dimension written by the tool-result attention head
_FLAG_WEIGHT = 20.0  # lm_head weight on the flag: must beat _STEP on the shared start token
_QK = 0.5  # q/k weight of the gate head: score = (32 * 0.5) ** 2 / sqrt(64) = 32 on the gate


# --------------------------------------------------------------------------------------------
# Families: special tokens, tokenizer settings and chat templates
# --------------------------------------------------------------------------------------------

# Llama 3.1 style: header/eot format, tools in the first user message, tool results as the
# `ipython` role. Accepts tool-call arguments as a dict or a JSON string.
_LLAMA3_TEMPLATE = r"""{{- bos_token }}
{%- if custom_tools is defined %}{%- set tools = custom_tools %}{%- endif %}
{%- if not tools_in_user_message is defined %}{%- set tools_in_user_message = true %}{%- endif %}
{%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %}
{%- if not tools is defined %}{%- set tools = none %}{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = (messages[0]['content'] or '') | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- if tools_in_user_message and tools is not none %}
    {%- if messages | length != 0 %}
        {%- set first_user_message = (messages[0]['content'] or '') | trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
    {%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' }}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>" }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'tool' or message.role == 'ipython' %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {{- message.content | tojson }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- elif message.tool_calls %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
            {{- '{"name": "' + tool_call.name + '", "parameters": ' }}
            {%- if tool_call.arguments is string %}
                {{- tool_call.arguments }}
            {%- else %}
                {{- tool_call.arguments | tojson }}
            {%- endif %}
            {{- "}" }}
        {%- endfor %}
        {{- "<|eot_id|>" }}
    {%- else %}
        {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + (message.content or '') | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

# Shared by the two ChatML templates: Qwen2.5's tool system prompt.
_QWEN_TOOLS_SYSTEM = r"""
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}"""

# Shared by the two ChatML templates: an assistant turn's tool calls and a tool result.
# `SEP` is the Jinja test that puts a newline before a <tool_call> (Qwen2.5: always; Qwen3:
# not before the first one when the turn has no content).
_QWEN_TOOL_CALLS = r"""
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
            {%- if SEP %}{{- '\n' }}{%- endif %}
            {{- '<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {%- if tool_call.arguments is string %}
                {{- tool_call.arguments }}
            {%- else %}
                {{- tool_call.arguments | tojson }}
            {%- endif %}
            {{- '}\n</tool_call>' }}
        {%- endfor %}"""

_QWEN_TOOL_RESULT = r"""
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}"""

# Qwen2.5-Instruct's template (tools in the system prompt, <tool_call> JSON, tool results in a
# user turn inside <tool_response>), taking arguments as a dict or a JSON string.
_QWEN25_TEMPLATE = (
    r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}"""
    + _QWEN_TOOLS_SYSTEM
    + r"""
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + (message.content or '') + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}"""
    + _QWEN_TOOL_CALLS.replace("SEP", "true")
    + r"""
        {{- '<|im_end|>\n' }}"""
    + _QWEN_TOOL_RESULT
    + r"""
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""
)

# Qwen3 style: no default system prompt, earlier reasoning dropped from the history (the
# <think>...</think> part of an assistant turn's content), and `enable_thinking=False`
# pre-fills an empty think block.
_QWEN3_TEMPLATE = (
    r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}"""
    + _QWEN_TOOLS_SYSTEM
    + r"""
{%- elif messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- if '</think>' in content %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {{- '<|im_start|>' + message.role + '\n' + content }}"""
    + _QWEN_TOOL_CALLS.replace("SEP", "content or not loop.first")
    + r"""
        {{- '<|im_end|>\n' }}"""
    + _QWEN_TOOL_RESULT
    + r"""
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"""
)

# Gemma 3 style: user/model turns, the system message folded into the first user turn. Gemma
# has no official tool format; tools go into that first turn too, tool calls are JSON in the
# model turn and tool results are a user turn.
_GEMMA_TEMPLATE = r"""{%- macro render_content(content) -%}
    {%- if content is string -%}
        {{- content | trim -}}
    {%- elif content is iterable and content is not mapping -%}
        {%- for item in content -%}
            {%- if item['type'] == 'text' -%}{{- item['text'] | trim -}}{%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set first_user_prefix = render_content(messages[0]['content']) + '\n\n' %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set first_user_prefix = "" %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if tools %}
    {%- set ns = namespace(text="You can call these functions:\n") %}
    {%- for tool in tools %}
        {%- set ns.text = ns.text + (tool | tojson) + "\n" %}
    {%- endfor %}
    {%- set first_user_prefix = first_user_prefix + ns.text + 'To call one, answer with JSON {"name": <function-name>, "arguments": <args-json-object>}.\n\n' %}
{%- endif %}
{%- for message in loop_messages %}
    {%- set role = "model" if message['role'] == 'assistant' else "user" %}
    {{- '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['role'] == 'tool' %}
        {{- 'Tool result: ' + render_content(message['content']) }}
    {%- else %}
        {{- render_content(message['content']) }}
        {%- for tool_call in message.tool_calls or [] %}
            {%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
            {{- '{"name": "' + tool_call.name + '", "arguments": ' }}
            {%- if tool_call.arguments is string %}
                {{- tool_call.arguments }}
            {%- else %}
                {{- tool_call.arguments | tojson }}
            {%- endif %}
            {{- '}' }}
        {%- endfor %}
    {%- endif %}
    {{- '<end_of_turn>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<start_of_turn>model\n' }}
{%- endif %}
"""


@dataclass(frozen=True)
class _Family:
    """Tokenizer-level facts of a model family."""

    specials: tuple[str, ...]
    """Special tokens (``special=True``: ``skip_special_tokens`` hides them)."""
    extra_tokens: tuple[str, ...]
    """Non-special added tokens the family's vocabulary always has (e.g. ``<tool_call>``)."""
    bos: str | None
    """BOS token; when set, the tokenizer's post-processor prepends it (Llama, Gemma)."""
    pad: str | None
    unk: str | None
    generation_prompt: str
    """What ``add_generation_prompt=True`` appends; its last token starts the chat script."""


_FAMILIES: dict[str, _Family] = {
    "llama3": _Family(
        specials=(
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|eom_id|>",
            "<|python_tag|>",
        ),
        extra_tokens=(),
        bos="<|begin_of_text|>",
        pad=None,
        unk=None,
        generation_prompt="<|start_header_id|>assistant<|end_header_id|>\n\n",
    ),
    "chatml": _Family(
        specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        extra_tokens=("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"),
        bos=None,
        pad="<|endoftext|>",
        unk=None,
        generation_prompt="<|im_start|>assistant\n",
    ),
    "gemma": _Family(
        specials=("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"),
        extra_tokens=(),
        bos="<bos>",
        pad="<pad>",
        unk="<unk>",
        generation_prompt="<start_of_turn>model\n",
    ),
}


# --------------------------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------------------------


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
    specials = set(_FAMILIES[family].specials)

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
    """The Jinja chat template saved in ``tokenizer_config.json``."""
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
        return _FAMILIES[self.family].specials

    @property
    def generation_prompt(self) -> str:
        """Text the chat template appends with ``add_generation_prompt=True``."""
        return _FAMILIES[self.family].generation_prompt


_ONCE = "Once upon a time"


def _completion(family: str, stop: str) -> Chain:
    return _chain(
        family, " there", " lived", " a", " tiny", " model.", stop, " Unwanted", " continuation",
        stop=stop,
    )


_QWEN_DEFAULTS = (("repetition_penalty", 1.05), ("temperature", 0.7), ("top_k", 20), ("top_p", 0.8))
_TOOL_JSON = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
_CHATML_TAIL = ("<|im_end|>", "<|im_start|>", "user\n", "A", " hallucinated", " turn")
_LONG_WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliett kilo lima mike november "
    "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu mercury venus "
    "earth mars jupiter saturn uranus neptune red orange yellow green blue indigo violet white "
    "black grey apple banana cherry date fig grape lemon mango peach plum cat dog horse sheep "
    "goat cow"
).split()

# The demo's embedded default model (``python -m vllm_inline demo``): a Llama-3 model whose
# chat answer explains the package, one added token per word (no word repeats, so each token has
# one successor).
_DEMO_ANSWER = (
    "vllm-inline runs vLLM inside your LangChain or LlamaIndex process, with no HTTP hop. "
    "This answer streams one token at a time from the tiny scripted model built on this "
    "machine: nothing was downloaded. Set MODEL to any hub id (or local path) for real weights."
)
_DEMO_WORDS = _DEMO_ANSWER.split(" ")

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            name="llama3",
            family="llama3",
            chat=_chain(
                "llama3", "The", " answer", " is", " complete", ".",
                "<|eot_id|>", "\nUser:", " hallucinated", " turn",
                stop="<|eot_id|>",
            ),
            tokenizer_eos="<|end_of_text|>",
            eos_tokens=("<|end_of_text|>", "<|eot_id|>"),
            chat_template=_LLAMA3_TEMPLATE,
            generation_defaults=(("do_sample", True), ("temperature", 0.6), ("top_p", 0.9)),
            completion_prompt=_ONCE,
            completion=_completion("llama3", "<|end_of_text|>"),
        ),
        Scenario(
            name="demo",
            family="llama3",
            chat=_chain(
                "llama3", _DEMO_WORDS[0], *(" " + w for w in _DEMO_WORDS[1:]),
                "<|eot_id|>", "\nUser:", " hallucinated", " turn",
                stop="<|eot_id|>",
            ),
            tokenizer_eos="<|end_of_text|>",
            eos_tokens=("<|end_of_text|>", "<|eot_id|>"),
            chat_template=_LLAMA3_TEMPLATE,
            generation_defaults=(("do_sample", True), ("temperature", 0.6), ("top_p", 0.9)),
        ),
        Scenario(
            name="chatml",
            family="chatml",
            chat=_chain(
                "chatml", "Hello", " from", " ChatML", "!", *_CHATML_TAIL, stop="<|im_end|>"
            ),
            tokenizer_eos="<|im_end|>",
            eos_tokens=("<|im_end|>", "<|endoftext|>"),
            chat_template=_QWEN25_TEMPLATE,
            generation_defaults=(("do_sample", True), *_QWEN_DEFAULTS),
            completion_prompt=_ONCE,
            completion=_completion("chatml", "<|endoftext|>"),
        ),
        Scenario(
            name="gemma",
            family="gemma",
            chat=_chain(
                "gemma", "Gemma", " says", " hi", ".",
                "<end_of_turn>", "<start_of_turn>", "user\n", "A", " hallucinated", " turn",
                stop="<end_of_turn>",
            ),
            tokenizer_eos="<eos>",
            eos_tokens=("<eos>", "<end_of_turn>"),
            chat_template=_GEMMA_TEMPLATE,
            generation_defaults=(("top_k", 64), ("top_p", 0.95)),
            completion_prompt=_ONCE,
            completion=_completion("gemma", "<eos>"),
        ),
        Scenario(
            name="chatml_reasoning",
            family="chatml",
            # "\n\n" is the base vocabulary's merged token, which also ends the
            # enable_thinking=False prompt: `no_think` joins this chain at "The".
            chat=_chain(
                "chatml", "<think>", "\nNeed", " to", " think\n", "</think>", "\n\n",
                "The", " answer", " is", " 42", ".", *_CHATML_TAIL,
                stop="<|im_end|>",
            ),
            tokenizer_eos="<|im_end|>",
            eos_tokens=("<|im_end|>", "<|endoftext|>"),
            chat_template=_QWEN3_TEMPLATE,
            no_think=_chain(
                "chatml", "The", " answer", " is", " 42", ".", *_CHATML_TAIL, stop="<|im_end|>"
            ),
            reasoning="Need to think",
            content="The answer is 42.",
            reasoning_parser="qwen3",
            tool_parser="hermes",
        ),
        Scenario(
            name="chatml_tools",
            family="chatml",
            chat=_chain(
                "chatml", "<tool_call>", "\n" + _TOOL_JSON + "\n", "</tool_call>", *_CHATML_TAIL,
                stop="<|im_end|>",
            ),
            tokenizer_eos="<|im_end|>",
            eos_tokens=("<|im_end|>", "<|endoftext|>"),
            chat_template=_QWEN25_TEMPLATE,
            after_tool=_chain(
                "chatml", "The", " weather", " in", " Oslo", " is", " sunny", ".", *_CHATML_TAIL,
                stop="<|im_end|>",
            ),
            content=None,
            tool_call=("get_weather", '{"city": "Oslo"}'),
            tool_parser="hermes",
        ),
        Scenario(
            name="long",
            family="chatml",
            chat=_chain(
                "chatml", _LONG_WORDS[0].capitalize(), *(" " + w for w in _LONG_WORDS[1:]),
                *_CHATML_TAIL, stop="<|im_end|>",
            ),
            tokenizer_eos="<|im_end|>",
            eos_tokens=("<|im_end|>", "<|endoftext|>"),
            chat_template=_QWEN25_TEMPLATE,
        ),
    )
}


def expected_answer(scenario: str) -> str:
    """Text a correct integration returns for a plain chat turn with ``scenario``'s model.

    That is the decoded chat script up to its stop token: no special token, no invented turn.
    For ``chatml_reasoning`` it still holds the ``<think>`` block and for ``chatml_tools`` the
    ``<tool_call>`` markup (both are plain text tokens, as in Qwen); see
    :attr:`Scenario.reasoning`, :attr:`Scenario.content` and :attr:`Scenario.tool_call` for
    what the parsers extract.
    """
    return SCENARIOS[scenario].answer


# --------------------------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------------------------

# BPE training text: the templates' fixed phrases, a typical tool schema (compact and indented,
# as the templates render it) and everyday chat words, so prompts stay short (a tool
# conversation is ~230 tokens, inside max_model_len=512). Every text ends with "\n\n", the
# only place the ByteLevel pre-tokenizer keeps it together, so "\n\n" becomes one token.
_TOOL_SCHEMA = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a given city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
_CORPUS = (
    "system\n\n",
    "user\n\n",
    "assistant\n\n",
    "model\n\n",
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n",
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n\n",
    "For each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n\n",
    "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n",
    "Given the following functions, please respond with a JSON for a function call with its "
    "proper arguments that best answers the given prompt.\n\n",
    'Respond in the format {"name": function name, "parameters": dictionary of argument name '
    "and its value}.Do not use variables.\n\n",
    'You can call these functions:\nTo call one, answer with JSON {"name": <function-name>, '
    '"arguments": <args-json-object>}.\nTool result: sunny\n\n',
    json.dumps(_TOOL_SCHEMA) + "\n\n",
    json.dumps(_TOOL_SCHEMA, indent=4) + "\n\n",
    "Hello! Hi there, how are you? What is the weather like in Oslo today? It is sunny and "
    "warm. Tell me a joke. Please answer briefly. Be brief. Thanks, thank you! What is 2 + 2? "
    "The capital of France is Paris. Write a short story about a robot. Say hello. Why is the "
    "sky blue? Explain it to me in one sentence. Continue. Again.\n\n",
)


def default_root() -> pathlib.Path:
    """``$VLLMINLINE_CACHE/scripted``, else ``~/.cache/vllm_inline/scripted``.

    Not ``VLLM_INLINE_...``: vLLM warns about every unknown ``VLLM_*`` variable at engine start
    (and refuses to start with ``fail_on_environ_validation=True``).
    """
    base = os.environ.get("VLLMINLINE_CACHE")
    if base:
        return pathlib.Path(base).expanduser() / "scripted"
    return pathlib.Path.home() / ".cache" / "vllm_inline" / "scripted"


def _spec_digest(sc: Scenario) -> str:
    spec = {
        "build": _BUILD_VERSION,
        "scenario": dataclasses.asdict(sc),
        "family": dataclasses.asdict(_FAMILIES[sc.family]),
        "source": hashlib.sha256(pathlib.Path(__file__).read_bytes()).hexdigest(),
    }
    blob = json.dumps(spec, sort_keys=True, default=repr).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def build_scripted_model(
    scenario: str, root: str | os.PathLike[str] | None = None
) -> pathlib.Path:
    """Build (or reuse) the model directory of ``scenario`` and return its path.

    The directory is ``<root>/<scenario>-<hash of the spec>``: a changed spec builds a new
    one. It is written into a temporary directory and renamed into place, so a directory that
    exists is complete, and two processes building at once both end up with the same one.
    ``root`` defaults to :func:`default_root`.
    """
    sc = SCENARIOS[scenario]  # KeyError names the unknown scenario
    root_path = pathlib.Path(root).expanduser() if root is not None else default_root()
    target = root_path / f"{sc.name}-{_spec_digest(sc)}"
    if (target / "scenario.json").is_file():
        return target
    root_path.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{sc.name}-", dir=root_path))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
        _write_model(sc, tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "scenario.json").is_file():  # not a concurrent build: a real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _build_tokenizer(sc: Scenario) -> Any:
    """Byte-level BPE trained on a tiny corpus, plus special and script tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers import trainers

    fam = _FAMILIES[sc.family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=800,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(_CORPUS) * 4, trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in fam.specials])
    pieces = [*fam.extra_tokens]
    for chain in (sc.chat, sc.completion, sc.after_tool, sc.no_think):
        pieces += chain.script if chain else ()
    new = []
    for piece in dict.fromkeys(pieces):  # keep order, drop repeats
        if piece in fam.specials or len(tok.encode(piece, add_special_tokens=False).ids) == 1:
            continue  # already one token
        new.append(AddedToken(piece, special=False, normalized=False))
    tok.add_tokens(new)
    if fam.bos:
        bos_id = tok.token_to_id(fam.bos)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{fam.bos} $A",
            pair=f"{fam.bos} $A {fam.bos} $B",
            special_tokens=[(fam.bos, bos_id)],
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def _one_id(tok: Any, piece: str) -> int:
    ids = tok.encode(piece, add_special_tokens=False).ids
    if len(ids) != 1:
        raise AssertionError(f"script piece {piece!r} is not one token: {ids}")
    return ids[0]


def _last_id(tok: Any, text: str) -> int:
    return tok.encode(text, add_special_tokens=False).ids[-1]


def _write_model(sc: Scenario, out: pathlib.Path) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    fam = _FAMILIES[sc.family]
    tok = _build_tokenizer(sc)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if vocab > _FLAG_DIM:
        raise AssertionError(f"vocabulary {vocab} too large for hidden size {_HIDDEN}")

    # Bigram steps: prompt end -> first token, then each token -> the next; the tail loops.
    steps: dict[int, int] = {}

    def add_step(prev: int, nxt: int, what: str) -> None:
        if steps.setdefault(prev, nxt) != nxt:
            name = tok.id_to_token(prev)
            raise AssertionError(f"{sc.name}: token {name!r} needs two successors ({what})")

    def add_chain(start: int | None, chain: Chain, what: str) -> list[int]:
        ids = [_one_id(tok, p) for p in chain.script]
        if start is not None:
            add_step(start, ids[0], what)
        for a, b in zip(ids, ids[1:] + [ids[chain.script.index(chain.stop)]]):
            add_step(a, b, what)
        return ids

    chat_start = _last_id(tok, fam.generation_prompt)
    chat_ids = add_chain(chat_start, sc.chat, "chat")
    starts = {"chat": chat_start}
    if sc.completion:
        starts["completion"] = _last_id(tok, sc.completion_prompt or "")
        add_chain(starts["completion"], sc.completion, "completion")
    if sc.no_think:
        starts["no_think"] = _last_id(tok, fam.generation_prompt + "<think>\n\n</think>\n\n")
        add_chain(starts["no_think"], sc.no_think, "no_think")
    tool_ids: list[int] = []
    if sc.after_tool:
        tool_ids = add_chain(None, sc.after_tool, "after_tool")  # entered through the flag

    f32 = np.float32
    embed = np.zeros((vocab, _HIDDEN), f32)
    embed[np.arange(vocab), np.arange(vocab)] = 1.0
    lm_head = np.zeros((vocab, _HIDDEN), f32)
    for prev, nxt in steps.items():
        lm_head[nxt, prev] = _STEP
    heads = _HEADS * _HEAD_DIM
    q = np.zeros((heads, _HIDDEN), f32)
    k = np.zeros((heads, _HIDDEN), f32)
    v = np.zeros((heads, _HIDDEN), f32)
    o = np.zeros((_HIDDEN, heads), f32)
    if sc.after_tool:
        # Head 0: the prompt-ending token queries for </tool_response> (dim 31: the rotary pair
        # with the lowest frequency, so position barely matters); its value sets the flag.
        gate = _one_id(tok, "</tool_response>")
        q[31, chat_start] = _QK
        k[31, gate] = _QK
        v[0, gate] = 1.0 / np.sqrt(_HIDDEN)  # normed one-hot is sqrt(hidden): value 1
        o[_FLAG_DIM, 0] = 1.0
        lm_head[tool_ids[0], _FLAG_DIM] = _FLAG_WEIGHT
        lm_head[chat_ids[0], _FLAG_DIM] = -_FLAG_WEIGHT
    layer = "model.layers.0."
    tensors = {
        "model.embed_tokens.weight": embed,
        layer + "input_layernorm.weight": np.ones(_HIDDEN, f32),
        layer + "self_attn.q_proj.weight": q,
        layer + "self_attn.k_proj.weight": k,
        layer + "self_attn.v_proj.weight": v,
        layer + "self_attn.o_proj.weight": o,
        layer + "post_attention_layernorm.weight": np.ones(_HIDDEN, f32),
        layer + "mlp.gate_proj.weight": np.zeros((_INTERMEDIATE, _HIDDEN), f32),
        layer + "mlp.up_proj.weight": np.zeros((_INTERMEDIATE, _HIDDEN), f32),
        layer + "mlp.down_proj.weight": np.zeros((_HIDDEN, _INTERMEDIATE), f32),
        "model.norm.weight": np.ones(_HIDDEN, f32),
        "lm_head.weight": lm_head,
    }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})

    tid = tok.token_to_id
    bos_id = tid(fam.bos) if fam.bos else tid(fam.pad or sc.tokenizer_eos)
    pad_id = tid(fam.pad) if fam.pad else None
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": _HIDDEN,
        "intermediate_size": _INTERMEDIATE,
        "num_hidden_layers": 1,
        "num_attention_heads": _HEADS,
        "num_key_value_heads": _HEADS,
        "head_dim": _HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1e6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": bos_id,
        "eos_token_id": tid(sc.tokenizer_eos),
        "pad_token_id": pad_id,
        "torch_dtype": "float32",
        "dtype": "float32",
    }
    generation_config = {
        "bos_token_id": bos_id,
        "eos_token_id": [tid(t) for t in sc.eos_tokens],
        **({"pad_token_id": pad_id} if pad_id is not None else {}),
        **dict(sc.generation_defaults),
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": fam.bos,
        "eos_token": sc.tokenizer_eos,
        "pad_token": fam.pad,
        "unk_token": fam.unk,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "chat_template": sc.chat_template,
    }
    manifest = {
        "scenario": sc.name,
        "family": sc.family,
        "vocab_size": vocab,
        "start_token_ids": starts,
        "chat_script_ids": chat_ids,
        "eos_token_ids": [tid(t) for t in sc.eos_tokens],
        "spec": dataclasses.asdict(sc),
    }
    tok.save(str(out / "tokenizer.json"))
    for name, obj in (
        ("config.json", config),
        ("generation_config.json", generation_config),
        ("tokenizer_config.json", tokenizer_config),
        ("scenario.json", manifest),  # written last: its presence marks a complete build
    ):
        (out / name).write_text(json.dumps(obj, indent=2, default=repr) + "\n")


if __name__ == "__main__":  # python -m vllm_inline.scripted [name ...]: build and print paths
    import sys

    for _name in sys.argv[1:] or list(SCENARIOS):
        print(_name, build_scripted_model(_name))
