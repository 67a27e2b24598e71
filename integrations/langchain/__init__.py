"""LangChain integration: :class:`ChatVLLM`, vLLM in this process as a chat model, and
:class:`VLLMEmbeddings`, its embeddings.

Importing this package loads neither vLLM nor torch; the engine starts on the first call.
"""

from __future__ import annotations

from .chat_models import ChatVLLM
from .embeddings import VLLMEmbeddings

__all__ = ["ChatVLLM", "VLLMEmbeddings"]
