"""``make test`` runs with ``-m 'not parallel'`` (pyproject): it neither runs nor imports these
modules, which need the ``ray`` extra that only ``make test-parallel`` installs."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if config.getoption("markexpr") == "not parallel":
        return True
    return None
