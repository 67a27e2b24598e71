"""Engine lifecycle on a real engine: lazy imports, shutdown, restart, engine death, exit."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

import vllm_inline.engine as engine_module
from vllm_inline.engine import EngineDeadError, EngineShutdownError, get_engine

USER = [{"role": "user", "content": "hi"}]


def test_engine_exports_are_pinned():
    assert sorted(engine_module.__all__) == sorted([
        "DEFAULTS", "BadRequestError", "ChatTemplateError", "ContextLengthExceededError",
        "Delta", "Engine", "EngineDeadError", "EngineShutdownError", "EngineStats",
        "EngineUnavailableError", "InsufficientMemoryError", "ModelLoadError", "ParallelLayoutError",
        "RequestMetrics",
        "RequestTimeoutError", "StatsDisabledError", "StopPolicy", "TokenLogprob", "ToolCallDelta",
        "UnsupportedTaskError", "Usage", "VLLMInlineError", "get_engine", "prometheus_registry",
        "shutdown_all",
    ])


def test_importing_the_package_loads_neither_torch_nor_vllm():
    code = (
        "import sys, vllm_inline, vllm_inline.engine; "
        "from vllm_inline.engine import get_engine; get_engine('some/model'); "
        "print(','.join(m for m in ('torch', 'vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_our_environment_variables_pass_vllms_strict_check(monkeypatch, tmp_path):
    """vLLM warns about (or, with ``fail_on_environ_validation``, refuses) unknown ``VLLM_*``
    variables: every variable the package, tests and benchmarks read must pass its check."""
    import re
    from pathlib import Path

    from vllm.platforms import current_platform

    root = Path(__file__).resolve().parent.parent
    sources = [p for d in ("engine", "integrations", "vllm_inline", "tests", "benchmarks")
               for p in (root / d).rglob("*.py")]
    read = re.compile(r"""os\.environ(?:\.get\(|\[)\s*["']([A-Z0-9_]+)["']""")
    names = {n for p in sources for n in read.findall(p.read_text())}
    assert "VLLMINLINE_CACHE" in names  # the scan finds what it should
    for name in names:
        monkeypatch.setenv(name, str(tmp_path))
    current_platform.validate_environ(hard_fail=True)


def test_constructing_an_engine_starts_nothing(scripted):
    s = scripted("chatml")
    engine = get_engine(s.path, **{**s.engine_kwargs, "seed": 12345})
    assert not engine.started
    assert engine.num_unfinished_requests() == 0


def _engine_processes() -> list[psutil.Process]:
    """Child processes, less multiprocessing's resource tracker (it lives as long as we do)."""
    alive = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(p.cmdline()):
                alive.append(p)
        except psutil.Error:  # gone (or a zombie) while we looked
            pass
    return alive


def test_a_started_engine_freezes_the_start_up_heap(scripted):
    """As vLLM's server does: full collections then skip torch/vLLM's objects (no 0.5 s pauses)."""
    engine = scripted("llama3").engine.start()
    assert engine.started
    assert gc.get_freeze_count() > 100_000


@pytest.fixture(scope="module")
def own_engine(scripted):
    """A private engine (distinct options) this module may shut down, kill and restart."""
    s = scripted("long")
    engine = get_engine(s.path, **{**s.engine_kwargs, "seed": 7})
    yield s, engine
    engine.shutdown()


def test_shutdown_ends_running_streams_and_the_engine_restarts(own_engine):
    s, engine = own_engine
    before = set(p.pid for p in _engine_processes())
    engine.start()
    started = [p for p in _engine_processes() if p.pid not in before]
    assert started  # the engine-core process (and its worker)
    errors: list[BaseException] = []
    got_one = threading.Event()

    def consume() -> None:
        try:
            for _ in engine.stream(USER, max_tokens=400, ignore_eos=True):
                got_one.set()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=consume)
    t.start()
    assert got_one.wait(60)
    engine.shutdown()
    t.join(30)
    assert not t.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], EngineShutdownError)
    engine.shutdown()  # idempotent
    psutil.wait_procs(started, timeout=15)
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in started)
    # used again, it starts again
    assert "".join(d.text for d in engine.stream(USER, max_tokens=3)) == " ".join(
        s.scenario.answer.split(" ")[:3]
    )


def test_engine_death_ends_streams_with_a_clear_error_and_restart_recovers(own_engine):
    s, engine = own_engine
    engine.shutdown()
    before = {p.pid for p in _engine_processes()}
    engine.start()
    core = [p for p in _engine_processes() if p.pid not in before]  # this engine's, no other's
    assert core
    stream = engine.stream(USER, max_tokens=400, ignore_eos=True)
    next(stream)
    for p in core:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    start = time.monotonic()
    with pytest.raises(EngineDeadError):
        for _ in stream:
            pass
    assert time.monotonic() - start < 60  # ends, does not hang
    with pytest.raises(EngineDeadError, match="restart"):
        list(engine.stream(USER, max_tokens=3))
    engine.restart()
    assert "".join(d.text for d in engine.stream(USER, max_tokens=3)) == " ".join(
        s.scenario.answer.split(" ")[:3]
    )


def test_a_script_that_never_calls_shutdown_exits_by_itself(scripted, tmp_path):
    s = scripted("chatml")
    script = tmp_path / "no_shutdown.py"
    script.write_text(textwrap.dedent(f"""
        import json, psutil
        from vllm_inline.engine import get_engine

        if __name__ == "__main__":
            engine = get_engine({s.path!r}, **{s.engine_kwargs!r})
            text = "".join(d.text for d in engine.stream([{{"role": "user", "content": "hi"}}]))
            print(json.dumps({{"text": text, "children": [p.pid for p in psutil.Process().children(recursive=True)]}}), flush=True)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = ""
    for line in proc.stdout:  # vLLM logs to stdout too
        if line.startswith("{"):
            break
    printed = time.monotonic()
    proc.stdout.read()
    proc.wait(timeout=120)
    exit_seconds = time.monotonic() - printed
    import json

    report = json.loads(line)
    assert report["text"] == s.scenario.answer
    assert proc.returncode == 0
    print(f"exit took {exit_seconds:.1f} s after the answer")
    assert exit_seconds < 30
    gone, alive = psutil.wait_procs([psutil.Process(p) for p in report["children"] if psutil.pid_exists(p)], timeout=10)
    assert not alive
