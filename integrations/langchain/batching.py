"""Batches of LangChain calls handed to the engine all at once.

LangChain's ``Runnable.batch`` runs ``invoke`` in a thread pool of ``min(32, cpus + 4)``
workers, so vLLM never sees more requests at once than there are workers, while it could batch
hundreds. The functions here run one ``ainvoke`` per input on one event loop instead: every
input is a request in the engine at once (at most ``max_concurrency`` of them when the config
sets it), each with its own LangChain run (callbacks, run id, tags, metadata), as
``Runnable.batch`` would give it.

Semantics kept from ``Runnable.batch`` / ``abatch`` / ``batch_as_completed`` /
``abatch_as_completed``: outputs in input order (or ``(index, output)`` pairs as they finish),
one config per input (``get_config_list``), ``return_exceptions=True`` puts each input's error
in its place. Without it the first error is raised once the other inputs' requests have been
aborted in the engine (LangChain's own ``abatch`` lets them run on), and leaving
``batch_as_completed``/``abatch_as_completed`` early aborts the rest likewise.

``ainvoke`` is any ``Runnable.ainvoke``-shaped coroutine function (``ChatVLLM.ainvoke``).
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import get_config_list

__all__ = [
    "AInvoke",
    "BatchAtOnce",
    "abatch",
    "abatch_as_completed",
    "batch",
    "batch_as_completed",
]

AInvoke = Callable[..., Awaitable[Any]]
"""``ainvoke(input, config, **kwargs)``: one LangChain run for one input."""

Config = RunnableConfig | Sequence[RunnableConfig] | None

_END = object()

_T = TypeVar("_T")


class _HasAInvoke(Protocol):
    """What :class:`BatchAtOnce` needs of the ``Runnable`` it is mixed into."""

    def ainvoke(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Awaitable[Any]: ...


class _Raised:
    """An exception travelling from the batch's loop thread to a synchronous consumer."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


async def abatch_as_completed(
    ainvoke: AInvoke,
    inputs: Sequence[Any],
    config: Config = None,
    *,
    return_exceptions: bool = False,
    **kwargs: Any,
) -> AsyncIterator[tuple[int, Any]]:
    """``(index, output)`` of every input as it finishes; all inputs start at once (at most
    ``max_concurrency`` of the first config at a time, when set).

    An error (without ``return_exceptions``) or leaving the iteration early cancels the inputs
    still running, and returns or raises once their requests are aborted.
    """
    if not inputs:
        return
    configs = get_config_list(config, len(inputs))
    limit = configs[0].get("max_concurrency")
    gate = asyncio.Semaphore(limit) if limit else None

    async def one(index: int, value: Any, run_config: RunnableConfig) -> tuple[int, Any]:
        try:
            if gate is None:
                return index, await ainvoke(value, run_config, **kwargs)
            async with gate:
                return index, await ainvoke(value, run_config, **kwargs)
        except Exception as e:
            if not return_exceptions:
                raise
            return index, e

    # Tasks copy this context: each run is a child of the caller's run, as with invoke.
    tasks = [asyncio.ensure_future(one(i, v, c)) for i, (v, c) in enumerate(zip(inputs, configs))]
    try:
        for finished in asyncio.as_completed(tasks):
            yield await finished
    finally:
        await _cancel(tasks)


async def abatch(
    ainvoke: AInvoke,
    inputs: Sequence[Any],
    config: Config = None,
    *,
    return_exceptions: bool = False,
    **kwargs: Any,
) -> list[Any]:
    """Outputs of every input, in input order; all inputs start at once (see
    :func:`abatch_as_completed`)."""
    results: list[Any] = [None] * len(inputs)
    async for index, output in abatch_as_completed(
        ainvoke, inputs, config, return_exceptions=return_exceptions, **kwargs
    ):
        results[index] = output
    return results


def batch_as_completed(
    ainvoke: AInvoke,
    inputs: Sequence[Any],
    config: Config = None,
    *,
    return_exceptions: bool = False,
    **kwargs: Any,
) -> Iterator[tuple[int, Any]]:
    """The synchronous form of :func:`abatch_as_completed`: the inputs run on one event loop in
    one worker thread (not one thread per input), and their ``(index, output)`` pairs are
    yielded here as they finish."""
    if not inputs:
        return
    configs = get_config_list(config, len(inputs))  # here, so that its warnings name the caller
    yield from _on_own_loop(
        lambda: abatch_as_completed(
            ainvoke, inputs, configs, return_exceptions=return_exceptions, **kwargs
        )
    )


def batch(
    ainvoke: AInvoke,
    inputs: Sequence[Any],
    config: Config = None,
    *,
    return_exceptions: bool = False,
    **kwargs: Any,
) -> list[Any]:
    """The synchronous form of :func:`abatch` (see :func:`batch_as_completed`). The worker
    thread hands the outputs back as one list, not one by one: each handoff wakes this thread,
    which then competes for the GIL with the threads doing the work."""
    if not inputs:
        return []
    configs = get_config_list(config, len(inputs))  # here, so that its warnings name the caller

    async def outputs() -> AsyncIterator[list[Any]]:
        yield await abatch(ainvoke, inputs, configs, return_exceptions=return_exceptions, **kwargs)

    (results,) = _on_own_loop(outputs)
    return results


class BatchAtOnce:
    """Mixin for a ``Runnable`` whose calls share one engine: ``batch``, ``abatch``,
    ``batch_as_completed`` and ``abatch_as_completed`` start every input at once, as one
    ``ainvoke`` run each (the functions above), instead of LangChain's thread pool.

    It declares no attributes: on a pydantic model (every ``Runnable`` model) an annotation
    here would become a field. ``self.ainvoke`` is the ``Runnable``'s own (hence the
    methods' ``self`` type, a protocol with just ``ainvoke``).
    """

    def batch(
        self: _HasAInvoke,
        inputs: list[Any],
        config: Config = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[Any]:
        """Outputs in input order; every input is a request in the engine at once (at most
        ``config["max_concurrency"]``), each its own run. Runs on one event loop in one worker
        thread. Without ``return_exceptions`` the first error is raised after the other
        requests are aborted."""
        return batch(
            self.ainvoke,
            inputs,
            config,
            return_exceptions=return_exceptions,
            **kwargs,
        )

    async def abatch(
        self: _HasAInvoke,
        inputs: list[Any],
        config: Config = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[Any]:
        """The async form of :meth:`batch`, on the caller's event loop."""
        return await abatch(
            self.ainvoke,
            inputs,
            config,
            return_exceptions=return_exceptions,
            **kwargs,
        )

    def batch_as_completed(
        self: _HasAInvoke,
        inputs: Sequence[Any],
        config: Config = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> Iterator[tuple[int, Any]]:
        """``(index, output)`` pairs of :meth:`batch` as they finish; leaving early aborts the
        requests still running."""
        return batch_as_completed(
            self.ainvoke,
            inputs,
            config,
            return_exceptions=return_exceptions,
            **kwargs,
        )

    def abatch_as_completed(
        self: _HasAInvoke,
        inputs: Sequence[Any],
        config: Config = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> AsyncIterator[tuple[int, Any]]:
        """The async form of :meth:`batch_as_completed`."""
        return abatch_as_completed(
            self.ainvoke,
            inputs,
            config,
            return_exceptions=return_exceptions,
            **kwargs,
        )


async def _cancel(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Cancel the tasks still running and wait until they have ended: each one's stream then
    has aborted its engine request (see ``vllm_inline.engine.loop.bridge``)."""
    pending = [t for t in tasks if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending)
    for task in tasks:  # their errors are not this batch's answer: mark them retrieved
        if task.done() and not task.cancelled():
            task.exception()


def _on_own_loop(agen_factory: Callable[[], AsyncIterator[_T]]) -> Iterator[_T]:
    """Iterate ``agen_factory()`` on a new event loop in a worker thread, from sync code.

    A worker thread, not this one: this thread may already run an event loop (a notebook), and
    the loop keeps the runs going while the caller handles what it was given. The caller's
    context (its LangChain parent run, for one) is copied into the loop. Leaving early
    (``break``, an error, ``KeyboardInterrupt``) cancels the iteration and waits for it.
    """
    items: queue.SimpleQueue[Any] = queue.SimpleQueue()
    started = threading.Event()
    handles: dict[str, Any] = {}

    async def drain() -> None:
        handles["loop"], handles["task"] = asyncio.get_running_loop(), asyncio.current_task()
        started.set()
        try:
            async for item in agen_factory():
                items.put(item)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            items.put(_Raised(exc))
        else:
            items.put(_END)

    context = contextvars.copy_context()
    thread = threading.Thread(
        target=context.run, args=(asyncio.run, drain()), name="vllm-inline-batch", daemon=True
    )
    thread.start()
    try:
        while True:
            item = items.get()
            if item is _END:
                return
            if isinstance(item, _Raised):
                raise item.exc
            yield item
    finally:
        if thread.is_alive():
            started.wait()
            try:
                handles["loop"].call_soon_threadsafe(handles["task"].cancel)
            except RuntimeError:  # the loop has just closed: nothing left to cancel
                pass
            thread.join()
