"""One engine per model for a group of processes: the workers of an ASGI app.

A web app runs several worker processes; each would start its own engine for every model it
declares, N copies of the weights and of the KV cache. In a group, the engine cores of a model
run once, started by one of the workers for all (below), and each worker's
:class:`~vllm_inline.engine.Engine` is a front end of its own on them, as each API server of
``vllm serve --api-server-count N`` is (:mod:`..seam.vllm_group`): its tokenizer, template,
parsers and output processing in the worker, no hop added.

The group's owner (the launcher) runs an :class:`EngineGroup` and gives its
:meth:`~EngineGroup.environment` to the workers. A worker's engine start
(:func:`.runtime.start_runtime`) then calls :func:`attach`, which asks the owner over a local
socket: the first worker to ask for a model and options decides the options (the platform
defaults, as for one engine) and **starts the engine cores itself**, for every worker; the
owner hands each other worker its client settings, and the others attach with the same options.
A worker's client index (vLLM's ``client_index``) is its worker number, or the order of its
first request when the owner gave none.

**Why a worker, not the launcher, starts the engine cores.** Starting them takes vLLM (its
config, ``launch_core_engines``): a launcher that did so held a copy of torch and vLLM (449 MiB
here) and a fork server (314 MiB) that no request ever used. The worker that starts them has
vLLM loaded for its own front end anyway. The launcher imports neither vLLM nor torch; it only
keeps the socket, the client settings and a pidfd of each engine core, so that an engine core
that dies still stops the group (:mod:`vllm_inline.workers`).

**The starting worker's stop waits for the others.** The engine cores are that worker's
children (they end when it ends: :mod:`..seam.vllm_boot`). When its engine shuts down (its
lifespan, or its interpreter's exit once SIGTERM drained its requests), it first asks the
owner to wait until every other worker that attached to those cores has ended (drained by
the same SIGTERM, or killed by the launcher after the grace), then stops them
(:func:`stop_owned`). An app that shuts such an engine down while the group runs waits the same
way: the other workers still use it. If that worker is killed, its engine cores end with it
and the group stops (one dies, all stop).

Why a socket and not ``multiprocessing`` queues: the workers are not the owner's
``multiprocessing`` children in general (uvicorn imports the app in each), and a worker must
be able to ask at any time, from its engine's thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import select
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from vllm_inline.engine.errors import ModelLoadError
from vllm_inline.engine.life.platform_defaults import PlatformDefaults
from vllm_inline.engine.seam import ipc_directory

__all__ = [
    "ADDRESS_VARIABLE",
    "KEY_VARIABLE",
    "WORKER_VARIABLE",
    "EngineGroup",
    "attach",
    "joined",
    "stop_owned",
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


def _connect() -> Connection:
    address = os.environ[ADDRESS_VARIABLE]
    try:
        return Client(
            "\0" + address[1:] if address.startswith("@") else address,
            authkey=bytes.fromhex(os.environ[KEY_VARIABLE]),
        )
    except OSError as e:
        raise ModelLoadError(
            f"This process is a worker of an engine group ({ADDRESS_VARIABLE}={address}) whose "
            f"owner does not answer ({e}): start the app with its launcher "
            "(python -m vllm_inline run/serve --workers N), or unset the variable."
        ) from e


def attach(
    model: str, requested: Mapping[str, Any], decide: Decide
) -> tuple[PlatformDefaults, dict[str, Any], Any]:
    """The options and vLLM client settings of the group's engine for ``model`` with the
    caller's ``requested`` options, and the engine cores when this worker started them (else
    None: :func:`stop_owned` them when its engine stops). The first caller's ``decide()`` gives
    the options and the environment of the start, and it starts the engine cores (blocking)."""
    key = json.dumps([model, dict(requested)], sort_keys=True, default=repr)
    cores = None
    with _connect() as connection:
        connection.send(("attach", os.getpid(), worker_index(), key))
        reply = connection.recv()
        if reply[0] == "start":
            try:
                defaults, environment = decide()
                from vllm_inline.engine.seam import vllm_group

                logger.info("vllm-inline: starting %s once for %d workers", model, reply[1])
                cores = vllm_group.launch_shared(model, defaults.kwargs, environment, reply[1])
            except BaseException as e:
                connection.send(("failed", f"{type(e).__name__}: {e}"))
                with contextlib.suppress(EOFError, OSError):
                    connection.recv()  # the owner has recorded it: the next caller starts again
                raise
            connection.send(("started", defaults, cores.clients(), cores.pids()))
            reply = connection.recv()
    if reply[0] == "error":
        if cores is not None:
            cores.shutdown()
        raise ModelLoadError(reply[1])
    return reply[1], reply[2], cores


def stop_owned(cores: Any) -> None:
    """Stop engine cores this worker started for its group (``attach``'s third value), once
    every other worker attached to them has ended (see the module docstring)."""
    try:
        with _connect() as connection:
            connection.send(("drain", os.getpid(), cores.pids()))
            connection.recv()  # when the others have ended
    except (ModelLoadError, EOFError, OSError):
        pass  # the owner is gone: so are the other workers (they die with it)
    cores.shutdown()


@dataclass
class _Entry:
    """One model and options of the group: starting, running, or failed."""

    done: threading.Event = field(default_factory=threading.Event)
    defaults: PlatformDefaults | None = None
    clients: list[dict[str, Any]] = field(default_factory=list)
    """Each front end's client settings, by client index."""
    pids: list[int] = field(default_factory=list)
    """The engine cores' pids."""
    sentinels: list[int] = field(default_factory=list)
    """A pidfd of each engine core: readable once it has ended."""
    users: set[int] = field(default_factory=set)
    """The pids of the workers attached."""
    error: str | None = None


class EngineGroup:
    """The owner's side: answers the workers' :func:`attach` (the first worker to ask for an
    engine starts its cores for ``workers`` front ends) and watches the engine cores. Use it as
    a context manager, or :meth:`start` and :meth:`shutdown`. Imports neither vLLM nor torch."""

    def __init__(self, workers: int) -> None:
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ValueError(
                f"workers must be a whole number of processes, 1 or more; got {workers!r}."
            )
        self.workers = workers
        """How many front ends each engine serves (client indexes ``0..workers-1``)."""
        self._key = secrets.token_bytes(32)
        # Linux's abstract socket namespace: no file to leave behind when the owner is killed
        # (the key keeps other processes out).
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

    def engine_pids(self) -> list[int]:
        """The pids of the engine cores started so far (one or more per model and options)."""
        with self._lock:
            return [pid for e in self._entries.values() for pid in e.pids]

    def sentinels(self) -> list[int]:
        """The started engine cores' sentinels (pidfds): ready when one ends."""
        with self._lock:
            return [fd for e in self._entries.values() for fd in e.sentinels]

    def shutdown(self, grace: float = 30.0) -> None:
        """Stop listening, and wait up to ``grace`` s for the engine cores to end (call once
        the workers are gone: the cores end with the worker that started them), then kill what
        is left of them."""
        with self._lock:
            self._closing = True
            entries = list(self._entries.values())
        if self._listener is not None:
            self._listener.close()
        deadline = time.monotonic() + grace
        for entry in entries:
            entry.done.wait(timeout=max(0.0, deadline - time.monotonic()))
            for fd in entry.sentinels:
                if not _ended(fd, deadline - time.monotonic()):
                    with contextlib.suppress(OSError):
                        signal.pidfd_send_signal(fd, signal.SIGKILL)
                with contextlib.suppress(OSError):
                    os.close(fd)
            entry.sentinels = []

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
                message = connection.recv()
                if message[0] == "drain":
                    self._drain(message[1], message[2])
                    connection.send(("drained",))
                    return
                _, pid, worker, key = message
                index = self._index(pid, worker)
                entry, starter = self._entry(key)
                if starter:
                    connection.send(("start", self.workers))
                    self._started(entry, connection.recv())
                entry.done.wait()
                if entry.error is not None:
                    connection.send(("error", entry.error))
                else:
                    with self._lock:
                        entry.users.add(pid)
                    connection.send(("ready", entry.defaults, entry.clients[index]))
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

    def _started(self, entry: _Entry, message: tuple[Any, ...]) -> None:
        """The starting worker's answer: its engine cores are up, or they failed."""
        try:
            if message[0] != "started":
                raise ModelLoadError(f"The worker starting the engine failed: {message[1]}")
            _, entry.defaults, entry.clients, entry.pids = message
            for pid in entry.pids:
                try:
                    entry.sentinels.append(os.pidfd_open(pid))
                except OSError:  # already gone: a sentinel that is ready at once
                    read, write = os.pipe()
                    os.close(write)
                    entry.sentinels.append(read)
        except BaseException as e:  # noqa: BLE001 - every waiting worker gets the error
            entry.error = str(e) if isinstance(e, ModelLoadError) else f"{type(e).__name__}: {e}"
            logger.error("vllm-inline: the group's engine did not start: %s", entry.error)
        finally:
            entry.done.set()

    def _drain(self, owner: int, pids: list[int]) -> None:
        """Return once every worker attached to the engine cores ``pids`` but ``owner`` (which
        started them) has ended; no engine starts in the group from now on."""
        with self._lock:
            self._closing = True
            users = {u for e in self._entries.values() if set(e.pids) & set(pids) for u in e.users}
        users.discard(owner)
        while any(ipc_directory.owner_alive(pid, 0) for pid in users):
            time.sleep(0.1)


def _ended(fd: int, timeout: float) -> bool:
    """Wait up to ``timeout`` s for the pidfd ``fd`` to become readable (its process ended)."""
    readable, _, _ = select.select([fd], [], [], max(0.0, timeout))
    return bool(readable)
