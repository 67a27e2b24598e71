"""How far a stream's pump (on the engine loop) may run ahead of its consumer (any thread).

:mod:`.bridge` hands a stream's items from the engine loop to its consumer. A :class:`Window`
counts what the pump handed over and what the consumer took; the pump waits while
:data:`WINDOW` items are not taken yet. The engine-side generator then does not ask vLLM for its
next output, and vLLM's output collector merges the DELTA outputs that arrive meanwhile: a
consumer that falls behind gets fewer, larger deltas, and the whole request path runs once per
merged output instead of once per token. A consumer that keeps up never makes its pump wait.
Consumers wake waiting pumps through the engine loop's :class:`.calls.ThreadsafeCalls`, one
thread hop for all the pumps a step's consumers release.

Written by hand: asyncio's queues and locks are bound to one loop, and ``queue.Queue`` blocks a
thread, while here one side is a coroutine on the engine loop and the other any thread or loop.
"""

from __future__ import annotations

import asyncio

from vllm_inline.engine.loop.calls import ThreadsafeCalls

__all__ = ["WINDOW", "Window"]

WINDOW = 2
"""How many items a pump hands over that its consumer has not taken yet before it waits.

Two, so that a consumer that keeps up (takes each step's item before the next step's) never
holds its pump back, and one that is a step behind gets the two pending items joined by
``coalesce`` while vLLM merges the next ones."""


class Window:
    """How far a pump (engine loop) is ahead of its consumer (any thread).

    ``sent`` is written only by the pump and ``taken`` only by the consumer, so neither needs
    a lock. The pump says it waits (``waiting``) before it checks ``taken`` once more, and the
    consumer counts what it took before it looks at ``waiting``: one of them sees the other,
    so a consumer never leaves its pump waiting. A release that comes when the pump no longer
    waits is harmless (the pump checks again).
    """

    __slots__ = ("_calls", "_waiter", "sent", "taken", "waiting")

    def __init__(self, calls: ThreadsafeCalls) -> None:
        self._calls = calls
        self._waiter: asyncio.Future[None] | None = None
        self.sent = 0
        self.taken = 0
        self.waiting = False

    async def after_put(self) -> None:
        """Count an item handed over; wait while the consumer has :data:`WINDOW` not taken."""
        self.sent += 1
        while self.sent - self.taken >= WINDOW:
            self.waiting = True
            if self.sent - self.taken < WINDOW:
                break
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        self.waiting = False

    def took(self, n: int) -> None:
        """The consumer took ``n`` items (any thread)."""
        self.taken += n
        if self.waiting:
            try:
                self._calls.call(self.release)
            except RuntimeError:  # the engine loop is closed: its pumps are gone
                pass

    def release(self) -> None:
        """Wake the pump to check again (engine loop)."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
