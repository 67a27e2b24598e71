"""Commands the tests run in processes of their own, started early and together.

A test of the CLI or of a first run (exit code, stdout, stderr) needs a process of its own, and
each such process starts vLLM: about 30 s here, much of it one core importing. A test names its
command with ``@pytest.mark.launches("name")`` and reads the finished process with
``launches.result("name")``; tests/conftest.py starts the commands of the selected tests while
the suite's shared engines start, so they run side by side instead of one after another (two at
a time: :data:`AT_ONCE`). A test
run alone starts its command at its first ``result``. A process no test read is killed, by its
pid, when the session ends. The commands are registered with :func:`command` by the test
modules; the factory gets a fresh directory of its own.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest


@dataclass
class Command:
    argv: list[str]
    env: dict[str, str]
    cwd: Path | None = None
    stdin: str = ""
    timeout: float = 600


COMMANDS: dict[str, Callable[[Path], Command]] = {}


def command(name: str) -> Callable[[Callable[[Path], Command]], Callable[[Path], Command]]:
    """Register ``factory(directory) -> Command`` under ``name``."""

    def register(factory: Callable[[Path], Command]) -> Callable[[Path], Command]:
        COMMANDS[name] = factory
        return factory

    return register


AT_ONCE = 2
"""Commands running at once: each starts vLLM (a GB or two of memory, a core while it imports),
beside the suite's shared engines; the others wait for a slot."""


@dataclass
class _Running:
    process: subprocess.Popen[str] | None = None
    reader: threading.Thread = field(default_factory=lambda: threading.Thread(target=lambda: None))
    result: list[subprocess.CompletedProcess[str]] = field(default_factory=list)


class Launches:
    """The session's launched commands, by name."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._tmp = tmp_path_factory
        self._running: dict[str, _Running] = {}
        self._slots = threading.BoundedSemaphore(AT_ONCE)
        self._closed = False

    def start(self, name: str) -> None:
        """Start ``name``'s command once a slot is free (at most :data:`AT_ONCE` run at once)."""
        if name in self._running:
            return
        cmd = COMMANDS[name](self._tmp.mktemp(name))
        running = self._running[name] = _Running()

        def run() -> None:
            with self._slots:
                if self._closed:
                    return
                process = subprocess.Popen(
                    cmd.argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=cmd.env,
                    cwd=cmd.cwd,
                )
                running.process = process
                try:  # both pipes at once, or a full one would stall the process
                    out, err = process.communicate(cmd.stdin, timeout=cmd.timeout)
                except subprocess.TimeoutExpired:
                    process.kill()
                    out, err = process.communicate()
                    err += f"\n[killed after {cmd.timeout} s]"
                running.result.append(
                    subprocess.CompletedProcess(cmd.argv, process.returncode, out, err)
                )

        running.reader = threading.Thread(target=run, name=f"launch-{name}", daemon=True)
        running.reader.start()

    def result(self, name: str) -> subprocess.CompletedProcess[str]:
        self.start(name)
        running = self._running[name]
        running.reader.join()
        return running.result[0]

    def close(self) -> None:
        self._closed = True  # commands still waiting for a slot never start
        for running in self._running.values():
            if running.process is not None and running.process.poll() is None:
                running.process.kill()
            running.reader.join(timeout=30)
