"""LlamaIndex integration: :class:`VLLM`, a ``FunctionCallingLLM`` on the shared engine, and
:class:`VLLMEmbedding`, embeddings from a pooling engine.

>>> from vllm_inline.integrations.llama_index import VLLM
>>> llm = VLLM(model="Qwen/Qwen3-0.6B", max_tokens=256, tool_parser="hermes")

Importing this module does not import torch or vLLM.
"""

from __future__ import annotations

from .base import VLLM
from .embeddings import VLLMEmbedding

__all__ = ["VLLM", "VLLMEmbedding"]
