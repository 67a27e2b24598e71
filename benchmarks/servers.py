"""vLLM's OpenAI-compatible server, as the benchmarks run it beside vllm-inline: engine options
as its flags, a free port, the start with the user's environment, the wait for ``/health`` and
the stop of the server with its engine processes.

Import this module before the script changes ``os.environ``: :data:`USER_ENV` is taken when it
is first imported.
"""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

from children import stop

__all__ = [
    "USER_ENV",
    "cli_flags",
    "free_port",
    "start_both",
    "start_ours",
    "start_server",
    "stop_server",
    "wait_healthy",
]

USER_ENV = dict(os.environ)
"""The environment the script started with: the server gets it, as a ``vllm serve`` started
from the user's shell would. Not ``os.environ`` at the server's start: an engine started in this
process changes it (vLLM's CPU platform sets ``LD_PRELOAD`` to torch's libgomp,
``VLLM_WORKER_MULTIPROC_METHOD``, ``LOCAL_WORLD_SIZE``, ...), and so do the scripts' defaults
(``VLLM_LOGGING_LEVEL``, ``TOKENIZERS_PARALLELISM``)."""


def cli_flags(options: dict[str, Any]) -> list[str]:
    """Engine options (``AsyncEngineArgs`` names) as ``vllm serve`` flags: ``--max-model-len
    512``; ``True`` becomes the bare flag (``--enforce-eager``)."""
    out = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        out += [flag] if value is True else [flag, str(value)]
    return out


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    model: str,
    port: int,
    options: dict[str, Any],
    log_path: pathlib.Path,
    extra: list[str] | tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start vLLM's OpenAI-compatible server (``python -m vllm.entrypoints.openai.api_server``,
    what ``vllm serve`` runs) for ``model`` on 127.0.0.1:``port`` with ``options`` as flags and
    ``extra`` flags after them; its output goes to ``log_path``. Stop it with :func:`stop_server`.

    It gets the environment this script started with (:data:`USER_ENV`; only the log level
    differs, and ``env`` on top), and its own process group (so that :func:`stop_server` can signal the server and
    its engine processes together) but this session: a new session is a new scheduler autogroup
    on Linux, and the kernel then shares the CPUs between the server's session, whose engine
    core and worker busy-poll, and this client's, so the client waited on the run queue at
    every token (~0.5 s per request here, see docs/performance.md "The HTTP row").
    """
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *cli_flags(options),
        *extra,
    ]
    return _launch(cmd, log_path, env)


def _launch(
    command: list[str], log_path: pathlib.Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``command`` in a process group of its own (not a session: see :func:`start_server`),
    its output to ``log_path``, with :data:`USER_ENV`, vLLM's log level at warnings and
    ``env`` on top."""
    with open(log_path, "wb") as server_log:
        return subprocess.Popen(
            command,
            stdout=server_log,
            stderr=subprocess.STDOUT,
            process_group=0,
            env={**USER_ENV, "VLLM_LOGGING_LEVEL": "WARNING", **(env or {})},
        )


def wait_healthy(
    url: str, proc: subprocess.Popen[bytes], timeout: float, interval: float = 0.5
) -> None:
    """Poll ``url`` (a server's ``/health``) every ``interval`` seconds until it answers 200;
    raise if ``proc`` exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM's server exited with {proc.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(interval)
    raise TimeoutError(f"vLLM's server was not healthy within {timeout:.0f} s")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """Stop a server from :func:`start_server` and its engine processes: SIGTERM to its process
    group (by the server's pid), SIGKILL after 30 s."""
    stop(proc, ((signal.SIGTERM, True, 30), (signal.SIGKILL, True, None)))


def start_ours(
    model: str, port: int, options: dict[str, Any], served_name: str, log_path: pathlib.Path
) -> subprocess.Popen[bytes]:
    """``python -m vllm_inline serve MODEL`` on 127.0.0.1:``port``, serving ``model`` as
    ``served_name`` with ``options`` as ``vllm serve``'s flags (the same command line as
    :func:`start_server`'s); its output goes to ``log_path``, its environment as there."""
    command = [sys.executable, "-m", "vllm_inline", "serve", model, "--port", str(port),
               "--served-model-name", served_name, *cli_flags(options)]  # fmt: skip
    return _launch(command, log_path)


def start_both(
    model: str, options: dict[str, Any], served_name: str, directory: str
) -> dict[str, tuple[int, subprocess.Popen[bytes]]]:
    """Ours (:func:`start_ours`) and ``vllm serve`` (:func:`start_server`) on ``model`` with the
    same options, each on a free port, logging to ``directory`` (``ours.log``, ``vllm.log``),
    where ``vllm serve``'s IPC sockets and rendezvous file go too (a SIGTERMed ``vllm serve``
    leaves them): ``{"vllm-inline": (port, process), "vllm serve": (port, process)}``. Not
    waited for (:func:`wait_healthy`); stop each with :func:`stop_server`."""
    logs = pathlib.Path(directory)
    ours, theirs = free_port(), free_port()
    return {
        "vllm-inline": (ours, start_ours(model, ours, options, served_name, logs / "ours.log")),
        "vllm serve": (theirs, start_server(
            model, theirs, options, logs / "vllm.log", extra=["--served-model-name", served_name],
            env={"VLLM_RPC_BASE_PATH": directory, "TMPDIR": directory},
        )),
    }  # fmt: skip
