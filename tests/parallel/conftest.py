"""``make test`` runs with ``-m 'not parallel and not real'`` (pyproject): it neither runs nor imports these
modules, which need the ``ray`` extra that only ``make test-parallel`` installs."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if "not parallel" in config.getoption("markexpr"):
        return True
    return None
