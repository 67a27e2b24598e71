"""Model families: the special tokens, tokenizer settings and chat templates of each.

A scripted model copies a real family's tokenizer-level facts (Llama 3, Qwen's ChatML, Gemma 3)
so that an integration meets the same special tokens, stop tokens and template quirks as with
the real model. The chat templates are Jinja files in ``templates/``, shipped with the package:

- ``llama3.jinja``: Llama 3.1 style. Header/eot format, tools in the first user message, tool
  results as the ``ipython`` role; tool-call arguments as a dict or a JSON string.
- ``qwen2.5.jinja``: Qwen2.5-Instruct's template. Tools in the system prompt, ``<tool_call>``
  JSON, tool results in a user turn inside ``<tool_response>``; arguments as a dict or a JSON
  string.
- ``qwen3.jinja``: Qwen3 style. No default system prompt, earlier reasoning (the
  ``<think>...</think>`` part of an assistant turn's content) dropped from the history, and
  ``enable_thinking=False`` pre-fills an empty think block.
- ``gemma3.jinja``: Gemma 3 style. User/model turns, the system message folded into the first
  user turn. Gemma has no official tool format: tools go into that first turn too, tool calls are
  JSON in the model turn and tool results are a user turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

__all__ = ["FAMILIES", "TEMPLATE_NAMES", "Family", "chat_template"]

TEMPLATE_NAMES = ("llama3", "qwen2.5", "qwen3", "gemma3")
"""The chat templates shipped in ``templates/<name>.jinja``."""


def chat_template(name: str) -> str:
    """The text of the shipped chat template ``name`` (one of :data:`TEMPLATE_NAMES`)."""
    if name not in TEMPLATE_NAMES:
        msg = f"unknown chat template {name!r}: use one of {', '.join(TEMPLATE_NAMES)}"
        raise ValueError(msg)
    path = resources.files(__package__) / "templates" / f"{name}.jinja"
    return path.read_bytes().decode("utf-8")  # bytes: no newline translation on any platform


@dataclass(frozen=True)
class Family:
    """Tokenizer-level facts of a model family."""

    specials: tuple[str, ...]
    """Special tokens (``special=True``: ``skip_special_tokens`` hides them)."""
    extra_tokens: tuple[str, ...]
    """Non-special added tokens the family's vocabulary always has (e.g. ``<tool_call>``)."""
    bos: str | None
    """BOS token; when set, the tokenizer's post-processor prepends it (Llama, Gemma)."""
    pad: str | None
    """Padding token, if the family has one."""
    unk: str | None
    """Unknown token, if the family has one."""
    generation_prompt: str
    """What ``add_generation_prompt=True`` appends; its last token starts the chat script."""


FAMILIES: dict[str, Family] = {
    "llama3": Family(
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
    "chatml": Family(
        specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        extra_tokens=("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"),
        bos=None,
        pad="<|endoftext|>",
        unk=None,
        generation_prompt="<|im_start|>assistant\n",
    ),
    "gemma": Family(
        specials=("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"),
        extra_tokens=(),
        bos="<bos>",
        pad="<pad>",
        unk="<unk>",
        generation_prompt="<start_of_turn>model\n",
    ),
}
"""Family name (``Scenario.family``) -> its facts."""
