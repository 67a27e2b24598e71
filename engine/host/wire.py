"""What an attached process and its host engine say to each other over the engine's Unix socket.

Frames are a 4-byte length and a body. The greeting is JSON: the engine's challenge, the
process's answer (an HMAC of it with the user's key), its versions. After it, pickles: requests
as ``(op, id, payload)`` from the process, answers as ``(kind, id, payload)`` from the engine
(``"delta"`` with a :class:`~vllm_inline.engine.stream.deltas.Delta`, ``"result"``,
``"error"``, ``"end"``). Pickle, because what crosses is the engine's own API (deltas, options,
image bytes, typed errors) between the same user's processes of the same vllm-inline version,
and only once the process has proven it holds the key: the socket lives in a 0700 directory and
the engine checks the peer's uid (``SO_PEERCRED``) first. Why not HTTP: no port, no JSON of
every token, the engine's typed errors kept (docs/host.md).

Standard library only.
"""

from __future__ import annotations

import asyncio
import builtins
import hashlib
import hmac
import json
import pickle
import socket
import struct
from typing import Any

from vllm_inline.engine import errors

__all__ = [
    "MAX_GREETING",
    "PROTOCOL",
    "exception_from_wire",
    "exception_to_wire",
    "frame",
    "frame_json",
    "peer",
    "proof",
    "read_frame",
    "read_frame_blocking",
    "read_json",
    "read_json_blocking",
]

PROTOCOL = "1"
"""The protocol's version: an engine and a process of other versions do not talk."""

_LENGTH = struct.Struct("!I")
MAX_GREETING = 64 * 1024
"""The largest greeting an engine reads before the process has proven itself."""


def frame(message: Any) -> bytes:
    """``message`` as one frame."""
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(body)) + body


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The next frame's message (``IncompleteReadError`` at the end of the stream)."""
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    return pickle.loads(await reader.readexactly(length))


def frame_json(message: Any) -> bytes:
    """``message`` as one JSON frame: the greeting, read before the peer has proven itself,
    is never unpickled."""
    body = json.dumps(message).encode()
    return _LENGTH.pack(len(body)) + body


async def read_json(reader: asyncio.StreamReader, limit: int = MAX_GREETING) -> Any:
    """The next JSON frame (``ValueError`` past ``limit`` bytes or when it is no JSON)."""
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if length > limit:
        raise ValueError(f"a greeting of {length} bytes")
    return json.loads(await reader.readexactly(length))


def read_json_blocking(sock: socket.socket, limit: int = MAX_GREETING) -> Any:
    """:func:`read_json` from a blocking socket."""
    (length,) = _LENGTH.unpack(_read_exactly(sock, _LENGTH.size))
    if length > limit:
        raise ValueError(f"a greeting of {length} bytes")
    return json.loads(_read_exactly(sock, length))


def read_frame_blocking(sock: socket.socket) -> Any:
    """The next frame's message from a blocking socket (``EOFError`` at its end)."""
    (length,) = _LENGTH.unpack(_read_exactly(sock, _LENGTH.size))
    return pickle.loads(_read_exactly(sock, length))


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise EOFError("the host engine closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def proof(key: bytes, challenge: bytes) -> bytes:
    """What a process answers the engine's ``challenge`` with: it holds ``key``."""
    return hmac.new(key, challenge, hashlib.sha256).digest()


def peer(sock: socket.socket) -> tuple[int, int] | None:
    """The process id and user id of the process at the other end of a Unix socket, as the
    kernel has them (Linux ``SO_PEERCRED``), else ``None``."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    credentials = sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", credentials)
    return int(pid), int(uid)


def exception_to_wire(e: BaseException) -> tuple[str, str, tuple[Any, ...], dict[str, Any]]:
    """``e`` as data: its class (by module and name), ``args`` and attributes (``parameter``,
    ``value``, ...); what cannot be pickled becomes its ``repr``."""
    state = {}
    for name, value in vars(e).items():
        try:
            pickle.dumps(value)
        except Exception:  # noqa: BLE001 - any value: sent as its repr
            value = repr(value)
        state[name] = value
    args = tuple(a if isinstance(a, (str, int, float, type(None))) else repr(a) for a in e.args)
    return type(e).__module__, type(e).__qualname__, args, state


def exception_from_wire(data: tuple[str, str, tuple[Any, ...], dict[str, Any]]) -> BaseException:
    """The exception :func:`exception_to_wire` sent: the same class when it is one of
    vllm-inline's errors or a built-in one, else :class:`~.errors.GenerationFailedError` saying
    what it was."""
    module, name, args, state = data
    home = {errors.__name__: errors, "builtins": builtins}.get(module)
    cls = getattr(home, name, None) if home is not None else None
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        text = args[0] if args else ""
        return errors.GenerationFailedError(f"The host engine failed: {module}.{name}: {text}")
    e = cls.__new__(cls)
    e.args = args
    e.__dict__.update(state)
    return e
