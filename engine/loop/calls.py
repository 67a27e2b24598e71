"""Calls from any thread onto one event loop, one thread hop per batch.

``loop.call_soon_threadsafe`` writes to the loop's self-pipe on every call, and each write wakes
the loop's thread, which then asks for the interpreter lock. A bulk call starts hundreds of
streams in one pass of its own loop and a step's consumers release their pumps together:
:class:`ThreadsafeCalls` queues those calls and wakes the loop once for all that are queued
when it gets there. Written by hand because asyncio offers only the one-call-one-wake form.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Any

__all__ = ["ThreadsafeCalls"]


class ThreadsafeCalls:
    """Callbacks for one event loop, added from any thread, run there in the order added.

    The first call of a batch schedules :meth:`_run` on the loop; calls added before it runs go
    with it. ``_armed`` is cleared before the batch is taken, so a call added meanwhile either
    is taken by this run or schedules the next one. One thread's calls keep their order, also
    among its plain ``call_soon_threadsafe`` calls made after them (the run that takes a call
    is scheduled before the call is added or takes it in the pass already under way).
    """

    __slots__ = ("_armed", "_loop", "_pending")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._pending: collections.deque[tuple[Callable[..., None], tuple[Any, ...]]] = (
            collections.deque()
        )
        self._armed = False

    def call(self, callback: Callable[..., None], *args: Any) -> None:
        """Run ``callback(*args)`` on the loop soon; ``RuntimeError`` when the loop is closed,
        as ``call_soon_threadsafe`` raises it."""
        if self._loop.is_closed():
            raise RuntimeError("Event loop is closed")
        self._pending.append((callback, args))
        if not self._armed:
            self._armed = True
            try:
                self._loop.call_soon_threadsafe(self._run)
            except RuntimeError:  # closed since the check above: nothing runs there any more
                self._pending.clear()
                raise

    def _run(self) -> None:
        self._armed = False
        pending = self._pending
        while pending:
            callback, args = pending.popleft()
            callback(*args)
