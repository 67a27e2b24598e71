"""The engine group's own logic, with no engine: worker counts, the attach protocol's errors,
and the sweep of killed launchers' metric directories (the engines: tests/parallel/test_workers.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from vllm_inline.engine.errors import ModelLoadError
from vllm_inline.engine.life import group
from vllm_inline.engine.life.platform_defaults import PlatformDefaults


@pytest.mark.parametrize("workers", [0, -1, 1.5, True, "2"])
def test_a_worker_count_below_one_or_not_whole_is_refused(workers: object) -> None:
    with pytest.raises(ValueError, match=rf"workers must be .* 1 or more; got {workers!r}"):
        group.EngineGroup(workers)  # type: ignore[arg-type]


def test_a_failed_decision_reaches_the_worker_and_the_next_one_decides_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with group.EngineGroup(2) as owner:
        for name, value in owner.environment(0).items():
            monkeypatch.setenv(name, value)
        assert group.joined() and group.worker_index() == 0
        calls = []

        def decide() -> tuple[PlatformDefaults, dict[str, str]]:
            calls.append(1)
            raise ValueError("not enough memory for 'm'")

        for _ in range(2):
            with pytest.raises(ValueError, match="not enough memory"):
                group.attach("m", {"dtype": "float32"}, decide)
        assert len(calls) == 2  # the failed start was forgotten: the next caller decides


def test_a_worker_whose_owner_is_gone_gets_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(group.ADDRESS_VARIABLE, "@vllm-inline-group-gone")
    monkeypatch.setenv(group.KEY_VARIABLE, "00")
    with pytest.raises(ModelLoadError, match="owner does not answer"):
        group.attach("m", {}, lambda: (PlatformDefaults(kwargs={}), {}))


def test_metric_directories_of_killed_launchers_are_swept(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from vllm_inline import workers

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    ended = subprocess.Popen(["true"])
    ended.wait()
    dead = tmp_path / f"vllm-inline-metrics-{ended.pid}-abc"
    live = tmp_path / f"vllm-inline-metrics-{os.getppid()}-def"
    dead.mkdir()
    live.mkdir()
    made = Path(workers._metrics_directory())
    assert made.parent == tmp_path and made.name.startswith(f"vllm-inline-metrics-{os.getpid()}-")
    assert not dead.exists() and live.exists()
