"""Observability and control on real engines: cached prompt tokens, request timings, engine
stats, vLLM's Prometheus metrics, priority, deadlines, LangChain's rate limiter, quiet logs."""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
import urllib.request
from typing import Any

import pytest
from langchain_core.rate_limiters import InMemoryRateLimiter
from llama_index.core.llms import ChatMessage

from vllm_inline.engine import (
    BadRequestError,
    Engine,
    EngineUnavailableError,
    RequestTimeoutError,
    get_engine,
    prometheus_registry,
)
from vllm_inline.integrations.langchain import ChatVLLM
from vllm_inline.integrations.llama_index import VLLM

pytestmark = pytest.mark.engine

USER = [{"role": "user", "content": "Hi"}]
LONG = {"ignore_eos": True, "max_tokens": 400}  # a long answer, to have something to stop


def _long_question(engine: Engine) -> list[dict[str, str]]:
    """A user turn longer than two KV-cache blocks, so vLLM's prefix cache can hold it."""
    block = engine.runtime.llm.vllm_config.cache_config.block_size
    words = "Tell me a joke about the weather in Oslo today, please. "
    text = words
    while len(engine.prompt_token_ids([{"role": "user", "content": text}])) < 2 * block + 8:
        text += words
    assert len(engine.prompt_token_ids([{"role": "user", "content": text}])) < 400
    return [{"role": "user", "content": text}]


def test_cached_prompt_tokens_reach_both_frameworks(scripted) -> None:
    s = scripted("llama3")
    messages = _long_question(s.engine)
    first = list(s.engine.stream(messages))[-1].usage
    second = list(s.engine.stream(messages))[-1].usage
    assert second.prompt_tokens == first.prompt_tokens
    assert second.cached_tokens > 0, "the same prompt again: vLLM's prefix cache must hit"
    assert second.cached_tokens <= second.prompt_tokens
    assert s.engine.stats().prefix_cache_hit_rate > 0

    chat = ChatVLLM(model=s.path, vllm_kwargs=s.engine_kwargs)
    message = chat.invoke(messages[0]["content"])
    assert message.usage_metadata["input_token_details"]["cache_read"] > 0
    llm = VLLM(model=s.path, vllm_kwargs=s.engine_kwargs)
    response = llm.chat([ChatMessage(role="user", content=messages[0]["content"])])
    assert response.raw["usage"]["cached_tokens"] > 0
    assert response.additional_kwargs["cached_tokens"] > 0


def test_request_timings_on_the_last_delta_and_in_both_frameworks(scripted) -> None:
    s = scripted("llama3")
    deltas = list(s.engine.stream(USER))
    assert all(d.metrics is None for d in deltas[:-1])
    m = deltas[-1].metrics
    assert m is not None
    assert 0 <= m.queue_time and 0 < m.time_to_first_token <= m.e2e_time
    assert 0 <= m.prefill_time and 0 < m.decode_time < m.e2e_time

    message = ChatVLLM(model=s.path, vllm_kwargs=s.engine_kwargs).invoke("Hi")
    assert set(message.response_metadata["metrics"]) == {
        "queue_time",
        "time_to_first_token",
        "prefill_time",
        "decode_time",
        "e2e_time",
    }
    response = VLLM(model=s.path, vllm_kwargs=s.engine_kwargs).chat(
        [ChatMessage(role="user", content="Hi")]
    )
    assert response.raw["metrics"]["e2e_time"] > 0


def test_engine_stats_move_per_engine(scripted) -> None:
    a, b = scripted("llama3").engine, scripted("chatml").engine
    a.start(), b.start()
    before_a, before_b = a.stats(), b.stats()
    seen_running = []
    for delta in a.stream(USER, **LONG):
        if len(seen_running) < 3:
            seen_running.append(a.stats().requests_running)
    after_a, after_b = a.stats(), b.stats()
    assert max(seen_running) >= 1, "a stream in flight is a running request"
    assert after_a.generation_tokens - before_a.generation_tokens >= LONG["max_tokens"] - 1
    assert after_a.requests_finished == before_a.requests_finished + 1
    assert after_a.prompt_tokens > before_a.prompt_tokens
    assert 0 <= after_a.kv_cache_usage <= 1
    assert after_b == before_b, "another engine's requests do not count here"

    with pytest.raises(EngineUnavailableError, match="not running"):
        Engine("never/started").stats()


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics/", timeout=30) as response:
        return response.read().decode()


def _value(text: str, name: str, model: str) -> float:
    """The sample of metric ``name`` labelled with ``model`` (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(name + "{") and f'model_name="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_prometheus_metrics_through_the_fastapi_example(scripted) -> None:
    """examples/fastapi_sse.py serves /metrics; a scrape during load sees vLLM's metrics move,
    for two engines at once."""
    import uvicorn
    from test_examples import load  # the examples' loader of tests/test_examples.py

    demo, other = scripted("demo"), scripted("chatml")
    app = load("fastapi_sse").create_app(demo.path)
    app_engine = get_engine(demo.path)  # the example's engine: no vllm_kwargs
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.1)
        list(other.engine.stream(USER))  # the second engine has series of its own
        before = _scrape(port)
        running = []
        load_done = threading.Event()

        def load() -> None:
            try:
                list(app_engine.stream(USER, **LONG))
            finally:
                load_done.set()

        worker = threading.Thread(target=load)
        worker.start()
        while not load_done.is_set() and len(running) < 50:
            running.append(_value(_scrape(port), "vllm:num_requests_running", demo.path))
        worker.join(timeout=120)
        after = _scrape(port)
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()
    assert max(running) >= 1, running
    for name in ("vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_count"):
        assert _value(after, name, demo.path) > _value(before, name, demo.path), name
    assert _value(after, "vllm:generation_tokens_total", other.path) > 0
    assert prometheus_registry() is prometheus_registry()


async def test_priority_runs_a_later_urgent_request_first(scripted) -> None:
    s = scripted("long")
    engine = get_engine(
        s.path, **{**s.engine_kwargs, "scheduling_policy": "priority", "max_num_seqs": 1}
    )
    finished: list[str] = []

    async def run(name: str, priority: int, **kwargs: Any) -> None:
        async for delta in engine.astream(USER, priority=priority, **kwargs):
            if delta.finish_reason:
                finished.append(name)

    try:
        await asyncio.to_thread(engine.start)
        first = asyncio.create_task(run("first", 10, **LONG))  # occupies the one batch slot
        queued = [asyncio.create_task(run(f"low{i}", 10, max_tokens=5)) for i in range(2)]
        while engine.num_unfinished_requests() < 3:
            await asyncio.sleep(0.01)
        urgent = asyncio.create_task(run("urgent", 0, max_tokens=5))
        await asyncio.gather(first, *queued, urgent)
    finally:
        await asyncio.to_thread(engine.shutdown)
    assert finished.index("urgent") < finished.index("low0")
    assert finished.index("urgent") < finished.index("low1")


def test_timeout_aborts_the_request_everywhere(scripted) -> None:
    s = scripted("long")
    engine = s.engine
    got: list[str] = []
    with pytest.raises(RequestTimeoutError) as err:
        for delta in engine.stream(USER, timeout=0.3, **LONG):
            got.append(delta.text)
    assert err.value.timeout == 0.3 and "timeout" in str(err.value)
    assert len(got) < LONG["max_tokens"]
    chat = ChatVLLM(
        model=s.path,
        vllm_kwargs=s.engine_kwargs,
        timeout=0.3,
        max_tokens=LONG["max_tokens"],
        extra_sampling={"ignore_eos": True},
    )
    with pytest.raises(RequestTimeoutError):
        chat.invoke("Hi")
    llm = VLLM(model=s.path, vllm_kwargs=s.engine_kwargs, timeout=0.3, additional_kwargs=LONG)
    with pytest.raises(RequestTimeoutError):
        llm.chat([ChatMessage(role="user", content="Hi")])
    deadline = time.monotonic() + 10
    while engine.num_unfinished_requests() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.num_unfinished_requests() == 0
    # No deadline hit: the same engine answers in full.
    text = "".join(d.text for d in engine.stream(USER, timeout=120))
    assert text == s.scenario.answer


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"timeout": -1}, "timeout"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": "soon"}, "timeout"),
        ({"priority": "high"}, "priority"),
        ({"priority": 1.5}, "priority"),
    ],
)
def test_bad_timeout_or_priority_is_refused_before_any_work(kwargs, parameter) -> None:
    engine = Engine("never/started")
    with pytest.raises(BadRequestError) as err:
        engine.stream(USER, **kwargs)
    assert err.value.parameter == parameter
    assert not engine.started


def test_langchain_rate_limiter_is_used(scripted) -> None:
    s = scripted("llama3")

    class Counting(InMemoryRateLimiter):
        calls = 0

        def acquire(self, *, blocking: bool = True) -> bool:
            Counting.calls += 1
            return super().acquire(blocking=blocking)

        async def aacquire(self, *, blocking: bool = True) -> bool:
            Counting.calls += 1
            return await super().aacquire(blocking=blocking)

    limiter = Counting(requests_per_second=50, check_every_n_seconds=0.01, max_bucket_size=1)
    chat = ChatVLLM(model=s.path, vllm_kwargs=s.engine_kwargs, rate_limiter=limiter)
    assert chat.invoke("Hi").content == s.scenario.answer
    assert "".join(c.content for c in chat.stream("Hi")) == s.scenario.answer
    assert asyncio.run(chat.ainvoke("Hi")).content == s.scenario.answer
    assert Counting.calls == 3


def test_no_periodic_stats_log_by_default(scripted) -> None:
    from vllm.v1.metrics.loggers import LoggingStatLogger

    llm = scripted("llama3").engine.runtime.llm
    loggers = llm.logger_manager.stat_loggers
    kinds = {type(getattr(lg, "per_engine_stat_loggers", {0: lg})[0]) for lg in loggers}
    assert not any(issubclass(k, LoggingStatLogger) for k in kinds), kinds
    assert re.search("Prometheus", " ".join(k.__name__ for k in kinds))


def test_prometheus_loggers_of_engines_starting_at_once(scripted, monkeypatch) -> None:
    """Engines whose starts end together (start_engines, a group's workers attaching) build
    their Prometheus loggers at once. vLLM's logger unregisters the global registry's ``vllm:``
    metrics, then registers a few there again (PerfMetricsProm): interleaved, that was
    DuplicateTimeseries in a two-worker app. Each unregistering is slowed here so that two
    unguarded loggers would interleave every time."""
    import vllm.v1.metrics.loggers as vllm_loggers

    from vllm_inline.engine.seam.vllm_stats import SharedPrometheusStatLogger

    config = scripted("llama3").engine.runtime.llm.vllm_config
    unregister = vllm_loggers.unregister_vllm_metrics

    def slowly() -> None:
        unregister()
        time.sleep(0.3)

    monkeypatch.setattr(vllm_loggers, "unregister_vllm_metrics", slowly)
    errors: list[Exception] = []

    def build() -> None:
        try:
            SharedPrometheusStatLogger(vllm_config=config, engine_indexes=[0])
        except Exception as error:  # noqa: BLE001 - reported by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=build) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []


def test_stats_book_keeps_each_engine_core_apart() -> None:
    """Data-parallel engines report per engine core; the snapshot sums them and keeps each."""
    from types import SimpleNamespace

    from vllm_inline.engine.life.metrics import StatsBook

    def step(running: int, finished: int, kv: float) -> tuple[Any, Any]:
        prefix = SimpleNamespace(queries=10, hits=5)
        scheduler = SimpleNamespace(
            num_running_reqs=running,
            num_waiting_reqs=1,
            kv_cache_usage=kv,
            prefix_cache_stats=prefix,
        )
        iteration = SimpleNamespace(
            num_prompt_tokens=7, num_generation_tokens=3, finished_requests=[None] * finished
        )
        return scheduler, iteration

    book = StatsBook()
    assert book.snapshot().engine_cores[0].requests_running == 0  # before the first step
    book.record(*step(4, 2, 0.5), engine_index=0)
    book.record(*step(3, 1, 0.1), engine_index=1)
    book.record(*step(2, 1, 0.3), engine_index=1)  # the latest gauge wins, counters add up
    stats = book.snapshot()
    assert [c.requests_running for c in stats.engine_cores] == [4, 2]
    assert [c.requests_finished for c in stats.engine_cores] == [2, 2]
    assert (stats.requests_running, stats.requests_waiting, stats.requests_finished) == (6, 2, 4)
    assert stats.kv_cache_usage == pytest.approx(0.4)
    assert stats.generation_tokens == 9 and stats.prefix_cache_hit_rate == 0.5
    assert stats.engine_cores[1].engine_cores == ()
