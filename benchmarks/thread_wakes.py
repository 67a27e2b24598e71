"""What handing one token to each of N consumers costs this host, with no other work:
a thread per consumer (``ChatVLLM.stream``'s shape), woken all at once or a few at a time (the
engine's relay, ``engine/loop/relay.py``), against a task per consumer on one event loop
(``ChatVLLM.astream``'s shape).

    python benchmarks/thread_wakes.py [--consumers 256] [--rates 6400,12800,25600,51200]

One producer puts one item into each consumer's queue per step, at the offered rate in items
per second over all consumers (``consumers / step``), as the GPU-rate simulation's engine
gives each stream one token a step (``gpu_sim.py``). Threads block on a
``queue.SimpleQueue`` (what the engine's sync bridge used until the relay), or on the relay's
inboxes, filled from an event loop as the engine loop fills them; tasks await an
``asyncio.Queue`` (what its async bridge uses). A consumer only counts what it gets. Each line is the process's
CPU time (user and kernel) per item handed over, and that as a share of one core at the rate:
on a 2-vCPU VM a thread's wake-up costs a futex wake and a switch that a task never pays.
"""

from __future__ import annotations

import argparse
import asyncio
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

SECONDS = 3.0


class _Clock:
    """Paces the producer's steps over :data:`SECONDS` and measures them."""

    def __init__(self, consumers: int, rate: float) -> None:
        self.step = consumers / rate
        self.cpu0, self.wall0 = time.process_time(), time.perf_counter()
        self.due = self.wall0

    def running(self) -> bool:
        return time.perf_counter() - self.wall0 < SECONDS

    def pause(self) -> float:
        """Seconds to sleep until the next step is due."""
        self.due += self.step
        return max(0.0, self.due - time.perf_counter())

    def result(self, got: list[int]) -> tuple[float, float]:
        """(items delivered per second, CPU seconds per item) since the start."""
        wall, cpu = time.perf_counter() - self.wall0, time.process_time() - self.cpu0
        return sum(got) / wall, cpu / sum(got)


async def _produce(
    consumers: int, rate: float, puts: list[Callable[[int | None], None]], got: list[int]
) -> tuple[float, float]:
    """One item to each consumer a step, at ``rate``, for :data:`SECONDS`; then the end (None)
    to each. Returns what :meth:`_Clock.result` measured."""
    clock = _Clock(consumers, rate)
    while clock.running():
        for put in puts:
            put(1)
        await asyncio.sleep(clock.pause())
    result = clock.result(got)
    for put in puts:
        put(None)
    return result


def _threads(
    consumers: int, rate: float, make: Callable[[asyncio.AbstractEventLoop], Any]
) -> tuple[float, float]:
    """(items delivered per second, CPU seconds per item) with one thread per consumer, each
    blocked on what ``make(loop)`` returns (``put`` on the loop, ``get`` in the thread); the
    producer runs on an event loop, as the engine loop puts a step's items."""

    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        queues = [make(loop) for _ in range(consumers)]
        got = [0] * consumers

        def consume(i: int) -> None:
            q = queues[i]
            while q.get() is not None:
                got[i] += 1

        workers = [threading.Thread(target=consume, args=(i,)) for i in range(consumers)]
        for w in workers:
            w.start()
        result = await _produce(consumers, rate, [q.put for q in queues], got)
        await asyncio.to_thread(lambda: [w.join() for w in workers])
        return result

    return asyncio.run(main())


def threads(consumers: int, rate: float) -> tuple[float, float]:
    """One thread per consumer on a ``queue.SimpleQueue``: every put wakes its thread."""
    return _threads(consumers, rate, lambda _loop: queue.SimpleQueue())


def relay(consumers: int, rate: float) -> tuple[float, float]:
    """One thread per consumer, woken by the engine's relay."""
    from vllm_inline.engine.loop.relay import Relay

    shared: list[Relay] = []

    def inbox(loop: asyncio.AbstractEventLoop) -> Any:
        if not shared:
            shared.append(Relay(loop))
        return shared[0].inbox()

    return _threads(consumers, rate, inbox)


def tasks(consumers: int, rate: float) -> tuple[float, float]:
    """(items delivered per second, CPU seconds per item) with one task per consumer."""

    async def main() -> tuple[float, float]:
        queues: list[asyncio.Queue[int | None]] = [asyncio.Queue() for _ in range(consumers)]
        got = [0] * consumers

        async def consume(i: int) -> None:
            q = queues[i]
            while await q.get() is not None:
                got[i] += 1

        running = [asyncio.create_task(consume(i)) for i in range(consumers)]
        result = await _produce(consumers, rate, [q.put_nowait for q in queues], got)
        await asyncio.gather(*running)
        return result

    return asyncio.run(main())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--consumers", type=int, default=256)
    ap.add_argument("--rates", default="6400,12800,25600,51200")
    args = ap.parse_args()
    print(
        f"{args.consumers} consumers, {SECONDS:.0f} s per line; CPU = this process's, user + kernel"
    )
    print(f"{'rate':>7}  {'shape':<8} {'delivered':>9}  {'us/item':>7}  {'core':>5}  against tasks")
    for rate in (float(r) for r in args.rates.split(",") if r):
        rows = {
            "threads": threads(args.consumers, rate),
            "relay": relay(args.consumers, rate),
            "tasks": tasks(args.consumers, rate),
        }
        for shape, (delivered, per_item) in rows.items():
            ratio = per_item / rows["tasks"][1]
            print(
                f"{rate:>7.0f}  {shape:<8} {delivered:>9.0f}  {per_item * 1e6:>7.1f}  "
                f"{per_item * delivered * 100:>4.0f}%  {ratio:.1f}x"
            )


if __name__ == "__main__":
    main()
