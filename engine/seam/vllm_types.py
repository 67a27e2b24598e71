"""vLLM's types, for the annotations of modules outside the seam.

Importing vLLM takes seconds and imports torch, so no module outside the seam imports it before
an engine starts. Its types are imported here for the type checker only; at run time each name
is ``Any``, which annotations never see (every module has ``from __future__ import
annotations``). Use them in annotations only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = [
    "AsyncLLM",
    "ChatCompletionRequest",
    "IterationStats",
    "LoRARequest",
    "ModelConfig",
    "Parser",
    "PoolingParams",
    "SchedulerStats",
    "TokenizerLike",
]

if TYPE_CHECKING:
    from vllm import PoolingParams
    from vllm.config import ModelConfig
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.lora.request import LoRARequest
    from vllm.parser.abstract_parser import Parser
    from vllm.tokenizers import TokenizerLike
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.metrics.stats import IterationStats, SchedulerStats
else:
    AsyncLLM = ChatCompletionRequest = IterationStats = LoRARequest = ModelConfig = Any
    Parser = PoolingParams = SchedulerStats = TokenizerLike = Any
