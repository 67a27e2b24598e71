"""The shared engine: vLLM's ``AsyncLLM`` on its own event-loop thread, one per model.

>>> from vllm_inline.engine import get_engine
>>> engine = get_engine("Qwen/Qwen3-0.6B", dtype="bfloat16")
>>> for delta in engine.stream([{"role": "user", "content": "Hi"}], max_tokens=64):
...     print(delta.text, end="", flush=True)

Importing this module does not import torch or vLLM; they load when an engine starts.
"""

from vllm_inline.engine.engine import Engine
from vllm_inline.engine.errors import (
    BadRequestError,
    ChatTemplateError,
    ContextLengthExceededError,
    EngineBusyError,
    EngineDeadError,
    EngineShutdownError,
    EngineUnavailableError,
    GenerationFailedError,
    InsufficientMemoryError,
    ModelLoadError,
    ParallelLayoutError,
    RequestTimeoutError,
    StatsDisabledError,
    UnsupportedTaskError,
    VLLMInlineError,
)
from vllm_inline.engine.life.metrics import EngineStats, RequestMetrics, prometheus_registry
from vllm_inline.engine.life.stops import StopPolicy
from vllm_inline.engine.life.together import shutdown_all, shutdown_engines, start_engines
from vllm_inline.engine.registry import get_engine
from vllm_inline.engine.request.sampling import DEFAULTS
from vllm_inline.engine.stream.deltas import Delta, TokenLogprob, ToolCallDelta, Usage

__all__ = [
    "DEFAULTS",
    "BadRequestError",
    "ChatTemplateError",
    "ContextLengthExceededError",
    "Delta",
    "Engine",
    "EngineBusyError",
    "EngineDeadError",
    "EngineShutdownError",
    "EngineStats",
    "EngineUnavailableError",
    "GenerationFailedError",
    "InsufficientMemoryError",
    "ModelLoadError",
    "ParallelLayoutError",
    "RequestMetrics",
    "RequestTimeoutError",
    "StatsDisabledError",
    "StopPolicy",
    "TokenLogprob",
    "ToolCallDelta",
    "UnsupportedTaskError",
    "Usage",
    "VLLMInlineError",
    "get_engine",
    "prometheus_registry",
    "shutdown_all",
    "shutdown_engines",
    "start_engines",
]
