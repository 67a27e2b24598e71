"""``ChatVLLM.batch`` and friends on a real engine: every input at once, LangChain's semantics.

The scripted model answers every question the same way, so the inputs differ in length and
each output is matched to its input by its prompt token count (``usage_metadata``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, HumanMessage

from vllm_inline.engine import BadRequestError
from vllm_inline.integrations.langchain import ChatVLLM

pytestmark = pytest.mark.engine

LONG = {"ignore_eos": True, "max_tokens": 120}
"""Requests that stay in the engine for 120 steps (the scripted chain, then whatever follows)."""


def chat_for(s: Any) -> ChatVLLM:
    return ChatVLLM(model=s.path, vllm_kwargs=s.engine_kwargs)


def questions(n: int) -> list[str]:
    """``n`` questions of different lengths (so of different prompt token counts)."""
    return [" ".join(["Why"] * (i + 1)) + "?" for i in range(n)]


class Runs(BaseCallbackHandler):
    """Records each run's start (tags, metadata) and end, by run id."""

    def __init__(self) -> None:
        self.starts: dict[Any, dict[str, Any]] = {}
        self.ends: list[Any] = []
        self._lock = threading.Lock()

    def on_chat_model_start(
        self,
        serialized: Any,
        messages: Any,
        *,
        run_id: Any,
        tags: Any = None,
        metadata: Any = None,
        **_: Any,
    ) -> None:
        with self._lock:
            self.starts[run_id] = {"tags": tags or [], "metadata": metadata or {}}

    def on_llm_end(self, response: Any, *, run_id: Any, **_: Any) -> None:
        with self._lock:
            self.ends.append(run_id)


class Boom(Exception):
    """Raised by :class:`FailsMidStream` in the middle of one input's answer."""


class FailsMidStream(BaseCallbackHandler):
    """Raises on its run's third token (``raise_error``: LangChain propagates it), noting how
    many requests the engine was running at that moment."""

    raise_error = True

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.tokens = 0
        self.running_when_raised = -1

    def on_llm_new_token(self, token: str, **_: Any) -> None:
        self.tokens += 1
        if self.tokens == 3:
            self.running_when_raised = self.engine.num_unfinished_requests()
            raise Boom("this input fails in the middle of its answer")


def run_batch(
    chat: ChatVLLM, how: str, inputs: list[Any], config: Any = None, **kwargs: Any
) -> list[Any]:
    """``chat.<how>(inputs, config, **kwargs)`` as a list in input order."""
    if how == "batch":
        return chat.batch(inputs, config, **kwargs)
    if how == "abatch":
        return asyncio.run(chat.abatch(inputs, config, **kwargs))
    out: list[Any] = [None] * len(inputs)
    if how == "batch_as_completed":
        pairs = list(chat.batch_as_completed(inputs, config, **kwargs))
    else:

        async def collect() -> list[tuple[int, Any]]:
            return [p async for p in chat.abatch_as_completed(inputs, config, **kwargs)]

        pairs = asyncio.run(collect())
    assert sorted(i for i, _ in pairs) == list(range(len(inputs)))
    for i, value in pairs:
        out[i] = value
    return out


HOW = ["batch", "abatch", "batch_as_completed", "abatch_as_completed"]


@pytest.mark.parametrize("how", HOW)
def test_batch_keeps_order_and_gives_each_input_its_own_run(scripted: Any, how: str) -> None:
    s = scripted("llama3")
    chat = chat_for(s)
    inputs = questions(5)
    expected_prompt = [chat.get_num_tokens_from_messages([HumanMessage(q)]) for q in inputs]
    runs = Runs()
    configs = [
        {"callbacks": [runs], "tags": [f"input-{i}"], "metadata": {"i": i}} for i in range(5)
    ]

    out = run_batch(chat, how, inputs, configs)

    assert all(isinstance(m, AIMessage) and m.content == s.scenario.answer for m in out)
    assert [m.usage_metadata["input_tokens"] for m in out] == expected_prompt
    assert len(runs.starts) == 5  # one run per input, distinct run ids
    assert sorted(runs.ends) == sorted(runs.starts)
    seen = sorted((r["metadata"]["i"], r["tags"]) for r in runs.starts.values())
    assert seen == [(i, [f"input-{i}"]) for i in range(5)]
    assert s.engine.num_unfinished_requests() == 0


@pytest.mark.parametrize("how", ["batch", "abatch"])
def test_return_exceptions_puts_the_bad_input_s_error_in_its_place(scripted: Any, how: str) -> None:
    s = scripted("llama3")
    chat = chat_for(s)
    bad = [HumanMessage(content=[{"type": "audio", "data": "AAAA"}])]
    inputs = ["Why?", "Why why?", bad, "Why why why?"]

    out = run_batch(chat, how, inputs, return_exceptions=True)

    assert isinstance(out[2], BadRequestError)
    assert out[2].parameter == "messages[0].content[0]"
    for i in (0, 1, 3):
        assert isinstance(out[i], AIMessage) and out[i].content == s.scenario.answer
    assert [out[i].usage_metadata["input_tokens"] for i in (0, 1, 3)] == sorted(
        out[i].usage_metadata["input_tokens"] for i in (0, 1, 3)
    )
    assert s.engine.num_unfinished_requests() == 0


@pytest.mark.parametrize("how", ["batch", "abatch"])
def test_the_first_error_is_raised_after_the_other_requests_are_aborted(
    scripted: Any, how: str
) -> None:
    s = scripted("llama3")
    chat = chat_for(s)
    s.engine.start()
    failing = FailsMidStream(s.engine)
    inputs = questions(6)
    configs: list[dict[str, Any]] = [{} for _ in inputs]
    configs[3] = {"callbacks": [failing]}  # one bad input in the middle: its config fails it

    with pytest.raises(Boom):
        run_batch(chat, how, inputs, configs, **LONG)

    assert failing.running_when_raised >= 2  # others were in the engine when it failed...
    assert s.engine.num_unfinished_requests() == 0  # ...and none is left once it is raised


def wait_for_running(engine: Any, n: int, timeout: float = 60.0) -> int:
    """Wait until the engine runs at least ``n`` requests; returns how many it runs."""
    deadline = time.monotonic() + timeout
    while engine.num_unfinished_requests() < n and time.monotonic() < deadline:
        time.sleep(0.005)
    return engine.num_unfinished_requests()


@pytest.mark.parametrize("how", ["batch_as_completed", "abatch_as_completed"])
def test_leaving_as_completed_early_aborts_the_rest(scripted: Any, how: str) -> None:
    s = scripted("llama3")
    chat = chat_for(s)
    s.engine.start()
    bad = [HumanMessage(content=[{"type": "audio", "data": "AAAA"}])]
    inputs = [bad, *questions(5)]  # the bad one is done first; the five long ones run on
    running = -1

    if how == "batch_as_completed":
        for index, value in chat.batch_as_completed(inputs, return_exceptions=True, **LONG):
            assert index == 0 and isinstance(value, BadRequestError)
            running = wait_for_running(s.engine, 5)
            break
    else:

        async def first() -> int:
            agen = chat.abatch_as_completed(inputs, return_exceptions=True, **LONG)
            async for index, value in agen:
                assert index == 0 and isinstance(value, BadRequestError)
                n = await asyncio.to_thread(wait_for_running, s.engine, 5)
                break
            await agen.aclose()
            return n

        running = asyncio.run(first())
    assert running == 5
    assert s.engine.num_unfinished_requests() == 0
    again = chat.batch(["Why?"], ignore_eos=True, max_tokens=2)  # the engine serves on
    assert again[0].usage_metadata["output_tokens"] == 2


def peak_unfinished(engine: Any, work: Callable[[], Any]) -> tuple[int, Any]:
    """The most requests the engine had unfinished at once while ``work()`` ran (sampled
    every millisecond), and ``work()``'s result."""
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, engine.num_unfinished_requests())
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result = work()
    finally:
        done.set()
        sampler.join()
    return peak, result


@pytest.mark.parametrize("how", ["batch", "abatch"])
def test_max_concurrency_caps_the_engine_s_running_requests(scripted: Any, how: str) -> None:
    s = scripted("llama3")
    chat = chat_for(s)
    s.engine.start()
    inputs = questions(6)

    peak, out = peak_unfinished(
        s.engine, lambda: run_batch(chat, how, inputs, {"max_concurrency": 2}, **LONG)
    )

    assert peak == 2
    assert [m.usage_metadata["output_tokens"] for m in out] == [LONG["max_tokens"]] * 6


@pytest.mark.parametrize("how", ["batch", "abatch"])
def test_without_max_concurrency_every_input_is_in_the_engine_at_once(
    scripted: Any, how: str
) -> None:
    # 12 inputs: more than LangChain's thread pool of min(32, cpus + 4) workers on 2 cores.
    s = scripted("llama3")
    chat = chat_for(s)
    s.engine.start()

    peak, out = peak_unfinished(s.engine, lambda: run_batch(chat, how, questions(12), **LONG))

    assert peak == 12
    assert len(out) == 12 and all(isinstance(m, AIMessage) for m in out)
