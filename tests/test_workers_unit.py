"""The engine group's own logic, with no engine: worker counts, the attach protocol's errors,
and the sweep of killed launchers' metric directories (the engines: tests/parallel/test_workers.py)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
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


class _FakeCores:
    """Stands for ``vllm_group.SharedCores``: the engine cores are ``sleep`` processes."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.processes = [subprocess.Popen(["sleep", "60"])]
        self.stopped = False

    def clients(self) -> list[dict[str, object]]:
        return [{"index": i, "count": self.count} for i in range(self.count)]

    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def shutdown(self) -> None:
        self.stopped = True
        for p in self.processes:
            p.kill()
            p.wait()


@pytest.fixture
def fake_launch(monkeypatch: pytest.MonkeyPatch) -> list[_FakeCores]:
    """``vllm_group.launch_shared`` replaced (no vLLM): the cores it made."""
    import types

    from vllm_inline.engine import seam

    made: list[_FakeCores] = []

    def launch_shared(model: str, kwargs: object, environment: object, count: int) -> _FakeCores:
        made.append(_FakeCores(count))
        return made[-1]

    fake = types.SimpleNamespace(launch_shared=launch_shared)
    monkeypatch.setitem(sys.modules, "vllm_inline.engine.seam.vllm_group", fake)
    monkeypatch.setattr(seam, "vllm_group", fake, raising=False)
    return made


def _as_other_worker(index: int, pid: int, key: str) -> tuple[object, ...]:
    """Attach as worker ``index`` of process ``pid`` (another process than this test's)."""
    with group._connect() as connection:
        connection.send(("attach", pid, index, key))
        return tuple(connection.recv())


def test_the_first_worker_starts_the_cores_and_the_launcher_hands_out_the_rest(
    monkeypatch: pytest.MonkeyPatch, fake_launch: list[_FakeCores]
) -> None:
    decided = (PlatformDefaults(kwargs={"dtype": "float32"}), {})
    with group.EngineGroup(2) as owner:
        for name, value in owner.environment(0).items():
            monkeypatch.setenv(name, value)
        defaults, client, cores = group.attach("m", {}, lambda: decided)
        assert cores is fake_launch[0] and cores.count == 2  # started here, for two workers
        assert client == {"index": 0, "count": 2} and defaults.kwargs == {"dtype": "float32"}
        other = subprocess.Popen(["sleep", "60"])
        key = '["m", {}]'
        reply = _as_other_worker(1, other.pid, key)
        assert reply[0] == "ready" and reply[2] == {"index": 1, "count": 2}
        assert len(fake_launch) == 1  # the second worker started nothing
        assert owner.engine_pids() == cores.pids()
        (sentinel,) = owner.sentinels()  # a pidfd of the engine core: the launcher watches it

        # The starting worker's stop waits until the other worker has ended.
        stopping = threading.Thread(target=group.stop_owned, args=(cores,))
        stopping.start()
        stopping.join(timeout=1.0)
        assert stopping.is_alive() and not cores.stopped
        assert "shutting down" in str(_as_other_worker(1, other.pid, '["n", {}]'))
        other.kill()
        other.wait()
        stopping.join(timeout=10)
        assert not stopping.is_alive() and cores.stopped
        assert select.select([sentinel], [], [], 5)[0] == [sentinel]


def test_the_launcher_kills_engine_cores_left_after_the_grace(
    monkeypatch: pytest.MonkeyPatch, fake_launch: list[_FakeCores]
) -> None:
    owner = group.EngineGroup(1)
    for name, value in owner.start().items():
        monkeypatch.setenv(name, value)
    _, _, cores = group.attach("m", {}, lambda: (PlatformDefaults(kwargs={}), {}))
    core = cores.processes[0]
    owner.shutdown(grace=0.5)  # the worker that started it never stopped it
    assert core.wait(timeout=10) == -signal.SIGKILL


def test_the_launcher_imports_neither_vllm_nor_torch() -> None:
    code = (
        "import sys\n"
        "from vllm_inline import workers\n"
        "from vllm_inline.engine.life.group import EngineGroup\n"
        "from vllm_inline.engine.seam import vllm_quiet\n"
        "with EngineGroup(2) as g:\n"
        "    g.environment(0)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch')))\n"
    )
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert found.stdout.strip() == "[]"
