"""A pytest plugin that counts the vLLM engines a test run starts, in this process or in any
process a test spawns, and names the test that was running when each one appeared.

vLLM names its engine-core process ``VLLM::EngineCore`` (``setproctitle``; a worker the engine
core forks bears that title until it sets its own, and is not counted); a background thread
lists ``/proc`` twice a second (an engine lives for seconds at the very least) and remembers
each engine-core pid it has seen that descends from this run (another run's engines on the same
machine are not counted). It only reads: it never signals a process. The summary
(``engine starts: N``, per module) prints at the end of the run; ``--engine-starts`` lists
every start. A run that deselects ``engine`` tests (``make test-fast``) fails if any engine
starts.
"""

from __future__ import annotations

import os
import threading
from collections import Counter

import pytest

_PROC = "/proc"
_TITLE = b"VLLM::EngineCore"


def _parent(pid: int) -> int:
    with open(f"{_PROC}/{pid}/stat", "rb") as f:
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after it.
        return int(f.read().rsplit(b")", 1)[1].split()[1])


def _descends_from(pid: int, root: int) -> bool:
    try:
        while pid > 1:
            pid = _parent(pid)
            if pid == root:
                return True
    except (OSError, ValueError, IndexError):
        pass
    return False


def _engine_cores() -> set[int]:
    """Engine-core pids among this process's descendants."""
    root = os.getpid()
    found: set[int] = set()
    try:
        names = os.listdir(_PROC)
    except OSError:
        return found
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"{_PROC}/{name}/cmdline", "rb") as f:
                if f.read(len(_TITLE)) == _TITLE and _descends_from(int(name), root):
                    found.add(int(name))
        except OSError:
            continue
    # A worker an engine core forks bears its title until it sets its own (engine/seam/vllm_boot.py).
    return {pid for pid in found if _parent_or_none(pid) not in found}


def _parent_or_none(pid: int) -> int | None:
    try:
        return _parent(pid)
    except (OSError, ValueError, IndexError):
        return None


class EngineStarts:
    """Engine-core pids seen during the run, each with the test that was running."""

    def __init__(self) -> None:
        self.current = "(collection)"
        self.starts: dict[int, str] = {}
        self._stop = threading.Event()
        self._before = _engine_cores()  # engines started before the run (at import time)
        self._thread = threading.Thread(target=self._watch, name="engine-starts", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            self.scan()

    def scan(self) -> None:
        for pid in _engine_cores() - self._before:
            self.starts.setdefault(pid, self.current)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.scan()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--engine-starts", action="store_true", help="list every vLLM engine start of the run"
    )


def pytest_configure(config: pytest.Config) -> None:
    # Under pytest-xdist the controller watches for every worker (it sees their engines too).
    if os.path.isdir(_PROC) and not hasattr(config, "workerinput"):
        global _watcher
        _watcher = config.stash[_KEY] = EngineStarts()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    watcher = _watcher
    if watcher is not None:
        watcher.scan()  # an engine started by the previous test's teardown belongs to it
        watcher.current = nodeid  # with xdist workers: the test that began last


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    watcher = session.config.stash.get(_KEY, None)
    if watcher is None:
        return
    watcher.stop()
    # `make test-fast` selects the tests not marked `engine`: one that starts an engine anyway
    # is missing its marker, and the fast tier would slow down unseen.
    if watcher.starts and "not engine" in session.config.getoption("markexpr"):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    watcher = config.stash.get(_KEY, None)
    if watcher is None:
        return
    starts = watcher.starts
    terminalreporter.write_line(f"engine starts: {len(starts)}")
    if starts and "not engine" in config.getoption("markexpr"):
        terminalreporter.write_line(
            "FAILED: tests not marked `engine` started an engine (mark them "
            "pytest.mark.engine): " + ", ".join(sorted(set(starts.values())))
        )
    by_module = Counter(test.split("::")[0] for test in starts.values())
    if by_module:
        terminalreporter.write_line(
            "  by module: " + ", ".join(f"{m} {n}" for m, n in by_module.most_common())
        )
    if config.getoption("--engine-starts"):
        for pid, test in sorted(starts.items()):
            terminalreporter.write_line(f"  {pid} {test}")


_KEY = pytest.StashKey[EngineStarts]()
_watcher: EngineStarts | None = None
