"""Real checkpoints from the package registry (``make test-real``).

``make test`` runs with ``-m 'not parallel and not real'`` (pyproject): it neither runs nor imports
these modules. Every test here is marked ``real``.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if "not real" in config.getoption("markexpr"):
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.real)
