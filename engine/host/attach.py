"""Find the host engine for a model and options, start it if there is none, and attach.

:func:`attach` runs in the app (standard library only: no torch, no vLLM here). Under the
engine's lock (:func:`.directory.locked`) it reads the engine's record: an owner that no longer
runs (killed) leaves its files, which are removed here, and a new owner starts; an owner of
other versions is an error naming both. A new owner is launched as ``python -m
vllm_inline.engine.host.owner`` (it leads a process group of its own and forks once more: no
child of this process), with this process's environment less what would make it attach or join
a group itself. Then, outside the lock, the greeting: the engine's challenge answered with the user's
key, and its answer once it is up (or its start's error, raised here as it was raised there).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

from vllm_inline.engine.errors import (
    BadRequestError,
    EngineDeadError,
    EngineUnavailableError,
    ModelLoadError,
)
from vllm_inline.engine.host import directory as files
from vllm_inline.engine.host import wire
from vllm_inline.engine.host.status import versions
from vllm_inline.engine.seam.ipc_directory import owner_alive

__all__ = ["attach", "normalized_model", "observe", "stop_owner"]

_LAUNCH_WAIT_S = 60.0
"""How long a launched owner may take to listen (it imports the package, not vLLM)."""
_GREETING_S = 30.0
"""How long the greeting may take (the engine's start is waited for apart)."""
_NOT_INHERITED = (
    files.KEEP_ALIVE_VARIABLE,  # the owner's engine is an engine of its own
    "VLLMINLINE_GROUP",  # group.ADDRESS_VARIABLE: a worker's group is not the owner's
    "VLLMINLINE_GROUP_KEY",
    "VLLMINLINE_WORKER",
)


def normalized_model(model: str) -> str:
    """``model`` as every process names it: an existing local path made absolute."""
    path = os.path.expanduser(model)
    return os.path.abspath(path) if os.path.exists(path) else model


def attach(
    model: str, options: Mapping[str, Any], keep_alive: float
) -> tuple[socket.socket, dict[str, Any]]:
    """A connected socket to the host engine for ``model`` and ``options``, started if needed,
    and what it decided at its start (:func:`.status.engine_info`). Blocks while the engine
    starts; raises the start's error."""
    directory = files.host_directory()
    key = files.engine_key(model, options)
    secret = files.secret(directory)
    mine = versions()
    for attempt in (1, 2, 3):
        with files.locked(directory, key):
            record = files.key_of(directory, key)
            if record is not None and not record.alive:  # killed: its files stayed
                files.remove_files(directory, key, lock=False)
                record = None
            if record is not None and record.versions != mine:
                raise files.version_mismatch(record, mine)
            if record is None:
                record = _launch(directory, key, model, options, keep_alive)
        try:
            return _greet(directory, record, secret, mine, keep_alive)
        except (OSError, EOFError, ValueError) as e:  # refused, gone, cut: it is stopping
            if attempt == 3:
                raise EngineUnavailableError(
                    f"The host engine for {model!r} (pid {record.pid}) did not answer: {e!r}. "
                    f"Its log: {os.path.join(directory, f'{key}.log')}"
                ) from e
            stop_owner(record.pid, record.start, signal_it=False)  # wait until it is gone
    raise AssertionError("unreachable")


def _launch(
    directory: str, key: str, model: str, options: Mapping[str, Any], keep_alive: float
) -> files.Record:
    spec = {
        "directory": directory,
        "key": key,
        "model": model,
        "options": dict(options),
        "keep_alive": keep_alive,
    }
    try:
        text = json.dumps(spec)
    except TypeError as e:
        raise BadRequestError(
            f"vllm_kwargs={dict(options)!r} cannot go to a host engine: its values must be "
            f"JSON (strings, numbers, lists, dicts) ({e}). Leave keep_alive unset to pass "
            "objects to an engine of this process.",
            parameter="vllm_kwargs",
            value=dict(options),
        ) from e
    environment = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
    log_path = os.path.join(directory, f"{key}.log")
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as log:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "vllm_inline.engine.host.owner"],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=log,
            env=environment,
        )
        launcher.communicate(text.encode())  # it forks the owner and exits at once
    deadline = time.monotonic() + _LAUNCH_WAIT_S
    while launcher.returncode == 0 and time.monotonic() < deadline:
        record = files.key_of(directory, key)
        if record is not None and record.alive:
            return record
        time.sleep(0.02)
    raise ModelLoadError(
        f"The host engine for {model!r} did not start listening (launcher status "
        f"{launcher.returncode}). Its log ({log_path}): {_tail(log_path)}"
    )


def _greet(
    directory: str,
    record: files.Record,
    secret: bytes,
    mine: dict[str, str],
    keep_alive: float,
) -> tuple[socket.socket, dict[str, Any]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(_GREETING_S)
        sock.connect(os.path.join(directory, f"{record.key}.sock"))
        challenge = bytes.fromhex(wire.read_json_blocking(sock)["challenge"])
        hello = {
            "pid": os.getpid(),
            "versions": mine,
            "keep_alive": keep_alive if keep_alive != float("inf") else -1,
            "proof": wire.proof(secret, challenge).hex(),
        }
        sock.sendall(wire.frame_json(hello))
        sock.settimeout(None)
        # The engine may take minutes to start: its owner is watched meanwhile.
        while not select.select([sock], [], [], 1.0)[0]:
            if not record.alive:
                log = os.path.join(directory, f"{record.key}.log")
                raise EngineDeadError(
                    f"The host engine for {record.model!r} (pid {record.pid}) ended while it "
                    f"started. Its log ({log}): {_tail(log)}"
                )
        kind, _, payload = wire.read_frame_blocking(sock)
    except BaseException:
        sock.close()
        raise
    if kind == "error":
        sock.close()
        raise wire.exception_from_wire(payload)
    return sock, dict(payload)


def _tail(path: str, size: int = 2000) -> str:
    with contextlib.suppress(OSError), open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - size))
        return f.read().decode(errors="replace").strip() or "(empty)"
    return "(none)"


def observe(directory: str, record: files.Record) -> dict[str, Any]:
    """What the running engine of ``record`` says of itself, without attaching to it (its idle
    time runs on): :meth:`.owner.Owner.status`."""
    secret = files.secret(directory)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(_GREETING_S)
        sock.connect(os.path.join(directory, f"{record.key}.sock"))
        challenge = bytes.fromhex(wire.read_json_blocking(sock)["challenge"])
        hello = {"observe": True, "pid": os.getpid(), "versions": versions()}
        hello["proof"] = wire.proof(secret, challenge).hex()
        sock.sendall(wire.frame_json(hello))
        kind, _, payload = wire.read_frame_blocking(sock)
    if kind == "error":
        raise wire.exception_from_wire(payload)
    return dict(payload)


def stop_owner(pid: int, start: int, timeout: float = 60.0, *, signal_it: bool = True) -> bool:
    """Stop the host engine whose owner is ``pid`` started at ``start`` (SIGTERM: it ends its
    attached processes' streams, stops the engine and removes its files) and wait until it is
    gone (``signal_it=False``: only wait); ``False`` if it still runs after ``timeout``."""
    if signal_it and owner_alive(pid, start):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while owner_alive(pid, start):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
