"""What a test that starts processes needs to clean up after itself: the processes a child
started (by pid and start time, never by name) and the ``/dev/shm`` entries that appeared
while it ran."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

import psutil

SHM = "/dev/shm"


def shm_entries() -> set[str]:
    """Names in ``/dev/shm`` now (multiprocessing's ``psm_*`` segments and ``sem.mp-*``
    semaphores among them)."""
    try:
        return set(os.listdir(SHM))
    except FileNotFoundError:
        return set()


def process_tree(pid: int) -> list[psutil.Process]:
    """``pid`` and every process below it, as :class:`psutil.Process` objects (which remember
    each process's start time, so a reused pid is never mistaken for one of these)."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def alive(processes: Iterable[psutil.Process]) -> list[psutil.Process]:
    """Those of ``processes`` that still run (zombies count as gone)."""
    running = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                running.append(p)
        except psutil.NoSuchProcess:
            pass
    return running


def wait_gone(
    processes: list[psutil.Process], entries: set[str], timeout: float
) -> tuple[list[psutil.Process], set[str], float]:
    """Wait up to ``timeout`` s for ``processes`` to exit and ``entries`` to leave
    ``/dev/shm``; returns what is still there and the seconds waited."""
    start = time.monotonic()
    while True:
        left, shm_left = alive(processes), entries & shm_entries()
        waited = time.monotonic() - start
        if (not left and not shm_left) or waited > timeout:
            return left, shm_left, waited
        time.sleep(0.1)


def clean_up(processes: Iterable[psutil.Process], entries: Iterable[str]) -> None:
    """Kill what is left of ``processes`` and remove ``entries`` from ``/dev/shm``: the ones this
    test created, whatever happened."""
    for p in alive(processes):
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive(processes), timeout=10)
    for name in entries:
        try:
            os.unlink(os.path.join(SHM, name))
        except FileNotFoundError:
            pass
