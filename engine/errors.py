"""The typed errors of vllm-inline.

Every error says what went wrong and what to do about it. Request errors (:class:`BadRequestError`
and its subclasses) are raised before any work starts and carry the offending ``parameter`` and
``value``; the engine keeps serving other requests. vLLM's own exceptions are mapped onto these
(``vllm_engine.map_error``, applied by :meth:`vllm_inline.engine.life.runtime.Runtime.guard`), never
leaked raw.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BadRequestError",
    "ChatTemplateError",
    "ContextLengthExceededError",
    "EngineBusyError",
    "EngineDeadError",
    "EngineShutdownError",
    "EngineUnavailableError",
    "GenerationFailedError",
    "InsufficientMemoryError",
    "ModelLoadError",
    "ParallelLayoutError",
    "RequestTimeoutError",
    "StatsDisabledError",
    "UnsupportedTaskError",
    "VLLMInlineError",
]

_UNSET: Any = object()


class VLLMInlineError(Exception):
    """Base class of every error raised by vllm-inline."""


class BadRequestError(VLLMInlineError, ValueError):
    """A request was refused before it reached the engine.

    ``parameter`` names the offending argument and ``value`` holds what was given.
    """

    def __init__(self, message: str, *, parameter: str | None = None, value: Any = _UNSET) -> None:
        super().__init__(message)
        self.parameter = parameter
        """Name of the offending argument (``"temperature"``, ``"messages[1].role"``, ...)."""
        self.value = None if value is _UNSET else value
        """The rejected value."""

    @classmethod
    def invalid(cls, parameter: str, value: Any, expected: str) -> BadRequestError:
        """``parameter=value`` is invalid; ``expected`` says what would be accepted."""
        shown = repr(value)
        if len(shown) > 200:
            shown = shown[:197] + "..."
        return cls(f"{parameter}={shown} is invalid: {expected}.", parameter=parameter, value=value)


class ContextLengthExceededError(BadRequestError):
    """The prompt (plus the requested output) does not fit the model's context window."""


class UnsupportedTaskError(BadRequestError):
    """The engine's runner cannot serve this call: chat on an embedding (pooling) engine, or
    embeddings on a generation engine. ``parameter`` is ``"model"``; the message names the
    ``get_engine(...)`` options that start the right engine."""


class ChatTemplateError(BadRequestError):
    """No chat template could be chosen for the model, or the template failed to render."""


class ModelLoadError(VLLMInlineError):
    """The model could not be found or loaded (missing path, no tokenizer, bad engine option)."""


class InsufficientMemoryError(ModelLoadError):
    """The engine options ask for more memory than the machine has free; raised before any
    process starts. ``option`` names the option (``"kv_cache_memory_bytes"``,
    ``"max_model_len"``, ``"gpu_memory_utilization"``)."""

    def __init__(self, message: str, *, option: str, requested_bytes: int, free_bytes: int) -> None:
        super().__init__(message)
        self.option = option
        """The engine option whose request does not fit."""
        self.requested_bytes = requested_bytes
        """Bytes that option asks for."""
        self.free_bytes = free_bytes
        """Bytes free on the machine (its memory node) when the engine was about to start."""


class ParallelLayoutError(ModelLoadError):
    """A parallel layout (``tensor_parallel_size``, ``pipeline_parallel_size``,
    ``data_parallel_size``, ...) that cannot run here: more ranks than CPUs, attention heads not
    divisible by the tensor-parallel size, or remote data-parallel engines that never connected.
    Raised before any process starts where the facts allow, otherwise at start, within a bounded
    time and with every process the start spawned stopped. ``option`` names the option."""

    def __init__(self, message: str, *, option: str, value: Any) -> None:
        super().__init__(message)
        self.option = option
        """The engine option to change."""
        self.value = value
        """Its value in the layout that failed."""


class EngineUnavailableError(VLLMInlineError, RuntimeError):
    """The engine cannot serve requests right now."""


class EngineDeadError(EngineUnavailableError):
    """The engine-core process died; streams in flight end with this error.

    Call ``engine.restart()`` (or use the engine again: it restarts on the next request after
    ``restart()``) to bring up a fresh one.
    """


class EngineBusyError(EngineUnavailableError):
    """The engine turned this request away for now and the request may simply be sent again:
    generation is paused (a weight update), admission control refused it, or vLLM reported a
    transient failure as retryable (its ``RetryableRequestError``). Nothing else is affected."""


class GenerationFailedError(VLLMInlineError, RuntimeError):
    """vLLM failed this one request after accepting it (its ``GenerationError``: e.g. a KV cache
    that could not be loaded); the engine keeps serving the others. The message carries vLLM's
    reason; sending the request again may work, and the log above says more."""


class EngineShutdownError(EngineUnavailableError):
    """The engine was shut down while the stream was running."""


class StatsDisabledError(VLLMInlineError, RuntimeError):
    """The engine was started with ``disable_log_stats=True``: vLLM records no stats for it,
    so ``Engine.stats()`` has none (and the Prometheus registry no series for its model)."""


class RequestTimeoutError(VLLMInlineError, TimeoutError):
    """The request ran past its ``timeout`` and was aborted in the engine. A stream raises it
    after the deltas it already delivered; the engine keeps serving everyone else."""

    def __init__(self, message: str, *, timeout: float) -> None:
        super().__init__(message)
        self.timeout = timeout
        """The deadline the request had, in seconds."""
