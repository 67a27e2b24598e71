"""Several engines at once: start them concurrently, shut them down concurrently, and know
which of the process's engines are running (what a new engine's start must count beside it,
what is shut down at exit).

A RAG app holds a chat model, an embedder and a reranker: three engines. Each start and each
shutdown mostly waits on vLLM's own processes (starting them, loading the weights; on shutdown,
their exit), so at once they overlap their waits. On 2 cores, with the engine processes forked,
the work left in them queues: three starts take as long together as one after another, three
shutdowns 0.84x (``benchmarks/lifecycle.py``; docs/performance.md)::

    from vllm_inline.engine import get_engine, start_engines

    chat, embedder = start_engines(
        get_engine("Qwen/Qwen3-0.6B"), get_engine("BAAI/bge-small-en-v1.5", runner="pooling")
    )

Threads, not processes: each :meth:`Engine.start <vllm_inline.engine.Engine.start>` blocks
its thread on vLLM's start-up handshake, and starts that want the same environment for their
processes overlap (``vllm_processes.spawn_environment``).
"""

from __future__ import annotations

import atexit
import gc
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from vllm_inline.engine.life import group
from vllm_inline.engine.life.platform_defaults import Choice

__all__ = [
    "EngineLike",
    "others_running",
    "shutdown_all",
    "shutdown_engines",
    "start_engines",
    "started",
    "starting",
    "stopped",
]

logger = logging.getLogger("vllm_inline")


class EngineLike(Protocol):
    """What starting and stopping engines together needs of one
    (:class:`vllm_inline.engine.Engine`)."""

    @property
    def model(self) -> str: ...
    @property
    def vllm_kwargs(self) -> Mapping[str, Any]: ...
    @property
    def started(self) -> bool: ...
    def start(self, *, planned: Sequence[Choice] = ()) -> Any: ...
    def shutdown(self) -> None: ...


E = TypeVar("E", bound=EngineLike)


def start_engines(
    *engines: E,
    max_concurrent: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[E, ...]:
    """Start ``engines`` concurrently (at most ``max_concurrent`` at a time; all by default)
    and return them once all are up.

    Their memory is planned together first (:func:`.memory_plan.plan_memory`): engines whose user
    set no memory option share the device's free memory after all the weights, instead of each
    sizing itself as if it were alone; a plan that cannot fit raises
    :class:`~vllm_inline.engine.errors.InsufficientMemoryError` naming the model, before any process
    starts. ``progress`` gets one line per engine when its start begins and one when it is ready
    (``logging`` at INFO on ``vllm_inline`` otherwise). Engines already running are left as they
    are. If one fails to start, the ones this call started are shut down (those still starting once
    they are up), none is started after the failure, and its error is raised, its message led by the
    model.
    """
    if max_concurrent is not None and max_concurrent < 1:
        raise ValueError(f"max_concurrent={max_concurrent!r} is invalid: pass 1 or more.")
    say = progress or logger.info
    failed = threading.Event()
    # An attached engine (keep_alive) is planned and measured in its host process, not here.
    local = [e for e in engines if not e.started and not getattr(e, "attached", False)]
    plans = _plan(local)

    def start(engine: E) -> None:
        if failed.is_set() or engine.started:  # another engine failed, or nothing to do
            return
        begun = time.monotonic()
        say(f"Starting vLLM for {engine.model} ...")
        engine.start(planned=plans.get(id(engine), ()))
        say(f"{engine.model} ready in {time.monotonic() - begun:.1f} s")

    already = {id(engine) for engine in engines if engine.started}
    errors = _each_at_once(start, list(engines), max_concurrent, on_error=failed.set)
    if errors:
        shutdown_engines(*(engine for engine in engines if id(engine) not in already))
        engine, error = errors[0]
        if engine.model not in str(error):  # say which of the models failed
            first = error.args[0] if error.args else error
            error.args = (f"{engine.model}: {first}", *error.args[1:])
        raise error
    return engines


def _plan(engines: Sequence[E]) -> dict[int, tuple[Choice, ...]]:
    """The memory plan of the engines about to start together (by ``id``). Measuring the
    device and the models imports vLLM and reads each model's configuration, seconds in this
    process before any engine can spawn, so one engine alone, or engines all sized by their
    users, are neither planned nor measured."""
    from vllm_inline.engine.life.memory_plan import EngineNeeds, plan_memory, sized_by_user
    from vllm_inline.engine.life.platform_defaults import MachineFacts

    if len({id(e) for e in engines}) < 2 or all(sized_by_user(e.vllm_kwargs) for e in engines):
        return {}
    from vllm_inline.engine.seam import vllm_processes, vllm_quiet

    # As an engine's start does: the engine cores' fork server imports vLLM while this
    # process does (the measuring below imports it here first). Not in a worker of a group,
    # whose engine cores are spawned (.group): a fork server there would only hold memory.
    if not group.joined():
        vllm_processes.warm_up()
    vllm_quiet.install_filters()  # before vLLM's import, which logs
    try:
        from vllm_inline.engine.seam import vllm_platform

        measure = vllm_platform.measure_facts
        needs = [
            EngineNeeds(e.model, e.vllm_kwargs, MachineFacts(**measure(e.model, e.vllm_kwargs)))
            for e in engines
        ]
        plan = plan_memory(needs)
    except BaseException:
        vllm_processes.stop_when_idle()  # nothing will start: no server left waiting
        raise
    for engine, choices in zip(engines, plan):
        if choices:
            logger.info(
                "vllm-inline memory plan for %s: %s",
                engine.model,
                "; ".join(f"{c.name}={c.value} ({c.reason})" for c in choices),
            )
    return {id(engine): choices for engine, choices in zip(engines, plan)}


def shutdown_engines(*engines: E) -> None:
    """Shut ``engines`` down concurrently (each :meth:`~vllm_inline.engine.Engine.shutdown`
    is idempotent); returns when all are down. Each shutdown mostly waits for vLLM's processes
    to exit, so at once they take less than the sum (three tiny engines on 2 cores: 0.84x,
    ``benchmarks/lifecycle.py``)."""
    running = [engine for engine in engines if engine.started]
    for engine, error in _each_at_once(lambda engine: engine.shutdown(), running, None):
        logger.warning("vllm-inline: %s did not shut down cleanly", engine.model, exc_info=error)


def _each_at_once(
    job: Callable[[E], None],
    engines: Sequence[E],
    max_concurrent: int | None,
    on_error: Callable[[], None] | None = None,
) -> list[tuple[E, BaseException]]:
    """Run ``job`` on every engine, each in a thread of its own (at most ``max_concurrent`` at
    a time); the engines that raised, with their errors, in the engines' order."""
    # Plain threads, not concurrent.futures: this also runs at interpreter exit
    # (shutdown_all), where an executor refuses new work.
    slots = threading.BoundedSemaphore(max_concurrent or max(len(engines), 1))
    results: list[list[BaseException]] = [[] for _ in engines]

    def run(i: int, engine: E) -> None:
        with slots:
            results[i] = _errors_of(job, engine, on_error)

    threads = []
    for i, engine in enumerate(engines):
        thread = threading.Thread(target=run, args=(i, engine), name=f"vllm-inline-{i}")
        try:
            thread.start()
        except RuntimeError:  # no new thread this late in the interpreter's exit
            run(i, engine)
        else:
            threads.append(thread)
    for thread in threads:
        thread.join()
    return [(engine, e) for engine, errors in zip(engines, results) for e in errors]


def _errors_of(
    job: Callable[[E], None], engine: E, on_error: Callable[[], None] | None
) -> list[BaseException]:
    try:
        job(engine)
    except BaseException as e:  # noqa: BLE001 - handed back to the caller's thread
        if on_error is not None:
            on_error()
        return [e]
    return []


# -- the process's running engines ------------------------------------------------------------

_running: dict[int, tuple[EngineLike, Mapping[str, Any] | None]] = {}  # None: still starting
_running_lock = threading.Lock()
_exit_registered = False


def starting(engine: EngineLike) -> None:
    """Note ``engine`` as starting: from now on it is shut down at exit (once its start is
    done). The first engine of the process registers that shutdown."""
    global _exit_registered
    with _running_lock:
        _running[id(engine)] = (engine, None)
        if not _exit_registered:
            atexit.register(_at_exit)
            # multiprocessing's atexit hook joins the engine cores, forever if it runs first (as
            # once multiprocessing.get_logger() re-registers it); its finalizers precede the join.
            from multiprocessing import util

            util.Finalize(None, _at_exit, exitpriority=0)
            _exit_registered = True


def started(engine: EngineLike, options: Mapping[str, Any]) -> None:
    """Note ``engine`` as running, with the options vLLM started it with (its own and those
    chosen for the machine)."""
    with _running_lock:
        _running[id(engine)] = (engine, dict(options))
        # atexit runs the hooks registered last first, and vLLM registers its own while an
        # engine starts: ``weakref.finalize``'s, whose finalizer of each engine client stops
        # the engine cores while the output handler still reads them (an ERROR traceback at
        # every exit). Registered again now, the engines' own shutdown runs before it, in
        # order: the output handler, then the engine cores (runtime.Runtime.shutdown).
        atexit.unregister(_at_exit)
        atexit.register(_at_exit)


def stopped(engine: EngineLike) -> None:
    """Note ``engine`` as no longer running."""
    with _running_lock:
        _running.pop(id(engine), None)


def others_running(engine: EngineLike) -> list[tuple[str, dict[str, Any]]]:
    """The process's running engines other than ``engine``: model, and the options each
    started with (for the memory check of ``engine``'s start)."""
    with _running_lock:
        return [
            (e.model, dict(options))
            for e, options in _running.values()
            if e is not engine and options is not None
        ]


def shutdown_all() -> None:
    """Shut down every engine of the process at once (:func:`shutdown_engines`; at exit too).
    An engine still starting is shut down once it is up."""
    with _running_lock:
        engines = [engine for engine, _ in _running.values()]
    for engine, error in _each_at_once(lambda engine: engine.shutdown(), engines, None):
        logger.warning("vllm-inline: %s did not shut down cleanly", engine.model, exc_info=error)


def _at_exit() -> None:
    from vllm_inline.engine.seam import ipc_directory

    ipc_directory.leaving()
    shutdown_all()
    # Give the heap frozen at start (vllm_engine.start_engine) back to the last collections:
    # native extensions (triton's nanobind bindings) otherwise report their objects leaked.
    gc.unfreeze()
