"""Chat-template choice: the model's own template, a caller's override, or a family fallback.

Rendering itself is vLLM's (its renderer applies the template with transformers); this module
only decides *which* template. The fallbacks below are written by hand because neither vLLM nor
transformers ships templates for these families (vLLM's ``chat_templates/`` covers multimodal
models and a tool-less ChatML); they follow the families' published formats, tools included.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from vllm_inline.engine.errors import ChatTemplateError

__all__ = ["FAMILIES", "Family", "TemplateChoice", "detect_family", "resolve_chat_template"]


@dataclass(frozen=True)
class Family:
    """A known chat format, recognised by its special tokens."""

    name: str
    """Short name (``"llama3"``, ``"chatml"``, ``"gemma"``)."""
    markers: tuple[str, ...]
    """Tokens that must all be in the vocabulary for the family to match."""
    end_of_turn: tuple[str, ...]
    """Tokens that end an assistant turn (all become stop tokens when present)."""
    template: str
    """Fallback Jinja chat template, used only when the tokenizer has none."""


_LLAMA3 = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = '' %}
{%- endif %}
{%- if tools or system_message %}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}
{{- system_message }}
{%- if tools %}
{{- '\\n\\nYou have access to the following functions. To call a function, respond with JSON of the form {"name": function name, "parameters": dictionary of argument name and its value}.\\n\\n' }}
{%- for t in tools %}{{- t | tojson }}{{- '\\n\\n' }}{%- endfor %}
{%- endif %}
{{- '<|eot_id|>' }}
{%- endif %}
{%- for message in messages %}
{%- if message['role'] == 'assistant' and message.get('tool_calls') %}
{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- for tc in message['tool_calls'] %}
{%- set f = tc['function'] if tc.get('function') else tc %}
{{- '{"name": "' + f['name'] + '", "parameters": ' }}
{%- if f['arguments'] is string %}{{- f['arguments'] }}{%- else %}{{- f['arguments'] | tojson }}{%- endif %}
{{- '}' }}
{%- endfor %}
{{- '<|eot_id|>' }}
{%- elif message['role'] == 'tool' %}
{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}
{%- else %}
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + (message['content'] or '') | trim + '<|eot_id|>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}
"""

_CHATML = """{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for t in tools %}{{- '\\n' + (t | tojson) }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0]['role'] == 'system' %}
{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message['role'] == 'system' and loop.first %}
{%- elif message['role'] == 'assistant' %}
{{- '<|im_start|>assistant\\n' + (message['content'] or '') }}
{%- for tc in message.get('tool_calls') or [] %}
{%- set f = tc['function'] if tc.get('function') else tc %}
{{- '\\n<tool_call>\\n{"name": "' + f['name'] + '", "arguments": ' }}
{%- if f['arguments'] is string %}{{- f['arguments'] }}{%- else %}{{- f['arguments'] | tojson }}{%- endif %}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message['role'] == 'tool' %}
{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""

_GEMMA = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set first_prefix = messages[0]['content'] + '\\n\\n' %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set first_prefix = '' %}
{%- endif %}
{%- for message in messages %}
{%- set role = 'model' if message['role'] == 'assistant' else 'user' %}
{{- '<start_of_turn>' + role + '\\n' + (first_prefix if loop.first else '') + (message['content'] or '') | trim + '<end_of_turn>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}
"""

FAMILIES: tuple[Family, ...] = (
    Family(
        "llama3",
        ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
        _LLAMA3,
    ),
    Family("chatml", ("<|im_start|>", "<|im_end|>"), ("<|im_end|>", "<|endoftext|>"), _CHATML),
    Family("gemma", ("<start_of_turn>", "<end_of_turn>"), ("<end_of_turn>", "<eos>"), _GEMMA),
)
"""The families with a fallback template, in the order they are tried."""


@dataclass(frozen=True)
class TemplateChoice:
    """Which template renders the chat, and why."""

    template: str | None
    """The Jinja source, or ``None`` for the tokenizer's own (vLLM's renderer finds it)."""
    source: str
    """``"tokenizer"``, ``"override"``, ``"fallback:<family>"`` or ``"none"``."""


def detect_family(vocab: Any) -> Family | None:
    """The known family whose marker tokens are all in ``vocab`` (a ``dict`` or set of tokens)."""
    for family in FAMILIES:
        if all(marker in vocab for marker in family.markers):
            return family
    return None


def _load_override(chat_template: str) -> str:
    """A template given as a file path is read; anything else is the template itself."""
    if "{" not in chat_template and os.path.isfile(chat_template):
        with open(chat_template, encoding="utf-8") as f:
            return f.read()
    if "{" not in chat_template:
        raise ChatTemplateError(
            f"chat_template={chat_template!r} is neither a Jinja template nor a readable file.",
            parameter="chat_template",
            value=chat_template,
        )
    return chat_template


def resolve_chat_template(
    own_template: str | None, vocab: Any, override: str | None = None
) -> TemplateChoice:
    """Choose the template: ``override`` > the tokenizer's own > the family fallback.

    Returns ``source="none"`` when nothing fits; :func:`require_template` turns that into the
    error the caller sees.
    """
    if override is not None:
        return TemplateChoice(_load_override(override), "override")
    if own_template:
        return TemplateChoice(None, "tokenizer")
    family = detect_family(vocab)
    if family is not None:
        return TemplateChoice(family.template, f"fallback:{family.name}")
    return TemplateChoice(None, "none")


def require_template(choice: TemplateChoice, model: str) -> None:
    """Raise the error that says how to pass a template when none could be chosen."""
    if choice.source == "none":
        names = ", ".join(f.name for f in FAMILIES)
        raise ChatTemplateError(
            f"The tokenizer of {model!r} has no chat template and its family is not one with a "
            f"fallback ({names}). Pass chat_template='<jinja source or path>' (ChatVLLM/VLLM: "
            "chat_template=...), or send a pre-formatted prompt.",
            parameter="chat_template",
            value=None,
        )
