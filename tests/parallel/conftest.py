"""``make test`` runs with ``-m 'not parallel and not real'`` (pyproject): it neither runs nor imports these
modules, which need the ``ray`` extra that only ``make test-parallel`` installs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from processes import Started


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if "not parallel" in config.getoption("markexpr"):
        return True
    return None


@pytest.fixture
def started() -> Iterator[Started]:
    """Register the processes a test starts (``started.track(pid)``): at the end of the test
    whatever is left of them is killed, by pid, and the ``/dev/shm`` entries they held are
    removed."""
    tracked = Started()
    yield tracked
    tracked.clean_up()
