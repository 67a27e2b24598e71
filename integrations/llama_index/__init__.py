"""LlamaIndex integration: :class:`VLLM`, a ``FunctionCallingLLM`` on the shared engine.

>>> from vllm_inline.integrations.llama_index import VLLM
>>> llm = VLLM(model="Qwen/Qwen3-0.6B", max_tokens=256, tool_parser="hermes")

Importing this module does not import torch or vLLM.
"""

from __future__ import annotations

from .base import VLLM

__all__ = ["VLLM"]
