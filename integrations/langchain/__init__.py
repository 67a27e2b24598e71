"""LangChain integration: :class:`ChatVLLM`, vLLM in this process as a chat model.

Importing this package loads neither vLLM nor torch; the engine starts on the first call.
"""

from __future__ import annotations

from .chat_models import ChatVLLM

__all__ = ["ChatVLLM"]
