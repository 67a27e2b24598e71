"""An ASGI app in N worker processes on one engine per model: ``--workers N`` without N copies.

    python -m vllm_inline run --workers 2 myapp:app            # your app, as uvicorn runs it
    python -m vllm_inline serve --workers 2 --model M          # the OpenAI-compatible server

The launcher (this module, the parent of everything) listens on the port, starts an
:class:`~vllm_inline.engine.life.group.EngineGroup` and N uvicorn workers sharing the socket, as
``uvicorn --workers`` and ``vllm serve --api-server-count`` share theirs. The app's code does not
change: when a worker's engine starts (``ChatVLLM(...)``, ``get_engine(...)``, in the lifespan or
at the first request), the first worker to ask starts that model's engine cores once, for all,
and every worker's engine is a front end of its own on them (vLLM's multi-API-server mode,
:mod:`vllm_inline.engine.seam.vllm_group`). The launcher imports neither vLLM nor torch and
runs no fork server: its own memory is the standard library's, uvicorn's and the socket's
(:mod:`vllm_inline.engine.life.group` says why the cores are a worker's).

**One dies, all stop.** A worker that exits (killed, crashed, out of memory), or an engine core
that dies, stops the whole group and the launcher exits with status 1, as ``vllm serve`` does
with its API servers: let the supervisor (systemd, Kubernetes, Docker) restart it. A worker is
not restarted alone because vLLM's engine core cannot take a new front end in its place: it
sends its ready message once per client index, does not notice a front end going away (the
dead worker's requests would run on, holding KV cache), and a utility reply meant for the dead
front end reaches the new one (``vllm/v1/engine/core.py``, ``core_client.py``). Stopping the
group ends the dead worker's requests with the engine cores.

SIGTERM or SIGINT: the workers drain (uvicorn's graceful shutdown, ``--graceful-timeout``), and
the worker that started a model's engine cores stops them once the others have ended; status 0.
SIGKILL: the workers are killed with the launcher (Linux's parent-death signal) and the engine
cores end on their own (they watch the worker that started them).
There is no worker health check: a worker whose engine is still loading is not killed for it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from multiprocessing.connection import wait
from typing import Any

from vllm_inline.engine.life.group import EngineGroup, worker_index
from vllm_inline.engine.life.metrics import MULTIPROCESS_VARIABLE

__all__ = ["WORKER_HEADER", "run", "worker_main"]

logger = logging.getLogger("vllm_inline")

WORKER_HEADER = "x-vllm-inline-worker"
"""The response header that says which worker answered (its number)."""

_PR_SET_PDEATHSIG = 1
_SETTINGS_VARIABLE = "VLLMINLINE_WORKER_SETTINGS"


def run(
    app: str,
    *,
    workers: int,
    host: str = "127.0.0.1",
    port: int = 8000,
    factory: bool = False,
    graceful_timeout: float = 30.0,
    environment: Mapping[str, str] | None = None,
    log_level: str = "info",
    uvicorn_options: Mapping[str, Any] | None = None,
) -> int:
    """Serve the ASGI app ``app`` (``"module:attribute"``; a callable returning the app with
    ``factory=True``) from ``workers`` processes on one engine per model, until SIGTERM or
    SIGINT (status 0) or until a worker or an engine core dies (status 1).
    ``environment``: more variables for the workers; ``uvicorn_options``: more of
    ``uvicorn.Config``'s arguments for each worker (TLS files, ``root_path``, ...)."""
    group = EngineGroup(workers)  # checks workers
    from vllm_inline.engine.seam import vllm_quiet  # the standard library only

    # vLLM's quiet levels for every process of the group, as one process's engine gets them
    # (the workers' front ends and this process build vLLM's config outside an engine start).
    os.environ.update(vllm_quiet.quiet_environment())
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(message)s")
    try:
        import uvicorn
    except ImportError as e:
        raise RuntimeError(
            f"--workers needs uvicorn: pip install 'vllm-inline[server]' ({e})"
        ) from e
    config = uvicorn.Config(app, host=host, port=port, factory=factory)
    sock = config.bind_socket()  # before anything starts: a port in use fails here
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    group.start()
    # prometheus_client's multiprocess mode, as vllm serve sets it for its API servers: each
    # worker's /metrics reads every worker's values (engine.life.metrics).
    metrics_dir = _metrics_directory()
    processes: list[_Worker] = []
    status = 1
    try:
        for index in range(workers):
            settings = {
                "app": app,
                "factory": factory,
                "graceful_timeout": graceful_timeout,
                "log_level": log_level,
                "uvicorn": dict(uvicorn_options or {}),
                "path": sys.path,
                "socket": sock.fileno(),
                "parent": os.getpid(),
            }
            variables = {
                **os.environ,
                MULTIPROCESS_VARIABLE: metrics_dir,
                **(environment or {}),
                **group.environment(index),
                _SETTINGS_VARIABLE: json.dumps(settings),
            }
            processes.append(_Worker(index, sock, variables))
        logger.info(
            "vllm-inline: %d workers on http://%s:%d (pids %s)",
            workers,
            host,
            port,
            [p.pid for p in processes],
        )
        status = _supervise(processes, group, stop)
    finally:
        _stop_workers(processes, graceful_timeout)
        group.shutdown(grace=vllm_quiet.shutdown_timeout())
        sock.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
        for number, handler in previous.items():
            signal.signal(number, handler)
    return status


def _metrics_directory() -> str:
    """A new directory for the workers' metric files, named after this launcher (pid and start
    time); those of launchers that were killed, and the engines' files of dead owners, are
    removed first (:func:`~vllm_inline.engine.seam.ipc_directory.sweep`)."""
    from vllm_inline.engine.seam import ipc_directory  # the standard library only

    ipc_directory.sweep()
    start = ipc_directory.process_start(os.getpid()) or 0
    return tempfile.mkdtemp(prefix=f"{ipc_directory.METRICS_PREFIX}{os.getpid()}-{start}-")


class _Worker:
    """One worker: a new interpreter (not a ``multiprocessing`` child, which would skip the
    app's ``atexit`` handlers) running :func:`worker_main` on the launcher's socket."""

    def __init__(self, index: int, sock: socket.socket, environment: dict[str, str]) -> None:
        self.name = f"worker {index}"
        command = [
            sys.executable,
            "-c",
            "from vllm_inline.workers import worker_main; worker_main()",
        ]
        self.process = subprocess.Popen(command, env=environment, pass_fds=[sock.fileno()])
        self.pid = self.process.pid
        self.sentinel = os.pidfd_open(self.pid)  # readable once the process has ended

    @property
    def exitcode(self) -> int | None:
        return self.process.poll()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()

    def join(self, timeout: float) -> bool:
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        os.close(self.sentinel)


def _supervise(processes: list[_Worker], group: EngineGroup, stop: threading.Event) -> int:
    """Wait until a signal (0) or until a worker or an engine core ends (1)."""
    while not stop.is_set():
        engines = group.sentinels()
        ended = wait([p.sentinel for p in processes] + engines, timeout=0.5)
        if stop.is_set():
            break
        for process in processes:
            if process.sentinel in ended:
                logger.error(
                    "vllm-inline: %s (pid %s) exited with status %s: stopping the group "
                    "(one worker cannot be replaced on engine cores shared by all; see "
                    "vllm_inline.workers)",
                    process.name,
                    process.pid,
                    process.exitcode,
                )
                return 1
        if any(s in ended for s in engines):
            logger.error("vllm-inline: an engine core of the group died: stopping the group")
            return 1
    return 0


def _stop_workers(processes: list[_Worker], grace: float) -> None:
    """SIGTERM (uvicorn drains, the lifespan stops the engines' front ends), then SIGKILL."""
    for process in processes:
        process.stop()
    for process in processes:
        if not process.join(timeout=grace + 10):
            logger.warning("vllm-inline: %s did not stop in time: killed", process.name)
        process.kill()


def worker_main() -> None:
    """A worker process: the app under uvicorn on the launcher's socket."""
    settings = json.loads(os.environ.pop(_SETTINGS_VARIABLE))
    _die_with_parent(settings["parent"])
    sys.path[:] = settings["path"]
    import uvicorn

    config = uvicorn.Config(
        settings["app"],
        factory=settings["factory"],
        lifespan="on",
        **{"log_level": settings["log_level"], **settings.get("uvicorn", {})},
        timeout_graceful_shutdown=settings["graceful_timeout"],
    )
    config.load()
    config.loaded_app = _WorkerHeader(config.loaded_app, worker_index())
    server = uvicorn.Server(config)
    sock = socket.socket(fileno=settings["socket"])
    # uvicorn re-raises the stop signal once it has shut down, which would end this process
    # before its atexit handlers: with these handlers the re-raised signal returns, and the
    # interpreter exits normally.
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: None)
    server.run(sockets=[sock])
    if not server.started:  # the lifespan failed (an engine that cannot start): said above
        sys.exit(3)


def _die_with_parent(launcher: int) -> None:
    """Have Linux kill this process when the launcher dies, however it dies (SIGKILL too)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != launcher:  # the launcher died before the line above
        os._exit(1)


class _WorkerHeader:
    """ASGI middleware: says which worker answered, in the :data:`WORKER_HEADER` header."""

    def __init__(self, app: Any, index: int | None) -> None:
        self.app = app
        self.value = str(index).encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_header(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                headers.append((WORKER_HEADER.encode(), self.value))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_header)
