"""``python -m vllm_inline engines``: the host's engines (``keep_alive``; docs/host.md).

- ``engines`` (or ``engines list``): each engine of this user on this host: model, options,
  memory, the processes attached, how long it has been idle and how long it stays.
- ``engines stop MODEL`` / ``engines stop --all``: stop them now (SIGTERM: streams in flight end
  with ``EngineShutdownError`` in the processes attached).
- ``engines start --model M --keep-alive 1h [--vllm-kwargs JSON]``: load one ahead of time.

Imports neither torch nor vLLM: the engines run in their own processes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from typing import Any

from vllm_inline.engine.host import directory as files
from vllm_inline.engine.host.attach import normalized_model, observe, stop_owner

__all__ = ["add_arguments", "run"]


_STOP_WAIT_S = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action")
    sub.add_parser("list", help="the host's engines (the default)")
    stop = sub.add_parser("stop", help="stop an engine now: MODEL, or --all")
    stop.add_argument("model", nargs="?", help="the model (hub id or path) of the engines to stop")
    stop.add_argument("--all", action="store_true", help="stop every engine of this user")
    start = sub.add_parser("start", help="load an engine ahead of time")
    start.add_argument("--model", required=True, help="hub id or local path")
    start.add_argument(
        "--keep-alive",
        required=True,
        help='how long it stays after the last process is gone: "10m", "1h", seconds, -1 (until '
        "stopped)",
    )
    start.add_argument(
        "--vllm-kwargs",
        type=json.loads,
        default={},
        help='engine options as JSON, as the processes will ask for them (e.g. \'{"runner": '
        '"pooling"}\' for an embedder)',
    )


def run(args: argparse.Namespace) -> int:
    if args.action == "stop":
        return stop(args.model, everything=args.all)
    if args.action == "start":
        return start(args.model, args.keep_alive, args.vllm_kwargs)
    return show()


def show() -> int:
    """Print the table of the host's engines; 0."""
    directory = files.host_directory(create=False)
    records = files.read_records(directory) if os.path.isdir(directory) else []
    if not records:
        print(f"No host engines ({directory}).")
        return 0
    rows: list[tuple[str, ...]] = [
        ("MODEL", "OPTIONS", "PID", "MEMORY", "ATTACHED", "IDLE", "STAYS")
    ]
    for record in records:
        rows.append(_row(directory, record))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    return 0


def _row(directory: str, record: files.Record) -> tuple[str, ...]:
    options = json.dumps(record.options, sort_keys=True) if record.options else "-"
    if not record.alive:
        return (record.model, options, str(record.pid), "-", "-", "-", "gone (removed at next use)")
    try:
        status = observe(directory, record)
    except Exception as e:  # noqa: BLE001 - shown in the table, as the engine's state
        return (record.model, options, str(record.pid), "-", "-", "-", f"? ({e})")
    attached = ",".join(str(p) for p in status["attached"]) or "none"
    idle = status["idle_seconds"]
    left = status["seconds_left"]
    if not status["started"]:
        stays = "starting"
    elif left is None:
        stays = "until stopped" if status["keep_alive"] == float("inf") else "while attached"
    else:
        stays = f"{_duration(left)} more"
    return (
        record.model,
        options,
        str(record.pid),
        f"{status['memory_bytes'] / 2**30:.2f} GiB",
        attached,
        "-" if idle is None else _duration(idle),
        f"{stays} (keep_alive {files.show_keep_alive(status['keep_alive'])})",
    )


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def stop(model: str | None, everything: bool = False) -> int:
    """Stop the engines of ``model`` (or all); 0 when one or more stopped, 1 when none ran."""
    if not everything and not model:
        print("engines stop needs MODEL or --all", file=sys.stderr)
        return 2
    directory = files.host_directory(create=False)
    records = files.read_records(directory) if os.path.isdir(directory) else []
    if not everything:
        wanted = {model, normalized_model(str(model))}
        records = [r for r in records if r.model in wanted]
    if not records:
        print(f"No host engine for {model!r}." if model else "No host engines.", file=sys.stderr)
        return 1
    for record in records:  # all at once: each mostly waits for its engine's processes
        if record.alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(record.pid, signal.SIGTERM)
    status = 0
    for record in records:
        if not stop_owner(record.pid, record.start, _STOP_WAIT_S, signal_it=False):
            print(f"{record.model} (pid {record.pid}) did not stop in {_STOP_WAIT_S:g} s")
            status = 1
            continue
        if files.key_of(directory, record.key) == record:  # its owner was killed: its files
            with files.locked(directory, record.key):
                if files.key_of(directory, record.key) == record:
                    files.remove_files(directory, record.key)
        print(f"stopped {record.model} (pid {record.pid})")
    return status


def start(model: str, keep_alive: str, vllm_kwargs: dict[str, Any]) -> int:
    """Start (or find) the host engine of ``model`` with these options, detach, and leave it
    running for ``keep_alive``; 0 once it is up."""
    from vllm_inline.engine import get_engine

    began = time.monotonic()
    engine = get_engine(model, keep_alive=keep_alive, **vllm_kwargs)
    engine.start()
    engine.shutdown()  # detaches: the engine stays for keep_alive
    print(f"{model} is loaded ({time.monotonic() - began:.1f} s); keep_alive {keep_alive}")
    return 0
