"""The threads that consume synchronous streams, woken a few at a time.

A synchronous stream's consumer is a thread that blocks until its stream's next item comes. An
engine step has an item for every live stream at once. Woken all at once, as a queue per stream
wakes them, hundreds of threads become runnable together and queue for the interpreter lock,
and the engine loop's own thread, which makes every stream's next step, queues behind them: the
steps come late for every stream, and the streams get fewer tokens than the engine makes
(docs/performance.md, "Round 10"). Here the engine loop wakes the first :data:`LANES` waiting
consumers only; each one, once awake, wakes the next waiting one before it handles its item. A
few consumer threads ask for the lock at a time, and a consumer whose turn comes after more than
one step finds them all in its inbox, which the bridge coalesces into one chunk.

Turns only set the order: a waiting consumer also looks at its inbox every
:data:`RECHECK_S`, so a turn lost to an exception (``KeyboardInterrupt`` in the main thread
between two bytecodes of a hand-over) delays a stream and never stops it.

Written by hand: the standard library's queues wake their waiter on every put, and a
``threading.Condition`` wakes the threads it notifies together.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from typing import Any

__all__ = ["LANES", "RECHECK_S", "Inbox", "Relay"]

LANES = 8
"""How many woken consumers may be handing the turn on at once. With one, each wake waits for
the thread before it to be scheduled and to take the interpreter lock; a few hide that wait and
still leave the engine loop near the lock."""

RECHECK_S = 1.0
"""How often a waiting consumer looks at its inbox without being woken (see above)."""


class Relay:
    """The consumers of one engine loop's synchronous streams, woken in turn.

    Engine loop: :meth:`Inbox.put` adds an item, and an inbox whose consumer waits joins the
    queue of those to wake; the first such put of a pass of the loop schedules :meth:`_start`
    after the pass, so no consumer wakes while the loop still turns that step's outputs into
    items for the other streams. Consumer threads: a woken consumer wakes the next queued one.
    Everything the two sides share is changed under ``_lock``.
    """

    __slots__ = ("_armed", "_lock", "_loop", "_queued", "_turns")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        # Reentrant: a stream dropped in a reference cycle is closed by the garbage collector
        # in whatever thread collects, which may be one that holds this lock.
        self._lock = threading.RLock()
        self._queued: collections.deque[Inbox] = collections.deque()
        self._turns = 0  # woken consumers that have yet to wake the next one
        self._armed = False  # _start is scheduled on the loop (engine loop only)

    def inbox(self) -> Inbox:
        """A new stream's inbox."""
        return Inbox(self)

    def _start(self) -> None:
        self._armed = False
        with self._lock:
            while self._turns < LANES and self._queued:
                self._turns += 1
                self._queued.popleft()._wake()

    def _hand_on(self) -> None:
        """A turn ends: wake the first queued consumer with it, if any (hold ``_lock``)."""
        if self._queued:
            self._queued.popleft()._wake()
        else:
            self._turns -= 1


class Inbox:
    """One synchronous stream's items, put on the engine loop and taken by its consumer."""

    __slots__ = ("_closed", "_in_line", "_relay", "_turn", "_waiting", "_woken", "items")

    def __init__(self, relay: Relay) -> None:
        self._relay = relay
        self.items: collections.deque[Any] = collections.deque()
        """Items not taken yet, oldest first."""
        # Held until this consumer's turn comes: a binary semaphore in C (released once per
        # turn, under the relay's lock), where ``threading.Semaphore`` is Python code.
        self._woken = threading.Lock()
        self._woken.acquire()
        self._waiting = False  # the consumer waits for an item and is not queued
        self._in_line = False  # queued to be woken (taken off the relay's queue by _wake)
        self._turn = False  # woken: the consumer is to hand the turn on
        self._closed = False

    def _wake(self) -> None:  # hold the relay's lock
        self._in_line = False
        self._turn = True
        self._woken.release()

    def _leave_line(self) -> None:
        """Off the relay's queue without a turn (hold the relay's lock)."""
        self._in_line = False
        try:
            self._relay._queued.remove(self)
        except ValueError:  # taken off it by a consumer interrupted before it woke this one:
            self._relay._hand_on()  # that consumer's turn is this one's to hand on

    def put(self, item: Any) -> None:
        """Add ``item`` (engine loop)."""
        relay = self._relay
        with relay._lock:
            if self._closed:
                return
            self.items.append(item)
            if not self._waiting:
                return
            self._waiting = False
            self._in_line = True
            relay._queued.append(self)
        if not relay._armed:
            relay._armed = True
            relay._loop.call_soon(relay._start)

    def get(self) -> Any:
        """The oldest item; blocks until there is one (consumer thread)."""
        if self.items:  # only this thread takes items: one that is here stays here
            return self.items.popleft()
        relay = self._relay
        with relay._lock:
            if self.items:
                return self.items.popleft()
            self._waiting = True
        try:
            while True:
                self._woken.acquire(timeout=RECHECK_S)
                with relay._lock:
                    if not self.items:  # not woken yet: wait on
                        continue
                    if self._turn:
                        self._woken.acquire(blocking=False)  # woken after the timeout
                        relay._hand_on()
                        self._turn = False
                    elif self._in_line:  # items, and no turn yet: do not wait for it
                        self._leave_line()
                    return self.items.popleft()
        except BaseException:  # KeyboardInterrupt: hand on a turn that came to this consumer
            self.close()
            raise

    def empty(self) -> bool:
        """Whether no item is waiting (consumer thread)."""
        return not self.items

    def get_nowait(self) -> Any:
        """The oldest item, when :meth:`empty` said there is one (consumer thread)."""
        return self.items.popleft()

    def close(self) -> None:
        """The consumer leaves: later items are dropped, and a turn that came to it is handed
        on (consumer thread)."""
        relay = self._relay
        with relay._lock:
            if self._closed:
                return
            self._closed = True
            self._waiting = False
            self.items.clear()
            if self._in_line:
                self._leave_line()
            if self._turn:
                relay._hand_on()
                self._turn = False
