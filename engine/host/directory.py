"""The host's engines on disk: one private directory per user, one record per engine.

A host engine (:mod:`.owner`) is found by the record it writes, ``<key>.json``, beside its socket
``<key>.sock``, its log ``<key>.log`` and the lock ``<key>.lock`` that one process at a time
holds while it looks for the engine and starts it. ``key`` names the model and the engine options
(:func:`engine_key`), so the same model and options find the same engine from any process, and
other options another. ``key`` (a file, 0600) is the secret every process of the user proves
itself with when it attaches (:mod:`.wire`).

The directory is ``$VLLMINLINE_HOST_DIR``, else ``<tmp>/vllm-inline-host-<uid>``; mode 0700,
refused when another user owns it or others may enter it: only its user's processes attach.
No TCP port is opened anywhere.

Standard library only: the app side imports this module without torch or vLLM.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from vllm_inline.engine.errors import BadRequestError, ModelLoadError
from vllm_inline.engine.seam.ipc_directory import owner_alive, process_start

__all__ = [
    "DIRECTORY_VARIABLE",
    "KEEP_ALIVE_HELP",
    "KEEP_ALIVE_VARIABLE",
    "Record",
    "engine_key",
    "host_directory",
    "key_of",
    "locked",
    "parse_keep_alive",
    "read_records",
    "remove_files",
    "secret",
    "show_keep_alive",
    "this_process_start",
    "version_mismatch",
]

DIRECTORY_VARIABLE = "VLLMINLINE_HOST_DIR"
"""The host directory, where the default (below) does not suit."""
KEEP_ALIVE_VARIABLE = "VLLMINLINE_KEEP_ALIVE"
"""``keep_alive`` for every engine of a process that sets none (a notebook, a shell)."""
KEEP_ALIVE_HELP = (
    "Load the model once per host: the engine runs in a process of its own that every process "
    "of yours attaches to, and stays loaded this long after the last one is gone ('10m', '1h', "
    "seconds, 0: until the last process is gone, -1: until `python -m vllm_inline engines "
    "stop`; docs/host.md). Default: None ($VLLMINLINE_KEEP_ALIVE, else the engine lives and "
    "dies with this process)."
)
"""What ``keep_alive`` means, for the classes' field descriptions."""

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_keep_alive(value: Any, parameter: str = "keep_alive") -> float | None:
    """Seconds the engine stays loaded after the last process using it is gone, from an Ollama
    style value: a duration (``"10m"``, ``"1h30m"``, ``"45s"``), seconds (``600``, ``"600"``),
    ``0`` (stop with the last process), ``-1`` or any negative (until stopped: ``inf``);
    ``None`` (not set) stays ``None``. Anything else: :class:`BadRequestError` naming
    ``parameter``."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise BadRequestError.invalid(parameter, value, _EXPECTED)
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (text := value.strip().lower()):
        try:
            seconds = float(text)
        except ValueError:
            parts = _DURATION.findall(text)
            if not parts or "".join(n + u for n, u in parts) != text:
                raise BadRequestError.invalid(parameter, value, _EXPECTED) from None
            seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    else:
        raise BadRequestError.invalid(parameter, value, _EXPECTED)
    if math.isnan(seconds):
        raise BadRequestError.invalid(parameter, value, _EXPECTED)
    return float("inf") if seconds < 0 else seconds


_EXPECTED = (
    'a duration such as "10m", "1h" or "90s", seconds (600), 0 (stop with the last process '
    "using it) or -1 (keep it until `python -m vllm_inline engines stop`)"
)


def show_keep_alive(seconds: float) -> str:
    """``seconds`` as :func:`parse_keep_alive` reads it back: ``"10m"``, ``"-1"``, ``"0"``."""
    if seconds == float("inf"):
        return "-1"
    if seconds and seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s" if seconds else "0"


def engine_key(model: str, options: Mapping[str, Any]) -> str:
    """The name of the host engine for ``model`` and these engine options: the same in every
    process that asks for them (a local path made absolute, the options sorted)."""
    text = json.dumps([model, dict(options)], sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def host_directory(create: bool = True) -> str:
    """The user's host directory (see the module docstring); made 0700 when missing. Raises
    :class:`ModelLoadError` when it is not private to this user."""
    # One place for every process of the user, whatever its environment: $XDG_RUNTIME_DIR, set
    # in a login session and not in cron, a container or a service, would split them.
    path = os.environ.get(DIRECTORY_VARIABLE) or os.path.join(
        tempfile.gettempdir(), f"vllm-inline-host-{os.getuid()}"
    )
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return path
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise ModelLoadError(
            f"The host engines' directory {path!r} is not private to this user (it must be a "
            f"directory of uid {os.getuid()} with mode 0700; it has uid {info.st_uid} and mode "
            f"{oct(info.st_mode & 0o777)}). Remove it, or set {DIRECTORY_VARIABLE} to a private "
            "directory."
        )
    return path


def secret(directory: str) -> bytes:
    """The user's key for attaching (32 bytes, mode 0600, made once: written whole under
    another name, then linked into place, so that a process never reads half of it)."""
    path = os.path.join(directory, "key")
    if not os.path.exists(path):
        temporary = os.path.join(directory, f"key.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
        with contextlib.suppress(FileExistsError):
            os.link(temporary, path)  # fails when another process was first: its key wins
        os.unlink(temporary)
    info = os.lstat(path)
    with open(path, "rb") as f:
        key = f.read()
    if len(key) != 32 or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise ModelLoadError(
            f"{path} is not this user's host key (32 bytes, mode 0600): remove it and try again."
        )
    return key


@contextlib.contextmanager
def locked(directory: str, key: str) -> Iterator[None]:
    """Hold ``key``'s lock: one process at a time looks for that engine, starts it or removes
    its files (:func:`remove_files` takes the lock file too, under the lock)."""
    path = os.path.join(directory, f"{key}.lock")
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:  # the file locked must still be the one at the path: it may have been removed
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        yield
    finally:
        os.close(fd)  # releases the lock


@dataclass
class Record:
    """What a host engine writes about itself (``<key>.json``)."""

    key: str
    model: str
    options: dict[str, Any]
    """The engine options the processes asked for (the engine's identity)."""
    pid: int
    """The owner's process id."""
    start: int
    """The owner's start time (clock ticks since boot): a reused pid is not taken for it."""
    versions: dict[str, str]
    """``vllm-inline``, ``vllm`` and ``protocol``: an app of other versions does not attach."""
    keep_alive: float
    """Seconds the engine stays after the last process detached (``inf``: until stopped)."""
    started_at: float = 0.0
    """When the owner started (``time.time()``)."""

    @property
    def alive(self) -> bool:
        """True while the owner runs."""
        return owner_alive(self.pid, self.start)

    def write(self, directory: str) -> None:
        """Write the record (atomically: readers never see half of it)."""
        path = os.path.join(directory, f"{self.key}.json")
        temporary = f"{path}.{os.getpid()}.tmp"
        data = asdict(self)
        data["keep_alive"] = show_keep_alive(self.keep_alive)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(temporary, path)


def key_of(directory: str, key: str) -> Record | None:
    """The record of engine ``key``, or ``None``."""
    try:
        with open(os.path.join(directory, f"{key}.json")) as f:
            data = json.load(f)
    except (FileNotFoundError, ValueError):
        return None
    # Another version's record has other fields: what is needed to find its owner and refuse
    # it by its versions is read, the rest left.
    try:
        return Record(
            key=str(data.get("key", key)),
            model=str(data["model"]),
            options=dict(data.get("options") or {}),
            pid=int(data["pid"]),
            start=int(data["start"]),
            versions=dict(data.get("versions") or {}),
            keep_alive=parse_keep_alive(data.get("keep_alive", "0")) or 0.0,
            started_at=float(data.get("started_at", 0.0)),
        )
    except (KeyError, TypeError, ValueError):
        return None


def read_records(directory: str) -> list[Record]:
    """Every record in ``directory``, oldest first."""
    records = []
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(directory):
            if name.endswith(".json"):
                record = key_of(directory, name[: -len(".json")])
                if record is not None:
                    records.append(record)
    return sorted(records, key=lambda r: r.started_at)


def remove_files(directory: str, key: str, *, lock: bool = True) -> None:
    """Remove engine ``key``'s record, socket, log and (``lock``) lock file, holding the lock
    (:func:`locked`). The lock file goes last, as the last thing under the lock: a process
    that comes after makes a new one, and the holder must be done by then."""
    for suffix in (".json", ".sock", ".log", ".lock") if lock else (".json", ".sock", ".log"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, f"{key}{suffix}"))


def version_mismatch(record: Record, mine: Any) -> ModelLoadError:
    """The error of a process whose versions (``mine``) are not the running engine's."""
    theirs = ", ".join(f"{k} {v}" for k, v in sorted(record.versions.items()))
    ours = ", ".join(f"{k} {v}" for k, v in sorted(dict(mine or {}).items()))
    return ModelLoadError(
        f"The host engine for {record.model!r} (pid {record.pid}) runs {theirs}; this process "
        f"has {ours}. Stop it with `python -m vllm_inline engines stop {record.model}` (the next "
        "process that asks starts one of this version), or leave keep_alive unset here for an "
        "engine of this process's own."
    )


def this_process_start() -> int:
    """This process's start time, as :class:`Record` keeps its owner's."""
    return process_start(os.getpid()) or 0
