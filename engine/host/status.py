"""What a host engine tells the processes that attach (:func:`engine_info`) and what
``python -m vllm_inline engines`` shows of it: versions, memory.

Standard library and the package's own light modules: the app side imports it without vLLM.
"""

from __future__ import annotations

import os
from typing import Any

from vllm_inline.engine.host.wire import PROTOCOL
from vllm_inline.engine.seam.versions import installed_vllm

__all__ = ["engine_info", "tree", "tree_memory", "versions"]


def versions() -> dict[str, str]:
    """This process's vllm-inline, vLLM (the distribution's version, read from its metadata,
    not imported) and protocol versions: an engine serves processes of the same ones only."""
    from vllm_inline import __version__

    found = installed_vllm()
    return {
        "vllm-inline": __version__,
        "vllm": f"{found[0]} {found[1]}" if found else "none",
        "protocol": PROTOCOL,
    }


def engine_info(engine: Any, record: Any) -> dict[str, Any]:
    """What an attached process keeps of the started ``engine`` (an
    :class:`~vllm_inline.engine.Engine`): what the engine decided at start, read once."""
    runtime = engine.runtime
    return {
        "max_model_len": engine.max_model_len,
        "stop_policy": engine.stop_policy,
        "model_defaults": dict(runtime.model_defaults),
        "platform_defaults": engine.platform_defaults,
        "accepts_images": engine.accepts_images,
        "template_source": runtime.template.source,
        "pid": record.pid,
        "start": record.start,
    }


def tree(pid: int) -> list[int]:
    """``pid`` and every process below it (Linux ``/proc``; ``[pid]`` elsewhere)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return [pid]
    for entry in entries:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, ()))
    return found


def tree_memory(pid: int) -> int:
    """Resident memory of ``pid`` and every process below it (Linux ``/proc``; 0 elsewhere):
    the host engine's own process, its engine cores and their workers."""
    total = 0
    for current in tree(pid):
        try:
            with open(f"/proc/{current}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except (OSError, ValueError):
            continue
    return total
