"""``make test`` runs with ``-m 'not parallel and not real'`` (pyproject): it neither runs nor imports these
modules, which need the ``ray`` extra that only ``make test-parallel`` installs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from processes import Started, clean_up, held_shm, shm_entries

_LEFT: list[tuple[str, list[str]]] = []  # (test, /dev/shm entries left unheld after it)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if "not parallel" in config.getoption("markexpr"):
        return True
    return None


@pytest.fixture
def started() -> Iterator[Started]:
    """Register the processes a test starts (``started.track(pid)``): at the end of the test
    whatever is left of them is killed, by pid, and the ``/dev/shm`` entries they held are
    removed."""
    tracked = Started()
    yield tracked
    tracked.clean_up()


@pytest.fixture(scope="session")
def shm_at_start() -> set[str]:
    """``/dev/shm`` before this session's first parallel test: nothing in it is the session's."""
    return shm_entries()


@pytest.fixture(autouse=True)
def no_segment_left_unheld(
    request: pytest.FixtureRequest, shm_at_start: set[str]
) -> Iterator[None]:
    """After each test, an entry of ``/dev/shm`` that appeared during the session and that no
    process holds any more is a leak (an engine shut down or killed without unlinking it): it
    is removed and reported at the end with the test after which it was found, so that a leak
    that happens once in several runs is named, not silently carried to the next run."""
    yield
    new = shm_entries() - shm_at_start
    if not new or not (unheld := new - held_shm(psutil.process_iter(), new)):
        return
    time.sleep(1.0)  # an entry between its creation and its first mapping is not a leak
    unheld &= shm_entries()
    unheld -= held_shm(psutil.process_iter(), unheld)
    clean_up((), unheld)
    if unheld:
        _LEFT.append((request.node.nodeid, sorted(unheld)))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for test, names in _LEFT:
        terminalreporter.write_line(
            f"/dev/shm entries held by no process after {test} (removed): {', '.join(names)}",
            yellow=True,
        )
