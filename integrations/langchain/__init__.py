"""LangChain integration: :class:`ChatVLLM`, vLLM in this process as a chat model,
:class:`VLLMEmbeddings`, its embeddings, and :class:`VLLMRerank`, a cross-encoder reranker.

Importing this package loads neither vLLM nor torch; the engine starts on the first call.
"""

from __future__ import annotations

from .chat_models import ChatVLLM
from .embeddings import VLLMEmbeddings
from .rerank import VLLMRerank

__all__ = ["ChatVLLM", "VLLMEmbeddings", "VLLMRerank"]
