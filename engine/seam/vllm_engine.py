"""vLLM's engine API as the request path uses it: start, sampling, errors.

vLLM's API moves between releases, so every vLLM import of the package is in ``engine/seam/``
(docs/compatibility.md; ``tests/vllm_contract.py`` lists each name used): this module
(``AsyncLLM``, ``SamplingParams``, vLLM's exceptions), :mod:`.vllm_render` (the renderer), :mod:`.vllm_lora`
(``LoRARequest``, adapters loaded outside a batch), :mod:`.vllm_parsing` (vLLM's tool and
reasoning parsers, which take the OpenAI server's request type), :mod:`.vllm_pooling` (the
pooling API of embeddings and scoring), :mod:`.vllm_stats` (stat loggers) and
:mod:`.vllm_platform` (the machine's facts).

Imported only when an engine starts: importing :mod:`vllm_inline.engine` does not import vLLM.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import vllm  # noqa: F401  (heavy: this module is imported lazily)
from vllm import AsyncEngineArgs, SamplingParams
from vllm.config import StructuredOutputsConfig
from vllm.envs import disable_envs_cache, enable_envs_cache
from vllm.exceptions import VLLMValidationError
from vllm.platforms import current_platform
from vllm.sampling_params import (
    RepetitionDetectionParams,
    RequestOutputKind,
    StructuredOutputsParams,
)
from vllm.utils.gc_utils import freeze_gc_heap
from vllm.v1.engine.async_llm import AsyncLLM

from vllm_inline.engine.errors import (
    BadRequestError,
    ContextLengthExceededError,
    EngineBusyError,
    EngineDeadError,
    GenerationFailedError,
    ModelLoadError,
    VLLMInlineError,
)
from vllm_inline.engine.seam.versions import installed_vllm, range_text, support_status
from vllm_inline.engine.seam.vllm_processes import (
    engine_cores_forked,
    remote_peer_deadline,
    spawn_environment,
)
from vllm_inline.engine.seam.vllm_stats import StepRecorder

__all__ = [
    "VLLM_ERROR_KINDS",
    "AsyncLLM",
    "check_engine_kwargs",
    "engine_options",
    "error_kind",
    "make_sampling_params",
    "map_error",
    "media_limits",
    "start_engine",
    "stop_output_handler",
]

_ENGINE_ARG_NAMES = frozenset(f.name for f in dataclasses.fields(AsyncEngineArgs))
_SAMPLING_NAMES = frozenset(
    name for name in SamplingParams.__struct_fields__ if not name.startswith("_")
) - {"output_kind", "detokenize", "structured_outputs"}


def check_engine_kwargs(model: str, kwargs: Mapping[str, Any]) -> None:
    """Refuse engine options that ``AsyncEngineArgs`` does not know, and an engine ``seed``
    outside ``[0, 2**32 - 1]``: vLLM 0.34's ``ModelConfig`` refuses it (a pydantic error at
    start); up to 0.33 it fails later, in the worker's ``np.random.seed``. Refused here on every
    release, naming the option, before anything starts."""
    unknown = sorted(set(kwargs) - _ENGINE_ARG_NAMES - {"model"})
    if unknown:
        raise ModelLoadError(
            f"Unknown vLLM engine option(s) {unknown} for {model!r}: vllm_kwargs must be "
            "AsyncEngineArgs fields (e.g. dtype, max_model_len, gpu_memory_utilization, "
            "tensor_parallel_size)."
        )
    seed = kwargs.get("seed")
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= 2**32 - 1
    ):
        raise ModelLoadError(
            f"seed={seed!r} for {model!r}: the engine's seed must be an integer from 0 to "
            "2**32 - 1 (vLLM seeds numpy with it). Pass one in that range, or a per-request "
            "seed in the sampling options."
        )


def start_engine(
    model: str,
    kwargs: Mapping[str, Any],
    stats: StepRecorder,
    registry: Any,
    environment: Mapping[str, str] | None = None,
    client: Mapping[str, Any] | None = None,
) -> AsyncLLM:
    """Build ``AsyncLLM`` (blocking, ~20 s on a CPU); call it on the engine's loop thread.

    ``environment`` is set while vLLM starts its processes (engine cores forked on a CPU), and a
    multi-node data-parallel head waits a bounded time for remote ones (:mod:`.vllm_processes`).
    vLLM's stats reach ``stats`` and the Prometheus ``registry`` after every step (see
    :mod:`.vllm_stats`). vLLM's periodic stats log line is off unless the caller sets
    ``disable_log_stats=False``: in a library, a line every few seconds is noise. When
    ``stats.enabled`` is false (the caller set ``disable_log_stats=True``) vLLM gets no stat
    logger and records no stats at all, as in vLLM's own server with that option.

    ``client``: attach to engine cores another process started for several front ends
    (:func:`.vllm_group.launch_shared`) instead of starting them: its ``addresses``, ``count``
    and ``index``, vLLM's ``client_addresses``, ``client_count`` and ``client_index``.
    """
    from vllm_inline.engine.seam.vllm_stats import stat_loggers

    _warn_if_unsupported()
    options = engine_options(kwargs)
    loggers = stat_loggers(stats, registry) if stats.enabled else None
    disable_envs_cache()  # this engine reads the environment as it is now (see below)
    args = AsyncEngineArgs(model=model, **options)
    if client is None:
        forked, remote = engine_cores_forked(), remote_peer_deadline(options)
        with spawn_environment(environment or {}), forked, remote:
            llm = AsyncLLM.from_engine_args(args, stat_loggers=loggers)
    else:
        # As each API server of `vllm serve --api-server-count N` does (run_api_server_worker_proc).
        args._api_process_count = int(client["count"])
        args._api_process_rank = int(client["index"])
        llm = AsyncLLM.from_vllm_config(
            args.create_engine_config(),
            stat_loggers=loggers,
            enable_log_requests=args.enable_log_requests,
            disable_log_stats=args.disable_log_stats,
            client_addresses=dict(client["addresses"]),
            client_count=int(client["count"]),
            client_index=int(client["index"]),
        )
    if str(llm.model_config.runner_type) == "pooling":
        # Its first embedding or score call would otherwise import vLLM's pooling entry points
        # (pydantic schemas: ~1 s) on the engine loop, and leave them to the collector (below).
        from vllm_inline.engine.seam import vllm_pooling  # noqa: F401
    # As vLLM's own server does once it is up: move the start-up heap (torch, transformers,
    # vLLM: ~700k objects) out of the collector's sight. Unfrozen, every full collection walked
    # it, a 0.5-0.7 s pause in the middle of the streams (LangChain and LlamaIndex allocate
    # enough per token to trigger one every few thousand tokens). gc.unfreeze() undoes it.
    freeze_gc_heap()
    # Also as the server (and vLLM's engine-core process) does once up: read VLLM_* variables
    # once, not on every read. Uncached, the output handler read os.environ for every output
    # of every step (IterationStats: 8 % of this process's CPU in a 256-request batch). The
    # next engine start clears the cache first, so it sees the environment of its own time.
    enable_envs_cache()
    return llm


async def stop_output_handler(llm: AsyncLLM, timeout: float = 5.0) -> None:
    """Cancel ``llm``'s output handler and wait until it has ended (on the engine loop).

    ``AsyncLLM.shutdown`` stops the engine cores first and cancels the output handler after: a
    handler that reads the engine's outputs in between gets vLLM's ``EngineDeadError`` and logs
    "AsyncLLM output_handler failed" with its traceback (at ERROR: printed at every log level).
    Stopped first, nothing reads when the engine cores go.
    """
    handler = getattr(llm, "output_handler", None)
    if handler is None or handler.done():
        return
    handler.cancel()
    # asyncio.wait, not await: the handler's CancelledError is not this task's.
    await asyncio.wait([handler], timeout=timeout)


def engine_options(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``AsyncEngineArgs`` options for the caller's ``kwargs``: the package's defaults added."""
    options = dict(kwargs)
    options.setdefault("disable_log_stats", True)
    if "structured_outputs_config" not in options:
        # Compact JSON under structured outputs: without it a weak model can pad JSON with
        # whitespace until max_tokens. vLLM 0.32 only takes this engine-wide, for xgrammar.
        options["structured_outputs_config"] = StructuredOutputsConfig(
            backend="xgrammar", disable_any_whitespace=True
        )
    if options.get("enable_lora") and current_platform.is_cpu():
        # One more adapter slot, for the base model's empty adapter
        # (see .vllm_lora.base_lora_request).
        options["max_loras"] = int(options.get("max_loras") or 1) + 1
        if options.get("max_cpu_loras"):
            options["max_cpu_loras"] = int(options["max_cpu_loras"]) + 1
    return options


_warned_unsupported = False


def _warn_if_unsupported() -> None:
    """One warning per process when the installed vLLM is outside the supported range."""
    global _warned_unsupported
    found = installed_vllm()
    if _warned_unsupported or found is None or support_status(found[1]) != "unknown":
        return
    _warned_unsupported = True
    logging.getLogger("vllm_inline").warning(
        "vllm-inline: %s %s is outside the vLLM releases vllm-inline is tested or checked on "
        "(%s; docs/compatibility.md). It may work; if something breaks, install a release in "
        "that range.",
        *found,
        range_text(),
    )


def media_limits(llm: AsyncLLM) -> dict[str, Any]:
    """What the engine allows for images, from vLLM's model config: the fields of
    :class:`vllm_inline.engine.life.runtime.MediaPolicy`."""
    config = llm.model_config
    mm = config.multimodal_config
    multimodal = bool(config.is_multimodal_model) and mm is not None
    return {
        "multimodal": multimodal,
        "image_limit": mm.get_limit_per_prompt("image") if mm is not None and multimodal else 0,
        "allowed_local_media_path": config.allowed_local_media_path or "",
        "allowed_media_domains": tuple(config.allowed_media_domains or ()),
    }


def make_sampling_params(
    values: Mapping[str, Any], structured_outputs: Mapping[str, Any] | None, *, stream: bool = True
) -> SamplingParams:
    """``SamplingParams`` in DELTA mode (``stream=False``: FINAL_ONLY, one output per request);
    unknown names and vLLM's own checks become errors."""
    unknown = sorted(set(values) - _SAMPLING_NAMES)
    if unknown:
        raise BadRequestError(
            f"Unknown sampling parameter(s) {unknown}. Known: {sorted(_SAMPLING_NAMES)}.",
            parameter=unknown[0],
            value=values[unknown[0]],
        )
    structured = None
    if structured_outputs is not None:
        try:
            structured = StructuredOutputsParams(**structured_outputs)
        except (TypeError, ValueError) as e:
            raise BadRequestError.invalid("structured_outputs", structured_outputs, str(e)) from e
    values = dict(values)
    detection = values.get("repetition_detection")
    if isinstance(detection, Mapping):
        try:
            values["repetition_detection"] = RepetitionDetectionParams(**detection)
        except (VLLMValidationError, ValueError, TypeError) as e:
            raise BadRequestError.invalid("repetition_detection", detection, str(e)) from e
    try:
        return SamplingParams(
            **values,
            structured_outputs=structured,
            output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY,
        )
    except (VLLMValidationError, ValueError, TypeError) as e:
        raise _as_bad_request(e) from e


def _as_bad_request(e: Exception) -> BadRequestError:
    parameter = getattr(e, "parameter", None) or str(e).split(" ", 1)[0].strip("`'\"")
    value = getattr(e, "value", None)
    message = str(e)
    lowered = message.lower()
    if any(
        word in lowered for word in ("grammar", "structured output", "json schema", "json_schema")
    ):
        parameter = "structured_outputs"
    if "maximum context length" in message or parameter in ("input_tokens", "input_text"):
        return ContextLengthExceededError(
            f"messages are too long for the context window: {message} Shorten the conversation, or start the engine with a larger "
            "max_model_len (vllm_kwargs).",
            parameter="messages",
            value=value,
        )
    if parameter and parameter not in message:
        message = f"{parameter} is invalid: {message}"
    return BadRequestError(message, parameter=parameter, value=value)


VLLM_ERROR_KINDS: Mapping[str, str] = {
    "EngineDeadError": "dead",
    "EngineGenerateError": "engine_failed",
    "VLLMValidationError": "bad_request",
    "VLLMClientError": "bad_request",
    "RetryableRequestError": "busy",
    "GracefulHTTPError": "busy",
    "GenerationError": "failed",
    "VLLMError": "failed",
}
"""vLLM's exception types by class name, and what each becomes (see :func:`map_error`).

Matched along an exception's MRO by name, within vLLM's modules, rather than imported one by
one: releases add types under these bases (0.33 raises ``GenerationError`` and
``RetryableRequestError`` to ``AsyncLLM.generate``'s caller where 0.32 ended the request with a
finish reason, and moved ``VLLMValidationError`` checks into the engine core), and a base class
here covers every subclass a release adds."""


def error_kind(cls: type) -> str | None:
    """The :data:`VLLM_ERROR_KINDS` entry of vLLM exception type ``cls`` (or of its nearest
    vLLM base), ``None`` for a type that is not vLLM's."""
    for klass in cls.__mro__:
        if klass.__module__.partition(".")[0] == "vllm" and klass.__name__ in VLLM_ERROR_KINDS:
            return VLLM_ERROR_KINDS[klass.__name__]
    return None


def map_error(e: BaseException, model: str) -> VLLMInlineError | None:
    """Our typed error for one of vLLM's, or ``None`` when it is not vLLM's to map."""
    if isinstance(e, VLLMInlineError):
        return e
    kind = error_kind(type(e))
    if kind == "dead":
        return EngineDeadError(
            f"The vLLM engine for {model!r} died ({e}). Streams in flight were ended; call "
            "engine.restart() to start a new one (see the log above for the cause)."
        )
    if kind == "engine_failed":
        return EngineDeadError(f"The vLLM engine for {model!r} failed a request: {e.__cause__!r}.")
    if kind == "bad_request":
        if isinstance(e, VLLMValidationError):
            return _as_bad_request(e)
        return BadRequestError(
            str(e), parameter=getattr(e, "parameter", None), value=getattr(e, "value", None)
        )
    if kind == "busy":
        return EngineBusyError(
            f"The vLLM engine for {model!r} turned this request away for now ({e}); send it "
            "again later."
        )
    if kind == "failed":
        return GenerationFailedError(
            f"vLLM failed this request on {model!r}: {e}. The engine keeps serving; sending the "
            "request again may work (see the log above for the cause)."
        )
    return None
