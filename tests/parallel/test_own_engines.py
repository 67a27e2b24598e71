"""Engines of their own, started beside the suite's shared ones: shutdown while streams run,
restart, the engine core killed mid-stream, a script that never calls ``shutdown``, and an engine
with vLLM's stats turned off.

Each starts (or kills and restarts) an engine process of its own, half a minute or more apiece
on this CPU, so they run in ``make test-parallel`` with the other tests that start engine
processes, not in ``make test``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest
from layouts import descendants, no_process_left

from vllm_inline.engine import (
    EngineDeadError,
    EngineShutdownError,
    StatsDisabledError,
    get_engine,
    prometheus_registry,
)
from vllm_inline.integrations.langchain import ChatVLLM

pytestmark = [pytest.mark.parallel, pytest.mark.engine]

USER = [{"role": "user", "content": "hi"}]
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def own_engine(scripted):
    """A private engine (distinct options) this module may shut down, kill and restart."""
    s = scripted("long")
    engine = get_engine(s.path, **{**s.engine_kwargs, "seed": 7})
    yield s, engine
    engine.shutdown()


def test_shutdown_ends_running_streams_and_the_engine_restarts(own_engine):
    s, engine = own_engine
    before = descendants()
    engine.start()
    assert descendants() - before  # the engine-core process (and its worker)
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
    no_process_left(before, timeout=15)
    # used again, it starts again
    assert "".join(d.text for d in engine.stream(USER, max_tokens=3)) == " ".join(
        s.scenario.answer.split(" ")[:3]
    )


def test_engine_death_ends_streams_with_a_clear_error_and_restart_recovers(own_engine):
    s, engine = own_engine
    engine.shutdown()
    before = descendants()
    engine.start()
    core = descendants() - before  # this engine's processes, no other engine's
    assert core
    stream = engine.stream(USER, max_tokens=400, ignore_eos=True)
    next(stream)
    for pid in core:
        try:
            psutil.Process(pid).send_signal(signal.SIGKILL)
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
    script.write_text(
        textwrap.dedent(f"""
        import json, psutil
        from vllm_inline.engine import get_engine

        if __name__ == "__main__":
            engine = get_engine({s.path!r}, **{s.engine_kwargs!r})
            text = "".join(d.text for d in engine.stream([{{"role": "user", "content": "hi"}}]))
            print(json.dumps({{"text": text, "children": [p.pid for p in psutil.Process().children(recursive=True)]}}), flush=True)
    """)
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    line = ""
    for line in proc.stdout:  # vLLM logs to stdout too
        if line.startswith("{"):
            break
    printed = time.monotonic()
    proc.stdout.read()
    proc.wait(timeout=120)
    exit_seconds = time.monotonic() - printed
    report = json.loads(line)
    assert report["text"] == s.scenario.answer
    assert proc.returncode == 0
    print(f"exit took {exit_seconds:.1f} s after the answer")
    assert exit_seconds < 30
    _gone, alive = psutil.wait_procs(
        [psutil.Process(p) for p in report["children"] if psutil.pid_exists(p)], timeout=10
    )
    assert not alive


def _generated_tokens(model: str) -> float:
    """vLLM's generation-token counter of ``model`` in the package's Prometheus registry."""
    return sum(
        sample.value
        for metric in prometheus_registry().collect()
        for sample in metric.samples
        if sample.name == "vllm:generation_tokens_total"
        and sample.labels.get("model_name") == model
    )


def test_disable_log_stats_turns_vllms_stats_off_and_stats_says_so(scripted) -> None:
    """An explicit ``disable_log_stats=True`` is vLLM's own meaning (as ``vllm.LLM``'s default):
    no stats recorded, so ``stats()`` raises, no Prometheus series move and requests carry no
    timings; answers and usage are unchanged. The default engine keeps its stats."""
    s = scripted("llama3")
    s.engine.start()
    options = {**s.engine_kwargs, "disable_log_stats": True}
    engine = get_engine(s.path, **options)
    assert engine is not s.engine
    try:
        engine.start()
        assert engine.runtime.llm.logger_manager is None, "vLLM must record no stats"
        before = _generated_tokens(s.path)
        deltas = list(engine.stream(HI))
        default = list(s.engine.stream(HI))
        assert "".join(d.text for d in deltas) == "".join(d.text for d in default)
        assert deltas[-1].usage == default[-1].usage
        assert deltas[-1].metrics is None and default[-1].metrics is not None
        message = ChatVLLM(model=s.path, vllm_kwargs=options).invoke("Hi")  # final-only
        assert message.content == "".join(d.text for d in default)
        assert message.usage_metadata["output_tokens"] == default[-1].usage.completion_tokens
        assert "metrics" not in message.response_metadata
        moved = _generated_tokens(s.path) - before
        assert moved == default[-1].usage.completion_tokens, "only the default engine counts"
        with pytest.raises(StatsDisabledError, match="disable_log_stats=True"):
            engine.stats()
    finally:
        engine.shutdown()
    assert s.engine.stats().generation_tokens > 0
