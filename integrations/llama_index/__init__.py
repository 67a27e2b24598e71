"""LlamaIndex integration: :class:`VLLM` (a ``FunctionCallingLLM`` on the shared engine),
:class:`VLLMEmbedding` (embeddings from a pooling engine) and :class:`VLLMRerank` (a
cross-encoder node postprocessor).

>>> from vllm_inline.integrations.llama_index import VLLM
>>> llm = VLLM(model="Qwen/Qwen3-0.6B", max_tokens=256, tool_parser="hermes")

Importing this module does not import torch or vLLM.
"""

from __future__ import annotations

from .base import VLLM
from .embeddings import VLLMEmbedding
from .rerank import VLLMRerank

__all__ = ["VLLM", "VLLMEmbedding", "VLLMRerank"]
