"""One engine per model for a group of processes: the workers of an ASGI app.

A web app runs several worker processes; each would start its own engine for every model it
declares, N copies of the weights and of the KV cache. In a group, the engine cores of a model
run once, in processes the group's owner (the launcher, :mod:`vllm_inline.workers`) starts, and
each worker's :class:`~vllm_inline.engine.Engine` is a front end of its own on them, as each API
server of ``vllm serve --api-server-count N`` is (:mod:`..seam.vllm_group`): its tokenizer,
template, parsers and output processing in the worker, no hop added.

The owner runs an :class:`EngineGroup` and gives its :meth:`~EngineGroup.environment` to the
workers. A worker's engine start (:func:`.runtime.start_runtime`) then calls :func:`attach`,
which asks the owner over a local socket: the first worker to ask for a model and options
decides the options (the platform defaults, as for one engine) and the owner starts the engine
cores with them for every worker; the others wait for that start and attach with the same
options. A worker's client index (vLLM's ``client_index``) is its worker number, or the order of
its first request when the owner gave none.

Why a socket and not ``multiprocessing`` queues: the workers are not the owner's
``multiprocessing`` children in general (uvicorn imports the app in each), and a worker must
be able to ask at any time, from its engine's thread.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from vllm_inline.engine.errors import ModelLoadError
from vllm_inline.engine.life.platform_defaults import PlatformDefaults

__all__ = [
    "ADDRESS_VARIABLE",
    "KEY_VARIABLE",
    "WORKER_VARIABLE",
    "EngineGroup",
    "attach",
    "joined",
    "worker_index",
]

logger = logging.getLogger("vllm_inline")

ADDRESS_VARIABLE = "VLLMINLINE_GROUP"
"""The group owner's socket; set in a worker of a group."""
KEY_VARIABLE = "VLLMINLINE_GROUP_KEY"
"""The key a worker proves itself with (hex)."""
WORKER_VARIABLE = "VLLMINLINE_WORKER"
"""The worker's number, ``0..N-1``, when its launcher numbers them."""


def joined() -> bool:
    """True in a worker of an :class:`EngineGroup`: its engines attach to the group's."""
    return bool(os.environ.get(ADDRESS_VARIABLE))


def worker_index() -> int | None:
    """This worker's number in its group, when its launcher gave one."""
    value = os.environ.get(WORKER_VARIABLE)
    return int(value) if value else None


Decide = Callable[[], tuple[PlatformDefaults, dict[str, str]]]


def attach(
    model: str, requested: Mapping[str, Any], decide: Decide
) -> tuple[PlatformDefaults, dict[str, Any]]:
    """The options and vLLM client settings of the group's engine for ``model`` with the
    caller's ``requested`` options; the first caller's ``decide()`` gives the options (and the
    environment of the start) and the owner starts the engine cores with them (blocking)."""
    key = json.dumps([model, dict(requested)], sort_keys=True, default=repr)
    address = os.environ[ADDRESS_VARIABLE]
    try:
        connection = Client(
            "\0" + address[1:] if address.startswith("@") else address,
            authkey=bytes.fromhex(os.environ[KEY_VARIABLE]),
        )
    except OSError as e:
        raise ModelLoadError(
            f"This process is a worker of an engine group ({ADDRESS_VARIABLE}={address}) whose "
            f"owner does not answer ({e}): start the app with its launcher "
            "(python -m vllm_inline run/serve --workers N), or unset the variable."
        ) from e
    with connection:
        connection.send(("attach", os.getpid(), worker_index(), key))
        reply = connection.recv()
        if reply[0] == "start":
            try:
                defaults, environment = decide()
            except BaseException as e:
                connection.send(("failed", f"{type(e).__name__}: {e}"))
                raise
            connection.send(("start", model, defaults, environment))
            reply = connection.recv()
    if reply[0] == "error":
        raise ModelLoadError(reply[1])
    return reply[1], reply[2]


@dataclass
class _Entry:
    """One model and options of the group: starting, running, or failed."""

    done: threading.Event = field(default_factory=threading.Event)
    defaults: PlatformDefaults | None = None
    cores: Any = None  # seam.vllm_group.SharedCores once started
    error: str | None = None


class EngineGroup:
    """The owner's side: starts each model's engine cores once for ``workers`` front ends and
    answers the workers' :func:`attach`. Use it as a context manager, or :meth:`start` and
    :meth:`shutdown`."""

    def __init__(self, workers: int) -> None:
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ValueError(
                f"workers must be a whole number of processes, 1 or more; got {workers!r}."
            )
        self.workers = workers
        """How many front ends each engine serves (client indexes ``0..workers-1``)."""
        self._key = secrets.token_bytes(32)
        # Linux's abstract socket namespace: no file to leave behind when the owner is killed.
        self._address = f"\0vllm-inline-group-{secrets.token_hex(8)}"
        self._listener: Listener | None = None
        self._entries: dict[str, _Entry] = {}
        self._indexes: dict[int, int] = {}  # worker pid -> client index
        self._lock = threading.Lock()
        self._closing = False

    def __enter__(self) -> EngineGroup:  # noqa: PYI034 - Self needs Python 3.11
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def start(self) -> dict[str, str]:
        """Listen for workers; returns :meth:`environment`."""
        self._listener = Listener(self._address, family="AF_UNIX", authkey=self._key)
        threading.Thread(target=self._accept, name="vllm-inline:group", daemon=True).start()
        return self.environment()

    def environment(self, worker: int | None = None) -> dict[str, str]:
        """The variables that make a process a worker of this group (number ``worker``)."""
        assert self._listener is not None, "call start() first"
        # "@" for the leading NUL, which an environment variable cannot hold.
        environment = {ADDRESS_VARIABLE: "@" + self._address[1:], KEY_VARIABLE: self._key.hex()}
        if worker is not None:
            environment[WORKER_VARIABLE] = str(worker)
        return environment

    def engines(self) -> list[Any]:
        """The engine cores started so far (``SharedCores``, one per model and options)."""
        with self._lock:
            return [e.cores for e in self._entries.values() if e.cores is not None]

    def sentinels(self) -> list[int]:
        """The started engine cores' process sentinels: ready when one ends."""
        return [s for cores in self.engines() for s in cores.sentinels()]

    def shutdown(self) -> None:
        """Stop every engine the group started, and stop listening (call once the workers are
        gone: their engines see the engine cores go)."""
        with self._lock:
            self._closing = True
            entries = list(self._entries.values())
        if self._listener is not None:
            self._listener.close()
        for entry in entries:
            entry.done.wait(timeout=600)  # a start in flight ends before its cores stop
            if entry.cores is not None:
                entry.cores.shutdown()
        from vllm_inline.engine.seam import vllm_processes

        vllm_processes.stop_when_idle()

    def _accept(self) -> None:
        listener = self._listener
        assert listener is not None
        while True:
            try:
                connection = listener.accept()
            except OSError:
                return  # closed
            except Exception as e:  # noqa: BLE001 - a peer without the key: not ours, keep going
                logger.warning("vllm-inline: engine group refused a connection: %s", e)
                continue
            threading.Thread(
                target=self._serve, args=(connection,), name="vllm-inline:group-client", daemon=True
            ).start()

    def _serve(self, connection: Connection) -> None:
        with connection:
            try:
                _, pid, worker, key = connection.recv()
                index = self._index(pid, worker)
                entry, starter = self._entry(key)
                if starter:
                    connection.send(("start",))
                    self._start(entry, connection.recv())
                entry.done.wait()
                if entry.error is not None:
                    connection.send(("error", entry.error))
                else:
                    connection.send(("ready", entry.defaults, entry.cores.client(index)))
            except (EOFError, OSError):
                return
            except ValueError as e:
                connection.send(("error", str(e)))

    def _index(self, pid: int, worker: int | None) -> int:
        with self._lock:
            if pid in self._indexes:
                return self._indexes[pid]
            taken = set(self._indexes.values())
            if worker is None:
                worker = next((i for i in range(self.workers) if i not in taken), self.workers)
            if not 0 <= worker < self.workers or worker in taken:
                raise ValueError(
                    f"Engine group of {self.workers} worker(s): no client index left for process "
                    f"{pid} (worker {worker}); each engine serves that many processes, start the "
                    "group with more workers."
                )
            self._indexes[pid] = worker
            return worker

    def _entry(self, key: str) -> tuple[_Entry, bool]:
        with self._lock:
            if self._closing:
                raise ValueError("The engine group is shutting down: no engine starts now.")
            entry = self._entries.get(key)
            if entry is not None and not (entry.done.is_set() and entry.error is not None):
                return entry, False
            entry = self._entries[key] = _Entry()  # new, or again after a failed start
            return entry, True

    def _start(self, entry: _Entry, message: tuple[Any, ...]) -> None:
        try:
            if message[0] != "start":
                raise ModelLoadError(f"The worker deciding the options failed: {message[1]}")
            _, model, defaults, environment = message
            from vllm_inline.engine.seam import vllm_group, vllm_processes, vllm_quiet

            vllm_processes.warm_up()
            vllm_quiet.install_filters()
            logger.info("vllm-inline: starting %s once for %d workers", model, self.workers)
            entry.cores = vllm_group.launch_shared(
                model, defaults.kwargs, environment, self.workers
            )
            entry.defaults = defaults
        except BaseException as e:  # noqa: BLE001 - every waiting worker gets the error
            entry.error = str(e) if isinstance(e, ModelLoadError) else f"{type(e).__name__}: {e}"
            logger.error("vllm-inline: the group's engine did not start: %s", entry.error)
        finally:
            entry.done.set()
