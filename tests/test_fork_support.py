"""Engine processes are forked only on a Python whose multiprocessing internals were read
(engine/seam/fork_support.py); elsewhere they are spawned and one log line says why.

Every other CPython on the machine is asked too, with the module loaded by path: the names it
relies on exist there. CPython 3.14 was read from its sources (docs/deployment.md)."""

from __future__ import annotations

import glob
import logging
import subprocess
from pathlib import Path

import pytest

from vllm_inline.engine.seam import fork_support, vllm_boot, vllm_processes

MODULE = Path(fork_support.__file__)
OTHER_PYTHONS = sorted(
    path
    for path in glob.glob("/root/.pyenv/versions/3.1[0-9]*/bin/python")
    if tuple(int(n) for n in Path(path).parts[-3].split(".")[:2]) != fork_support.PYTHON
)


@pytest.fixture
def pretend(monkeypatch: pytest.MonkeyPatch):
    """Run the default's decision as another Python release would (its cache cleared)."""

    def as_python(version: tuple[int, int]) -> None:
        monkeypatch.setattr(fork_support, "PYTHON", version)
        monkeypatch.delenv(vllm_boot.PROCESS_START_VARIABLE, raising=False)
        fork_support.default_process_start.cache_clear()

    yield as_python
    fork_support.default_process_start.cache_clear()


def test_this_python_forks() -> None:
    assert fork_support.fork_unavailable() is None


@pytest.mark.parametrize("python", OTHER_PYTHONS or [None])
def test_every_other_python_here_has_the_internals(python: str | None) -> None:
    if python is None:
        pytest.skip("no other CPython 3.10+ under /root/.pyenv on this machine")
    out = subprocess.run([python, str(MODULE)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "fork", out.stdout + out.stderr


@pytest.mark.parametrize("version", [(3, 9), (3, 15), (4, 0)])
def test_a_release_not_read_is_refused_with_its_number(version: tuple[int, int]) -> None:
    reason = fork_support.fork_unavailable(version)
    assert reason is not None and f"Python {version[0]}.{version[1]}" in reason
    assert "3.10 to 3.14" in reason


@pytest.mark.parametrize("version", [(3, 10), (3, 12), (3, 13), (3, 14)])
def test_every_release_read_forks(version: tuple[int, int]) -> None:
    assert fork_support.fork_unavailable(version) is None


def test_a_missing_internal_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    internals = (*fork_support.INTERNALS, ("multiprocessing.forkserver", "ForkServer._gone"))
    monkeypatch.setattr(fork_support, "INTERNALS", internals)
    reason = fork_support.fork_unavailable()
    assert reason is not None and "multiprocessing.forkserver.ForkServer._gone" in reason


def test_pretending_to_be_3_15_spawns_and_says_why_once(pretend, caplog) -> None:
    pretend((3, 15))
    with caplog.at_level(logging.WARNING, logger="vllm_inline"):
        environment = vllm_boot.engine_environment(cpu=True)
        vllm_boot.engine_environment(cpu=True)
        assert not vllm_processes.forking({})  # the fork server is not launched either
    assert environment[vllm_boot.PROCESS_START_VARIABLE] == "spawn"
    lines = [r.getMessage() for r in caplog.records if "spawned, not forked" in r.getMessage()]
    assert len(lines) == 1 and "Python 3.15" in lines[0], lines


def test_the_users_choice_wins(pretend, monkeypatch: pytest.MonkeyPatch) -> None:
    pretend((3, 15))
    monkeypatch.setenv(vllm_boot.PROCESS_START_VARIABLE, "fork")
    assert vllm_boot.engine_environment(cpu=True)[vllm_boot.PROCESS_START_VARIABLE] == "fork"


def test_a_read_release_forks_by_default(pretend) -> None:
    pretend((3, 12))
    assert vllm_boot.engine_environment(cpu=True)[vllm_boot.PROCESS_START_VARIABLE] == "fork"
    assert vllm_processes.forking({})
