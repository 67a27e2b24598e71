"""Data parallel on real engines: two engine cores behind one ``AsyncLLM`` in this process, and
two engine cores on "two nodes" (this process as the head, a headless ``vllm serve`` as the
other, over 127.0.0.1), as vLLM's multi-node data parallel does it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from layouts import VLLM_SERVE, descendants, no_process_left, wait_for, with_layout
from processes import free_port

from vllm_inline.engine import ParallelLayoutError, get_engine
from vllm_inline.integrations.langchain import ChatVLLM

pytestmark = [pytest.mark.parallel, pytest.mark.engine]

STREAMS = 64


async def stream_all(chat: ChatVLLM, n: int) -> list[str]:
    async def one(i: int) -> str:
        return "".join([c.content async for c in chat.astream(f"Hello number {i}")])

    return await asyncio.gather(*(one(i) for i in range(n)))


async def cancel_storm(chat: ChatVLLM, n: int) -> None:
    """``n`` streams, cancelled once each has delivered its first chunk (or after 120 s)."""
    started = 0
    all_started = asyncio.Event()

    async def one(i: int) -> None:
        nonlocal started
        async for _ in chat.astream(f"Hello number {i}"):
            started += 1
            if started == n:
                all_started.set()
            await asyncio.sleep(3600)  # cancelled here, mid-stream

    tasks = [asyncio.create_task(one(i)) for i in range(n)]
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(all_started.wait(), 120)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def served_by_every_core(engine: Any, cores: int) -> list[int]:
    finished = [c.requests_finished for c in engine.stats().engine_cores]
    assert len(finished) == cores, finished
    assert all(n > 0 for n in finished), f"requests finished per engine core: {finished}"
    return finished


async def test_data_parallel_spreads_streams_over_both_engine_cores(scripted) -> None:
    before = descendants()
    s = with_layout(scripted("long"), data_parallel_size=2)
    chat = ChatVLLM(model=s.path, vllm_kwargs=s.engine_kwargs)
    engine = get_engine(s.path, **s.engine_kwargs)
    try:
        answers = await stream_all(chat, STREAMS)
        assert answers == [s.scenario.answer] * STREAMS
        wait_for(lambda: engine.stats().requests_finished >= STREAMS, 10, "stats caught up")
        finished = served_by_every_core(engine, 2)
        assert sum(finished) == STREAMS

        await cancel_storm(chat, STREAMS)
        wait_for(lambda: engine.num_unfinished_requests() == 0, 30, "0 unfinished requests")
        # Still serving after the storm.
        assert chat.invoke("Hi").content == s.scenario.answer
    finally:
        engine.shutdown()
    no_process_left(before)


def headless_engine_core(s: Any, rpc_port: int, tmp: Path) -> subprocess.Popen[bytes]:
    """The second "node": ``vllm serve --headless`` running data-parallel rank 1, which
    connects to the head at 127.0.0.1:rpc_port (vLLM's multi-node recipe, on one host), with
    ``tmp`` as its temporary directory: vLLM leaves its rendezvous file there when stopped by a
    signal (docs/deployment.md), not in the host's."""
    kw = s.engine_kwargs
    cmd = [
        sys.executable, "-c", VLLM_SERVE, s.path, "--headless",
        "--data-parallel-size", "2", "--data-parallel-size-local", "1",
        "--data-parallel-start-rank", "1",
        "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", str(rpc_port),
        "--dtype", kw["dtype"], "--max-model-len", str(kw["max_model_len"]),
        "--kv-cache-memory-bytes", str(kw["kv_cache_memory_bytes"]), "--enforce-eager",
    ]  # fmt: skip
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING", "TMPDIR": str(tmp)}
    return subprocess.Popen(cmd, env=env, start_new_session=True)


def multi_node_layout(rpc_port: int) -> dict[str, Any]:
    return {
        "data_parallel_size": 2,
        "data_parallel_size_local": 1,
        "data_parallel_address": "127.0.0.1",
        "data_parallel_rpc_port": rpc_port,
    }


async def test_multi_node_data_parallel_head_and_headless_engine_core(
    scripted, monkeypatch, tmp_path
) -> None:
    monkeypatch.setenv("VLLM_ENGINE_READY_TIMEOUT_S", "300")  # if the peer fails to start
    before = descendants()
    port = free_port()
    s = with_layout(scripted("long"), **multi_node_layout(port))
    peer = headless_engine_core(s, port, tmp_path)
    engine = get_engine(s.path, **s.engine_kwargs)
    try:
        chat = ChatVLLM(model=s.path, vllm_kwargs=s.engine_kwargs)
        answers = await stream_all(chat, 32)
        assert answers == [s.scenario.answer] * 32
        wait_for(lambda: engine.stats().requests_finished >= 32, 10, "stats caught up")
        served_by_every_core(engine, 2)
    finally:
        engine.shutdown()
        peer.terminate()
        try:
            peer.wait(60)
        except subprocess.TimeoutExpired:
            peer.kill()
    no_process_left(before)


def test_a_headless_peer_that_never_connects_fails_typed_within_the_deadline(
    scripted, monkeypatch
) -> None:
    monkeypatch.setenv("VLLM_ENGINE_READY_TIMEOUT_S", "40")
    before = descendants()
    port = free_port()
    s = with_layout(scripted("llama3"), **multi_node_layout(port))
    engine = get_engine(s.path, **s.engine_kwargs)
    started = time.monotonic()
    with pytest.raises(ParallelLayoutError) as info:
        engine.start()
    assert time.monotonic() - started < 40 + 60
    assert info.value.option == "data_parallel_address"
    assert info.value.value == f"127.0.0.1:{port}"
    assert "--headless" in str(info.value) and "VLLM_ENGINE_READY_TIMEOUT_S" in str(info.value)
    assert not engine.started
    no_process_left(before)
