"""The relay that wakes synchronous consumers one after another, on plain async generators and
threads (no vLLM). Real engines' synchronous streams go through it in every sync test of the
suite (``Engine.stream``, ``ChatVLLM.stream``, ``VLLM.stream_chat``)."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import AsyncIterator

import pytest

from vllm_inline.engine.loop import relay
from vllm_inline.engine.loop.bridge import LoopThread, iter_on
from vllm_inline.engine.loop.relay import LANES


@pytest.fixture
def lt():
    loop_thread = LoopThread("test-relay")
    yield loop_thread
    loop_thread.stop()


class Steps:
    """Engine steps: every stream that waits for a step gets its next item in the same pass of
    the loop; the clock runs until every stream has had ``steps`` items."""

    def __init__(self, steps: int, period: float = 0.001) -> None:
        self.steps = steps
        self.period = period
        self.ticks: list[asyncio.Event] = []
        self.live = 0

    async def clock(self) -> None:
        while self.live:
            await asyncio.sleep(self.period)
            ticks, self.ticks = self.ticks, []
            for tick in ticks:
                tick.set()

    async def stream(self, name: int) -> AsyncIterator[tuple[int, int]]:
        self.live += 1
        try:
            for step in range(self.steps):
                tick = asyncio.Event()
                self.ticks.append(tick)
                await tick.wait()
                yield name, step
        finally:
            self.live -= 1


def _consume(lt: LoopThread, steps: Steps, name: int, got: dict[int, list[int]]) -> None:
    got[name] = [step for _, step in iter_on(lt, lambda: steps.stream(name))]


def _consumers(
    lt: LoopThread, steps: Steps, n: int, got: dict[int, list[int]]
) -> list[threading.Thread]:
    """``n`` threads, started, each reading stream ``i`` of ``steps`` into ``got[i]``."""
    threads = [threading.Thread(target=_consume, args=(lt, steps, i, got)) for i in range(n)]
    for t in threads:
        t.start()
    return threads


def _joined(threads: list[threading.Thread]) -> bool:
    """Whether every thread has ended (each given 30 s)."""
    for t in threads:
        t.join(timeout=30)
    return not any(t.is_alive() for t in threads)


def test_many_threads_get_every_step_in_order(lt) -> None:
    """More consumers than lanes, all waiting on the same steps: each gets every item, once,
    in order (items a consumer missed while others had the turn wait in its inbox)."""
    steps = Steps(40)
    got: dict[int, list[int]] = {}
    threads = _consumers(lt, steps, 8 * LANES, got)
    time.sleep(0.2)  # every stream is waiting for its first step
    lt.submit(steps.clock()).result(timeout=30)
    assert _joined(threads)
    assert got == {i: list(range(40)) for i in range(8 * LANES)}


def _ctrl_c() -> None:
    """SIGINT to the main thread, as Ctrl-C sends it: it also interrupts a blocking wait."""
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def test_a_consumer_that_leaves_does_not_hold_the_others(lt) -> None:
    """Consumers that stop reading (break) or are interrupted while waiting (Ctrl-C in the main
    thread) leave; the turn they held or were queued for goes on to the others."""
    for attempt in range(10):
        steps = Steps(200)
        got: dict[int, list[int]] = {}
        threads = _consumers(lt, steps, 3 * LANES, got)
        early = iter_on(lt, lambda s=steps: s.stream(-1))
        interrupted = iter_on(lt, lambda s=steps: s.stream(-2))
        time.sleep(0.2)
        clock = lt.submit(steps.clock())
        assert next(early) == (-1, 0)
        early.close()
        timer = threading.Timer(0.005 + attempt * 0.003, _ctrl_c)
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            for _ in interrupted:
                pass
        timer.join()
        clock.result(timeout=30)
        assert _joined(threads)
        assert got == {i: list(range(200)) for i in range(3 * LANES)}


def test_a_waiting_consumer_reads_its_inbox_when_no_turn_comes(lt, monkeypatch) -> None:
    """Turns only set the order: with no lane at all (a turn lost, in the extreme) every
    consumer still gets every item, from its periodic look at its inbox."""
    monkeypatch.setattr(relay, "LANES", 0)
    monkeypatch.setattr(relay, "RECHECK_S", 0.01)
    steps = Steps(20)
    got: dict[int, list[int]] = {}
    threads = _consumers(lt, steps, 4, got)
    time.sleep(0.1)
    lt.submit(steps.clock()).result(timeout=30)
    assert _joined(threads)
    assert got == {i: list(range(20)) for i in range(4)}
