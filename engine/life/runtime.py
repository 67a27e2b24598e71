"""A started engine: vLLM's ``AsyncLLM``, its loop thread and what was decided at start.

:func:`start_runtime` brings one up (blocking, ~20 s on a CPU); :meth:`Engine.start
<vllm_inline.engine.Engine.start>` calls it once and keeps the :class:`Runtime` until shutdown.
Every piece of work on the engine loop (a stream, an embedding call, a prompt rendering) runs
under :meth:`Runtime.guard`: the one place that registers the task for shutdown, refuses work on
a dead engine or the wrong runner, and maps vLLM's exceptions onto :mod:`vllm_inline.engine.errors`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from vllm_inline.engine.errors import (
    EngineDeadError,
    EngineShutdownError,
    ModelLoadError,
    RequestTimeoutError,
    UnsupportedTaskError,
    VLLMInlineError,
)
from vllm_inline.engine.life import group
from vllm_inline.engine.life.memory_plan import check_alone_start
from vllm_inline.engine.life.metrics import StatsBook, prometheus_registry
from vllm_inline.engine.life.platform_defaults import (
    Choice,
    MachineFacts,
    PlatformDefaults,
    choose_engine_kwargs,
)
from vllm_inline.engine.life.stops import StopPolicy, decide_stop_policy
from vllm_inline.engine.life.templates import TemplateChoice, resolve_chat_template
from vllm_inline.engine.loop.bridge import LoopThread
from vllm_inline.engine.seam import (
    ipc_directory,  # the standard library only
    vllm_processes,  # the standard library only until an engine starts
)
from vllm_inline.engine.seam.vllm_types import AsyncLLM, TokenizerLike

__all__ = ["Runtime", "require_runner", "start_runtime"]

logger = logging.getLogger("vllm_inline")

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


@dataclass(frozen=True)
class MediaPolicy:
    """What the running engine allows (read from vLLM's model config by
    ``vllm_engine.media_limits``)."""

    multimodal: bool
    """The model takes images."""
    image_limit: int
    """``limit_mm_per_prompt["image"]`` (vLLM's default for an unset modality is 999)."""
    allowed_local_media_path: str
    """The directory local images may come from (``""``: none allowed)."""
    allowed_media_domains: tuple[str, ...]
    """Domains remote image URLs may come from (empty: none; vllm-inline refuses them)."""


@dataclass(eq=False)
class Runtime:
    """One running ``AsyncLLM`` and the decisions made when it started."""

    model: str
    """Model path or hub id, as given to :func:`~vllm_inline.engine.get_engine`."""
    llm: AsyncLLM | None
    """vLLM's ``AsyncLLM`` (``None`` once shut down)."""
    loop: LoopThread
    """The event-loop thread the ``AsyncLLM`` is bound to; all engine work runs there."""
    tokenizer: TokenizerLike
    """The model's tokenizer, as vLLM loaded it."""
    template: TemplateChoice
    """The chat template chosen at start (the model's own, or a family fallback)."""
    stop_policy: StopPolicy
    """The end-of-turn token ids sent with every request."""
    model_defaults: dict[str, Any]
    """Sampling values from the model's ``generation_config.json``."""
    max_model_len: int
    """The context window in tokens."""
    stats: StatsBook
    """The engine's running figures, written by vLLM's stat loggers after every step."""
    platform_defaults: PlatformDefaults
    """The options vLLM was started with, and those chosen for this machine (with reasons)."""
    media: MediaPolicy
    """What the engine allows for images (multimodal or not, limits, allowed sources)."""
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    """Work in flight on the loop (cancelled by :meth:`shutdown`)."""
    loaded_adapters: set[int] = field(default_factory=set)
    """LoRA adapter ids (and markers, see :mod:`vllm_inline.engine.request.lora`) already loaded
    into this ``AsyncLLM``."""
    closing: bool = False
    """True once :meth:`shutdown` began: cancelled work ends with :class:`EngineShutdownError`."""
    group_cores: Any = None
    """The engine cores this worker started for its group (:mod:`.group`), stopped with it."""

    def running_llm(self) -> AsyncLLM:
        """The ``AsyncLLM``, for work under :meth:`guard` (which refuses a dead engine)."""
        if self.llm is None:
            raise EngineShutdownError(f"The engine for {self.model!r} was shut down.")
        return self.llm

    @asynccontextmanager
    async def guard(
        self, what: str, runner: str | None = None, timeout: float | None = None
    ) -> AsyncIterator[Any]:
        """Run a piece of work on the engine loop; yields the ``AsyncLLM``.

        ``what`` names the work in errors ("stream", "embedding call"); ``runner`` (vLLM's
        ``"generate"`` or ``"pooling"``), when given, is the runner the work needs. After
        ``timeout`` seconds the work is cancelled (which aborts its vLLM requests) and
        :class:`RequestTimeoutError` raised.
        """
        task = asyncio.current_task()
        assert task is not None, "Runtime.guard runs on the engine loop"
        self.tasks.add(task)
        expired: list[bool] = []

        def expire() -> None:
            expired.append(True)
            task.cancel()

        timer = asyncio.get_running_loop().call_later(timeout, expire) if timeout else None
        try:
            llm = self.llm
            if llm is None or llm.errored:
                raise EngineDeadError(
                    f"The vLLM engine for {self.model!r} is dead. Call engine.restart() to start "
                    "a new one."
                )
            if runner is not None:
                require_runner(self.model, llm, runner)
            yield llm
        except asyncio.CancelledError:
            if self.closing:
                raise EngineShutdownError(
                    f"The engine for {self.model!r} was shut down while this {what} ran."
                ) from None
            if expired and _uncancel(task) == 0:  # our own deadline, not the caller's cancel
                raise RequestTimeoutError(
                    f"The {what} on {self.model!r} ran past its timeout of {timeout} s and was "
                    "aborted. Raise timeout=..., or lower max_tokens.",
                    timeout=float(timeout or 0),
                ) from None
            raise
        except VLLMInlineError:
            raise
        except Exception as e:
            from vllm_inline.engine.seam import vllm_engine

            mapped = vllm_engine.map_error(e, self.model)
            if mapped is None:
                raise
            raise mapped from e
        finally:
            if timer is not None:
                timer.cancel()
            self.tasks.discard(task)

    def shutdown(self) -> None:
        """Cancel the work in flight, stop vLLM and the loop thread (call once)."""
        self.closing = True
        llm = self.llm
        from vllm_inline.engine.seam import vllm_quiet

        async def close() -> None:
            for task in list(self.tasks):
                task.cancel()
            if self.tasks:
                await asyncio.wait(list(self.tasks), timeout=5)
            if llm is None:
                return
            # The output handler first, then the engine cores: the other way round (vLLM's own
            # order) the handler can read the dying engine and log an ERROR traceback.
            from vllm_inline.engine.seam import vllm_engine

            await vllm_engine.stop_output_handler(llm)
            # Returns as soon as vLLM's processes are down. Killed before their own teardown
            # ends, they leave shared memory and a lock behind, reported as leaked at exit.
            llm.shutdown(timeout=vllm_quiet.shutdown_timeout())

        try:
            self.loop.submit(close()).result(timeout=30)
        except Exception:
            logger.warning(
                "vllm-inline: engine %s did not shut down cleanly", self.model, exc_info=True
            )
        self.loop.stop()
        self.llm = None
        gc.collect()  # run AsyncLLM.__del__ now, while the interpreter is whole
        if self.group_cores is not None:  # once the group's other workers are gone
            group.stop_owned(self.group_cores)
            self.group_cores = None
        vllm_processes.stop_when_idle()
        ipc_directory.release()  # the last engine of the process takes its files with it


def _uncancel(task: asyncio.Task[Any]) -> int:
    """``task.uncancel()`` (Python 3.11+): the cancel requests still pending after ours."""
    uncancel = getattr(task, "uncancel", None)
    return uncancel() if uncancel is not None else 0


def require_runner(model: str, llm: Any, wanted: str) -> None:
    """Raise :class:`UnsupportedTaskError` unless the engine runs vLLM's ``wanted`` runner."""
    # Read here, not through .vllm_pooling: importing vLLM's pooling entry points builds
    # pydantic schemas for ~1 s, which a generation engine's first request would wait for.
    have = str(llm.model_config.runner_type)
    if have == wanted:
        return
    if wanted == "pooling":
        message = (
            f"The engine for {model!r} runs vLLM's {have!r} runner, which cannot embed or score. "
            f"Embeddings and reranker scores need a pooling engine: get_engine({model!r}, "
            "runner='pooling', ...) (VLLMEmbeddings, VLLMEmbedding and VLLMRerank start one). "
            "vLLM converts a *ForCausalLM checkpoint into an embedder under runner='pooling' "
            "(convert='embed')."
        )
    else:
        message = (
            f"The engine for {model!r} runs vLLM's {have!r} runner (embeddings, reranker scores) "
            f"and cannot generate text: call engine.embed(...) or engine.score(...) on it, or "
            f"chat through a generation engine, "
            f"get_engine({model!r}, ...) without runner='pooling'."
        )
    raise UnsupportedTaskError(message, parameter="model", value=model)


# -- start ------------------------------------------------------------------------------------


def start_runtime(
    model: str,
    vllm_kwargs: Mapping[str, Any],
    planned: Sequence[Choice] = (),
    running: Sequence[tuple[str, Mapping[str, Any]]] = (),
) -> Runtime:
    """Start vLLM for ``model`` on a new loop thread and decide template and stop policy.

    ``planned``: memory options chosen for engines started together (:mod:`.memory_plan`);
    ``running``: the process's other engines (model, the options they started with)."""
    _preflight(model, vllm_kwargs)
    loop = LoopThread(name=f"vllm-inline:{os.path.basename(model.rstrip('/'))}")
    # An explicit disable_log_stats=True turns vLLM's stats off, as in vLLM itself (our
    # default of True only silences vLLM's periodic log line; see vllm_engine.start_engine).
    stats = StatsBook(enabled=vllm_kwargs.get("disable_log_stats") is not True)
    ipc_directory.hold()  # vLLM's IPC sockets and the engine processes' files (see there)
    try:
        llm, defaults, cores = loop.submit(
            _build(model, vllm_kwargs, stats, planned, running)
        ).result()
    except BaseException as e:
        loop.stop()
        vllm_processes.stop_when_idle()
        ipc_directory.release()
        if isinstance(e, VLLMInlineError):
            raise
        raise ModelLoadError(
            f"vLLM could not start an engine for {model!r} with {dict(vllm_kwargs)}: "
            f"{type(e).__name__}: {e}"
        ) from e
    from vllm_inline.engine.seam import vllm_engine

    tokenizer = llm.get_tokenizer()
    vocab = tokenizer.get_vocab()
    template = resolve_chat_template(getattr(tokenizer, "chat_template", None), vocab)
    generation_config = llm.model_config.try_get_generation_config() or {}
    policy = decide_stop_policy(
        vocab, tokenizer.eos_token_id, generation_config.get("eos_token_id"), template.source
    )
    runtime = Runtime(
        model=model,
        llm=llm,
        loop=loop,
        tokenizer=tokenizer,
        template=template,
        stop_policy=policy,
        model_defaults=dict(llm.model_config.get_diff_sampling_param()),
        max_model_len=int(llm.model_config.max_model_len),
        stats=stats,
        platform_defaults=defaults,
        media=MediaPolicy(**vllm_engine.media_limits(llm)),
        group_cores=cores,
    )
    logger.info(
        "vllm-inline engine started: model=%s template=%s stop_ids=%s (%s) chosen: %s",
        model,
        template.source,
        list(policy.stop_token_ids),
        ", ".join(policy.stop_tokens),
        defaults.summary(),
    )
    return runtime


def _preflight(model: str, vllm_kwargs: Mapping[str, Any]) -> None:
    """Checks that need no engine: the model path and its tokenizer."""
    path = os.path.expanduser(model)
    path_like = path.startswith(("/", "./", "../", "~")) or path.count("/") > 1
    if not os.path.exists(path):
        if path_like:
            raise ModelLoadError(
                f"Model path {model!r} does not exist. Pass an existing local directory "
                "or a hub id such as 'Qwen/Qwen3-0.6B'."
            )
        return
    has_tokenizer = any(os.path.exists(os.path.join(path, f)) for f in _TOKENIZER_FILES)
    if os.path.isdir(path) and "tokenizer" not in vllm_kwargs and not has_tokenizer:
        raise ModelLoadError(
            f"Model directory {model!r} has no tokenizer (none of "
            f"{', '.join(_TOKENIZER_FILES)}). Save the tokenizer next to the weights or "
            "pass vllm_kwargs={'tokenizer': '<path or hub id>'}."
        )


async def _build(
    model: str,
    vllm_kwargs: Mapping[str, Any],
    stats: StatsBook,
    planned: Sequence[Choice],
    running: Sequence[tuple[str, Mapping[str, Any]]],
) -> tuple[Any, PlatformDefaults, Any]:
    # Built on the loop thread, so vLLM's output handler binds to this loop. vLLM is first
    # imported here too: some of its modules keep import-time tracebacks, which would keep
    # the caller's frames (and through them the engine) alive until interpreter exit.
    from vllm_inline.engine.seam import vllm_boot, vllm_quiet

    if not group.joined():  # a group's engine cores are spawned (.group)
        vllm_processes.warm_up()  # on a CPU, engine cores' fork server imports while we do
    vllm_quiet.install_filters()  # before vLLM's import, which logs
    from vllm_inline.engine.seam import vllm_engine

    vllm_engine.check_engine_kwargs(model, vllm_kwargs)

    def decide() -> tuple[PlatformDefaults, dict[str, str]]:
        # Measured before anything is spawned: a request for more memory than is free fails here.
        defaults = _decide_engine_kwargs(model, vllm_kwargs, planned, running)
        cpu = defaults.facts is not None and defaults.facts.is_cpu
        return defaults, {**vllm_boot.engine_environment(cpu=cpu), **defaults.environment}

    client, cores = None, None
    if group.joined():  # attach to the group's engine cores for this model and options
        defaults, client, cores = group.attach(model, vllm_kwargs, decide)
        environment: dict[str, str] = {}
    else:
        defaults, environment = decide()
    # Returned, never held in a local: a traceback vLLM keeps from its imports keeps this frame,
    # and a local of it would keep the engine alive until interpreter exit.
    registry = prometheus_registry()
    try:
        return (
            vllm_engine.start_engine(model, defaults.kwargs, stats, registry, environment, client),
            defaults,
            cores,
        )
    except BaseException:
        if cores is not None:  # started for the group, by this worker: no one else stops them
            cores.shutdown()
        raise


def _decide_engine_kwargs(
    model: str,
    kwargs: Mapping[str, Any],
    planned: Sequence[Choice],
    running: Sequence[tuple[str, Mapping[str, Any]]],
) -> PlatformDefaults:
    """The options to start with: on a CPU, measured defaults for what the user left unset
    (:func:`.platform_defaults.choose_engine_kwargs`); on a GPU, the user's options as they are.
    ``planned``: the memory options a plan for engines started together chose
    (:mod:`.memory_plan`); ``running``: the other engines of this process (model, options).

    Raises :class:`~vllm_inline.engine.errors.InsufficientMemoryError` before any process is
    spawned when the options ask for more memory than the machine has free.
    """
    from vllm_inline.engine.seam import vllm_platform

    if not vllm_platform.is_cpu() and not planned and not running:
        return choose_engine_kwargs(kwargs, MachineFacts(is_cpu=False))
    facts = MachineFacts(**vllm_platform.measure_facts(model, kwargs))
    if not planned:
        check_alone_start(model, kwargs, facts, running)
    return choose_engine_kwargs(kwargs, facts, planned)
