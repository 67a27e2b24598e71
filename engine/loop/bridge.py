"""The one bridge between the engine's event-loop thread and its callers.

The engine's coroutines run on a private event loop in a daemon thread (:class:`LoopThread`).
A stream is one async generator that runs *there*; :func:`aiter_on` hands its items to a caller's
event loop and :func:`iter_on` to a synchronous caller, through the same pump. Leaving either
iterator early (break, ``aclose()``, task cancellation, garbage collection) cancels the pump,
which closes the engine-side generator and so aborts the request in vLLM; the iterator returns
once that is done, so a caller that leaves early leaves no request behind in the engine.

A pump runs only a few items ahead of its consumer (:mod:`.window`): a consumer that falls
behind holds its request back on the engine loop, and vLLM merges the outputs meanwhile.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

from vllm_inline.engine.loop.calls import ThreadsafeCalls
from vllm_inline.engine.loop.relay import Relay
from vllm_inline.engine.loop.window import Window

__all__ = ["LoopThread", "aiter_on", "iter_on"]

T = TypeVar("T")

_DONE = object()
_STOP_WAIT_S = 5.0
"""How long leaving a stream early waits for its request to be aborted on the engine loop."""


class _Raised:
    """An exception travelling from the engine loop to the consumer."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class LoopThread:
    """An asyncio event loop running forever in a daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        """The loop; touch it only through :meth:`submit` and ``call_soon_threadsafe``."""
        self._handoffs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Handoff] = (
            weakref.WeakKeyDictionary()
        )
        self._handoffs_lock = threading.Lock()
        self.relay = Relay(self.loop)
        """The handoff of items from this loop to synchronous consumers (their own threads)."""
        self.calls = ThreadsafeCalls(self.loop)
        """Calls onto the loop from any thread, one wake per batch: pumps started and stopped,
        and pumps released by their consumers (:class:`Window`)."""
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @property
    def in_loop_thread(self) -> bool:
        """True when called from the loop's own thread."""
        return threading.current_thread() is self._thread

    def handoff(self, caller: asyncio.AbstractEventLoop) -> _Handoff:
        """The shared handoff of items from this loop to the ``caller`` loop."""
        with self._handoffs_lock:
            handoff = self._handoffs.get(caller)
            if handoff is None:
                handoff = self._handoffs[caller] = _Handoff(self.loop, caller)
            return handoff

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Schedule ``coro`` on the loop; returns a thread-safe future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], *, instead: str) -> T:
        """Run ``coro`` on the loop and wait for its result, from a synchronous caller.

        Called on the loop's own thread it would wait for itself: refused, naming ``instead``
        (the call to await there). Leaving early (``KeyboardInterrupt``) cancels ``coro``.
        """
        if self.in_loop_thread:
            coro.close()
            raise RuntimeError(
                "This synchronous call was made on the engine's own loop thread, where it would "
                f"wait for itself: await {instead} there instead."
            )
        future = self.submit(coro)
        try:
            return future.result()
        finally:
            future.cancel()  # no-op once done

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop and join the thread (idempotent)."""
        if self.loop.is_closed():
            return
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()


class _Pump:
    """A stream's pump task on the engine loop, which its consumer can stop and wait for.

    The task is created by a callback on the engine loop (not ``run_coroutine_threadsafe``,
    whose future is done the moment it is cancelled): :meth:`stop` cancels the task itself and
    reports when it has ended, i.e. when the engine-side generator has closed and vLLM has
    aborted the request. Both go through the loop's :class:`ThreadsafeCalls`: the streams a
    bulk call starts in one pass of its loop wake the engine loop once, not once each.
    """

    __slots__ = ("_lt", "_task")

    def __init__(self, lt: LoopThread, coro: Coroutine[Any, Any, None]) -> None:
        self._lt = lt
        self._task: asyncio.Task[None] | None = None
        try:
            lt.calls.call(self._start, coro)
        except RuntimeError:  # the engine loop is closed: the pump never runs
            coro.close()
            raise

    def _start(self, coro: Coroutine[Any, Any, None]) -> None:
        self._task = self._lt.loop.create_task(coro)

    def stop(self, then: Callable[[], None]) -> None:
        """Cancel the pump; ``then()`` runs on the engine loop once it has ended (or now, when
        the engine loop is closed)."""

        def stop_on_loop() -> None:  # runs after _start: ThreadsafeCalls keeps the order
            task = self._task
            assert task is not None
            if task.done():
                then()
                return
            task.add_done_callback(lambda _: then())
            task.cancel()

        try:
            self._lt.calls.call(stop_on_loop)
        except RuntimeError:  # the engine loop is closed: nothing runs there any more
            then()


def _start_pump(
    lt: LoopThread,
    agen_factory: Callable[[], AsyncIterator[T]],
    put: Callable[[Any], None],
    window: Window,
) -> _Pump:
    """Run ``agen_factory()`` on the engine loop, handing each item (then the end) to ``put``,
    at most :data:`.window.WINDOW` items ahead of the consumer."""

    async def pump() -> None:
        agen = agen_factory()
        try:
            async for item in agen:
                put(item)
                try:
                    await window.after_put()
                except asyncio.CancelledError as cancel:
                    # Cancelled while waiting for the consumer, outside the generator: raise it
                    # in there, where it lands otherwise, so that the generator's own handling
                    # turns an engine shutdown or its deadline into its typed error.
                    await agen.athrow(cancel)  # type: ignore[attr-defined]
                    raise
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - delivered to the consumer, re-raised there
            put(_Raised(exc))
            return
        finally:
            await agen.aclose()  # type: ignore[attr-defined]
        put(_DONE)

    return _Pump(lt, pump())


class _Handoff:
    """Items bound for one caller event loop from one engine loop.

    All streams between the two loops share one handoff. An engine step makes every stream's
    pump ready in the same pass of the engine loop; their items are queued here and the caller
    loop is woken once, from a callback that runs after that pass (one ``call_soon_threadsafe``,
    one self-pipe write and one thread switch per step instead of one per stream). ``put`` and
    ``_wake`` run on the engine loop, ``_flush`` on the caller loop; they share only the deque.
    Synchronous consumers have :class:`.relay.Relay` instead.
    """

    __slots__ = ("__weakref__", "_armed", "_caller", "_engine", "_pending")

    def __init__(
        self, engine: asyncio.AbstractEventLoop, caller: asyncio.AbstractEventLoop
    ) -> None:
        self._engine = engine
        # Weak: the handoff is the value of a WeakKeyDictionary keyed by the caller loop.
        self._caller = weakref.ref(caller)
        self._pending: collections.deque[tuple[Callable[[Any], None], Any]] = collections.deque()
        self._armed = False

    def put(self, deliver: Callable[[Any], None], item: Any) -> None:
        self._pending.append((deliver, item))
        if not self._armed:
            self._armed = True
            self._engine.call_soon(self._wake)

    def _wake(self) -> None:
        self._armed = False
        caller = self._caller()
        try:
            if caller is None:
                raise RuntimeError("the caller's event loop is gone")
            caller.call_soon_threadsafe(self._flush)
        except RuntimeError:  # the caller's loop is closed or gone: nobody is left to read
            self._pending.clear()

    def _flush(self) -> None:
        pending = self._pending
        while pending:
            deliver, item = pending.popleft()
            deliver(item)


async def aiter_on(
    lt: LoopThread,
    agen_factory: Callable[[], AsyncIterator[T]],
    coalesce: Callable[[list[T]], list[T]] | None = None,
) -> AsyncIterator[T]:
    """Iterate, from the caller's event loop, an async generator that runs on ``lt``.

    With ``coalesce``, items that piled up while the consumer was busy are handed to it as a list
    and it returns fewer (e.g. :func:`vllm_inline.engine.stream.deltas.coalesce`); a consumer that
    keeps up gets every item as it was produced.
    """
    handoff = lt.handoff(asyncio.get_running_loop())
    items: asyncio.Queue[Any] = asyncio.Queue()
    put_nowait = items.put_nowait

    def put(item: Any) -> None:
        handoff.put(put_nowait, item)

    window = Window(lt.calls)
    pump = _start_pump(lt, agen_factory, put, window)
    ended = False
    try:
        while True:
            item = items.get_nowait() if not items.empty() else await items.get()
            if coalesce is not None and not items.empty() and _plain(item):
                taken, (*earlier, item) = _coalesced(item, items.get_nowait, items.empty, coalesce)
                window.took(taken)
                for plain in earlier:
                    yield plain
            else:
                window.took(1)
            if item is _DONE:
                ended = True
                return
            if isinstance(item, _Raised):
                ended = True
                raise item.exc
            yield item
    finally:
        if not ended:
            caller = asyncio.get_running_loop()
            stopped = caller.create_future()

            def then() -> None:
                try:
                    caller.call_soon_threadsafe(_resolve, stopped)
                except RuntimeError:  # the caller's loop is closed: nobody waits
                    pass

            pump.stop(then)
            _unreported_if_closing_only(asyncio.current_task())
            await asyncio.wait([stopped], timeout=_STOP_WAIT_S)


def iter_on(
    lt: LoopThread,
    agen_factory: Callable[[], AsyncIterator[T]],
    coalesce: Callable[[list[T]], list[T]] | None = None,
) -> Iterator[T]:
    """Iterate, from a synchronous caller, an async generator that runs on ``lt`` (``coalesce``
    as in :func:`aiter_on`). The caller's thread waits on an inbox of ``lt``'s
    :class:`~.relay.Relay`, which wakes the threads of many streams a few at a time."""
    items = lt.relay.inbox()
    window = Window(lt.calls)
    pump = _start_pump(lt, agen_factory, items.put, window)
    ended = False
    try:
        while True:
            item = items.get()
            if coalesce is not None and not items.empty() and _plain(item):
                taken, (*earlier, item) = _coalesced(item, items.get_nowait, items.empty, coalesce)
                window.took(taken)
                yield from earlier
            else:
                window.took(1)
            if item is _DONE:
                ended = True
                return
            if isinstance(item, _Raised):
                ended = True
                raise item.exc
            yield item
    finally:
        items.close()
        if not ended:
            stopped = threading.Event()
            pump.stop(stopped.set)
            if not lt.in_loop_thread:  # (closed by the garbage collector there: cannot wait)
                stopped.wait(_STOP_WAIT_S)


def _unreported_if_closing_only(task: asyncio.Task[Any] | None) -> None:
    """A stream left unfinished and dropped is closed by asyncio in a task of its own (the
    loop's async-generator finalizer). When the loop closes while that task waits here for the
    engine loop's confirmation (``asyncio.run`` ending with an exception), asyncio destroys it
    and logs "Task was destroyed but it is pending!" at ERROR. Nothing is lost then: the abort
    is already on its way on the engine loop. So a task that only closes this stream is not
    reported, as asyncio does for the tasks of its own ``run_until_complete``; a task of the
    caller's is left as it is."""
    if task is not None and type(task.get_coro()).__name__ == "async_generator_athrow":
        task._log_destroy_pending = False  # type: ignore[attr-defined]


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _plain(item: Any) -> bool:
    return item is not _DONE and not isinstance(item, _Raised)


def _coalesced(
    first: Any,
    get_nowait: Callable[[], Any],
    empty: Callable[[], bool],
    coalesce: Callable[[list[Any]], list[Any]],
) -> tuple[int, list[Any]]:
    """How many items were taken, and ``first`` and the items queued behind it, the plain ones
    coalesced; an end marker (the end of the stream or an error), if one was queued, comes last,
    as it was."""
    run = [first]
    end = None
    while not empty():
        item = get_nowait()
        if not _plain(item):
            end = item
            break
        run.append(item)
    merged = coalesce(run) if len(run) > 1 else run
    if end is None:
        return len(run), merged
    return len(run) + 1, [*merged, end]
