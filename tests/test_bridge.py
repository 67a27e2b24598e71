"""The bridge between the engine loop and its callers, on plain async generators (no vLLM).

What the bridge does with real requests (a lagging consumer gets vLLM's merged outputs, leaving
early aborts the request) is tested on real engines in ``test_engine_streaming.py``; here are
the pump's own rules, which need a generator that counts what it was asked for.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from vllm_inline.engine.loop.bridge import LoopThread, aiter_on, iter_on
from vllm_inline.engine.loop.window import WINDOW


class Counting:
    """An endless (or ``n``-item) generator that records how many items it was asked for."""

    def __init__(self, n: int | None = None) -> None:
        self.n = n
        self.pulled = 0
        self.closed = False

    async def items(self) -> AsyncIterator[int]:
        try:
            while self.n is None or self.pulled < self.n:
                self.pulled += 1
                yield self.pulled - 1
                await asyncio.sleep(0)
        finally:
            self.closed = True


@pytest.fixture
def lt():
    loop_thread = LoopThread("test-bridge")
    yield loop_thread
    loop_thread.stop()


def test_a_lagging_sync_consumer_holds_its_pump_back(lt) -> None:
    gen = Counting()
    it = iter_on(lt, gen.items)
    assert next(it) == 0
    time.sleep(0.3)  # the pump could have made thousands of items meanwhile
    assert gen.pulled == 1 + WINDOW
    assert [next(it) for _ in range(5)] == [1, 2, 3, 4, 5]
    it.close()  # the pump waits for the consumer: closing still ends the generator
    assert gen.closed


async def test_a_lagging_async_consumer_holds_its_pump_back(lt) -> None:
    gen = Counting()
    it = aiter_on(lt, gen.items)
    assert await anext(it) == 0
    await asyncio.sleep(0.3)
    assert gen.pulled == 1 + WINDOW
    assert [await anext(it) for _ in range(5)] == [1, 2, 3, 4, 5]
    await it.aclose()
    assert gen.closed


def test_a_slow_consumer_gets_every_item_in_order_joined_or_not(lt) -> None:
    gen = Counting(200)
    seen: list[int] = []
    for i, run in enumerate(iter_on(lt, gen.items, coalesce=lambda xs: [xs])):
        seen.extend(run if isinstance(run, list) else [run])
        if i % 20 == 0:
            time.sleep(0.02)
    assert seen == list(range(200))
    assert gen.closed


async def test_many_async_consumers_that_lag_all_finish(lt) -> None:
    """Releases from many consumers in one pass of the caller loop are batched; none is lost."""

    async def consume() -> list[int]:
        gen = Counting(100)
        out = []
        async for x in aiter_on(lt, gen.items):
            out.append(x)
            if x % 7 == 0:
                time.sleep(0.001)  # noqa: ASYNC251 - blocks the caller loop: every pump lags
        return out

    results = await asyncio.wait_for(asyncio.gather(*(consume() for _ in range(64))), 60)
    assert results == [list(range(100))] * 64


def test_many_sync_consumers_that_lag_all_finish(lt) -> None:
    """Releases from consumer threads racing each other are batched; none is lost."""
    import threading

    results: list[list[int]] = []

    def consume() -> None:
        gen = Counting(100)
        out = []
        for x in iter_on(lt, gen.items):
            out.append(x)
            if x % 7 == 0:
                time.sleep(0.001)
        results.append(out)

    threads = [threading.Thread(target=consume) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [list(range(100))] * 32


def test_a_pump_cancelled_while_it_waits_for_its_consumer_tells_it_why(lt) -> None:
    """The engine cancels a request's task for a shutdown or a deadline, and the request path
    turns that into its typed error (``Runtime.guard``). When the task waits for a lagging
    consumer, the cancellation is raised inside the generator all the same."""

    class Typed(Exception):
        pass

    tasks: list[asyncio.Task] = []

    async def guarded() -> AsyncIterator[int]:
        tasks.append(asyncio.current_task())
        try:
            for i in range(100):
                yield i
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            raise Typed("shut down") from None

    it = iter_on(lt, guarded)
    assert next(it) == 0
    time.sleep(0.2)  # the pump now waits for this consumer
    lt.loop.call_soon_threadsafe(tasks[0].cancel)
    got = []
    with pytest.raises(Typed):
        for x in it:
            got.append(x)  # noqa: PERF402 - the items before the error
    assert got == list(range(1, 1 + WINDOW))  # what the pump had handed over, then the error


async def test_streams_started_while_the_engine_loop_is_busy_wake_it_once(lt, monkeypatch) -> None:
    """A bulk call starts its streams in one pass of its loop while the engine loop renders and
    adds the requests before them: one self-pipe write for all that wait, not one each."""
    import threading

    wakes = []
    plain = lt.loop.call_soon_threadsafe

    def counted(callback, *args, **kwargs):
        wakes.append(callback)
        return plain(callback, *args, **kwargs)

    monkeypatch.setattr(lt.loop, "call_soon_threadsafe", counted)
    busy, go = threading.Event(), threading.Event()
    lt.calls.call(lambda: (busy.set(), go.wait(10)))
    assert busy.wait(10)
    del wakes[:]  # the busy callback's own
    gens = [Counting(3) for _ in range(50)]
    streams = [aiter_on(lt, g.items) for g in gens]
    firsts = [asyncio.ensure_future(anext(s)) for s in streams]
    await asyncio.sleep(0.05)  # every stream has asked for its pump: all wait for the loop
    assert len(wakes) == 1 and not any(g.pulled for g in gens)
    go.set()
    assert await asyncio.wait_for(asyncio.gather(*firsts), 30) == [0] * 50
    for stream in streams:
        assert [x async for x in stream] == [1, 2]


def test_calls_from_many_threads_run_on_the_loop_in_each_threads_order(lt) -> None:
    import threading

    ran: list[tuple[int, int, bool]] = []

    def add(thread: int) -> None:
        for i in range(200):
            lt.calls.call(lambda t=thread, i=i: ran.append((t, i, lt.in_loop_thread)))

    threads = [threading.Thread(target=add, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    done = threading.Event()
    lt.calls.call(done.set)
    assert done.wait(10)
    assert all(on_loop for _, _, on_loop in ran)
    for thread in range(8):
        assert [i for t, i, _ in ran if t == thread] == list(range(200))


def test_calls_onto_a_closed_loop_are_refused_like_call_soon_threadsafe() -> None:
    lt = LoopThread("test-bridge-closed")
    lt.stop()
    with pytest.raises(RuntimeError, match="closed"):
        lt.calls.call(print)
    with pytest.raises(RuntimeError, match="closed"):
        list(iter_on(lt, Counting(3).items))
