"""Child processes that run one side of a benchmark, and how they are stopped.

- :class:`LineChild`: a child kept up for a whole run, answering each request line on its stdin
  with a ``RESULT`` JSON line on its stdout (``bulk.py``'s ``vllm.LLM.chat`` reference,
  ``compare.py``'s versions); :func:`answer_lines` is the child's side of it.
- :func:`run_to_end`: a child that runs one side to its end (``rag.py``'s sides).
- :func:`stop`: signals, one after the other, until a child has exited; :func:`exit_on_sigterm`
  makes SIGTERM run a process's ``finally`` blocks, as Ctrl-C does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["LineChild", "answer_lines", "exit_on_sigterm", "run_to_end", "stop"]

READY = "READY "
"""The line a :class:`LineChild` prints once it is ready, with a JSON value after it."""

RESULT = "RESULT "
"""The start of a :class:`LineChild`'s answer line; a JSON value follows."""


def stop(proc: subprocess.Popen[Any], steps: Sequence[tuple[int, bool, float | None]]) -> None:
    """Signal ``proc`` step by step until it has exited. Each step is ``(signal, to its process
    group, seconds to wait)``; ``None`` waits until it exits. A step is skipped, and so are the
    ones after it, once the process has exited."""
    for sig, group, grace in steps:
        if proc.poll() is not None:
            return
        (os.killpg if group else os.kill)(proc.pid, sig)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass


def _raise_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def exit_on_sigterm() -> None:
    """From now on SIGTERM raises ``SystemExit(143)``, so that ``finally`` blocks run (children,
    servers, engines and worktrees are cleaned up) as on Ctrl-C; Python's default ends the
    process without them."""
    signal.signal(signal.SIGTERM, _raise_exit)


class LineChild:
    """A child process kept up for a whole run: it prints a ``READY`` line with a JSON value
    once it is set up, then answers each JSON request line on its stdin with one ``RESULT`` JSON
    line on its stdout (its other lines, vLLM's log for one, may come between them). The child's
    side is :func:`answer_lines`.

    ``own_group``: the child gets a process group of its own (:meth:`kill` then takes its
    engine processes with it), in this session (see ``servers.start_server``: a new session is
    a new scheduler autogroup)."""

    def __init__(
        self,
        cmd: list[str],
        name: str,
        *,
        own_group: bool = False,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        """How errors name the child (``the vllm.LLM.chat child``)."""
        self._own_group = own_group
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            process_group=0 if own_group else None,
            env=env,
        )

    def _line(self, prefix: str) -> str:
        """The rest of the next stdout line that starts with ``prefix``."""
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.startswith(prefix):
                return line[len(prefix) :]
        raise RuntimeError(f"{self.name} exited (rc {self._proc.wait()})")

    def ready(self) -> Any:
        """Wait for the ``READY`` line; its value."""
        return json.loads(self._line(READY))

    def ask(self, request: Any) -> Any:
        """Send ``request`` (a JSON value) as one line; the value of the ``RESULT`` line."""
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        return json.loads(self._line(RESULT))

    def close(self, timeout: float = 120) -> None:
        """Close its stdin (it ends its loop and exits); kill it if it has not within
        ``timeout`` seconds."""
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def kill(self) -> None:
        """SIGKILL it (its process group with ``own_group``) unless it has exited."""
        stop(self._proc, ((signal.SIGKILL, self._own_group, None),))


def answer_lines(handle: Callable[[Any], Any], ready: Any = None) -> None:
    """The child's side of :class:`LineChild`: print ``READY`` with ``ready``, then answer each
    stdin line (a JSON value) with ``RESULT`` and ``handle(value)``, until stdin closes."""
    print(READY + json.dumps(ready), flush=True)
    for line in sys.stdin:
        print(RESULT + json.dumps(handle(json.loads(line))), flush=True)


def run_to_end(cmd: list[str], name: str, env: dict[str, str]) -> None:
    """Run ``cmd`` to its end, its stdout on this process's stderr, in a process group of its
    own (in this session, as :class:`LineChild`); raise if it fails. On an error or Ctrl-C here
    it is stopped by its pid: SIGINT, then SIGTERM (a child that calls :func:`exit_on_sigterm`
    cleans up on either), then SIGKILL to its group."""
    child = subprocess.Popen(cmd, stdout=sys.stderr, process_group=0, env=env)
    try:
        if child.wait() != 0:
            raise RuntimeError(f"{name} failed (exit {child.returncode}): see stderr")
    finally:
        stop(
            child,
            (
                (signal.SIGINT, False, 120),
                (signal.SIGTERM, False, 60),
                (signal.SIGKILL, True, None),
            ),
        )
