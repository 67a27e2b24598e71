"""Tensor and pipeline parallel on real engines: the scripted models answer the same on two
ranks as on one, through ``ChatVLLM`` and ``VLLM``, and shutdown leaves no worker behind.

On this CPU vLLM binds each rank's threads to its own NUMA node and refuses to start with one
node; the engine chooses ``VLLM_CPU_OMP_THREADS_BIND`` itself (see ``platform_defaults``), so
these engines start with no environment variable set by the test.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import psutil
import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from layouts import descendants, no_process_left, two_layer_copy, with_layout
from llama_index.core.base.llms.types import ChatMessage

from vllm_inline.engine import get_engine
from vllm_inline.integrations.langchain import ChatVLLM
from vllm_inline.integrations.llama_index import VLLM

pytestmark = [pytest.mark.parallel, pytest.mark.engine]

QUESTION = "What is the weather in Oslo?"


@tool
def get_weather(city: str) -> str:
    """Current weather of a city."""
    return "sunny"


def observe(s: Any) -> dict[str, Any]:
    """What a user sees from ``s``'s engine: answers, stops, tool calls and usage, through
    ``ChatVLLM`` (stream and invoke) and LlamaIndex ``VLLM``."""
    chat = ChatVLLM(model=s.path, vllm_kwargs=s.engine_kwargs, tool_parser=s.scenario.tool_parser)
    chunks = list(chat.stream(QUESTION))
    plain = chat.invoke(QUESTION)
    bound = chat.bind_tools([get_weather])
    first = bound.invoke(QUESTION)
    call = first.tool_calls[0]
    final = bound.invoke(
        [HumanMessage(QUESTION), first, ToolMessage("sunny", tool_call_id=call["id"])]
    )
    llm = VLLM(model=s.path, vllm_kwargs=s.engine_kwargs, tool_parser=s.scenario.tool_parser)
    li = llm.chat([ChatMessage(role="user", content=QUESTION)])
    return {
        "streamed": "".join(c.content for c in chunks),
        "text": plain.content,
        "usage": plain.usage_metadata,
        "finish": plain.response_metadata["finish_reason"],
        "tool_call": (call["name"], call["args"]),
        "after_tool": final.content,
        "after_tool_finish": final.response_metadata["finish_reason"],
        "llama_index": li.message.content,
        "llama_index_usage": li.additional_kwargs["completion_tokens"],
    }


@pytest.fixture(scope="module")
def before() -> set[int]:
    return descendants()


@pytest.fixture(scope="module")
def reference(scripted, before) -> dict[str, Any]:
    """The answers on one rank (the engine is shut down again: only the figures are kept)."""
    s = scripted("chatml_tools")
    seen = observe(s)
    s.engine.shutdown()
    return seen


@pytest.mark.parametrize("layout", [{"tensor_parallel_size": 2}])
def test_tensor_parallel_answers_as_one_rank(scripted, reference, layout) -> None:
    s = with_layout(scripted("chatml_tools"), **layout)
    seen = observe(s)
    assert seen == reference
    assert seen["text"] == s.scenario.answer
    assert seen["after_tool"] == s.scenario.after_tool.answer  # stopped at <|im_end|>
    assert seen["tool_call"] == ("get_weather", {"city": "Oslo"})
    engine = s.engine
    assert engine.platform_defaults.environment == {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}
    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ  # set for the engine's processes only
    # The ranks' CPU communicator segments have no name once both ranks joined
    # (engine/seam/vllm_names.py): none to leave behind however the ranks end.
    assert cpu_shm_names() == set()
    # Ranks that cannot exit within vLLM's executor grace (stopped here; starved on a loaded
    # host) are killed by it: raw vLLM then leaves both ranks' segments (docs/deployment.md).
    ranks = [p for p in psutil.Process().children(recursive=True) if "Worker_TP" in p.name()]
    assert len(ranks) == 2, ranks
    for rank in ranks:
        rank.send_signal(signal.SIGSTOP)
    engine.shutdown()
    assert psutil.wait_procs(ranks, timeout=30)[1] == []
    assert cpu_shm_names() == set()


def cpu_shm_names() -> set[str]:
    """vLLM's CPU communicator segments in /dev/shm now."""
    return {name for name in os.listdir("/dev/shm") if "-cpushm_" in name}


def test_pipeline_parallel(scripted, tmp_path_factory, before) -> None:
    """Two stages of one layer each. vLLM's CPU worker needs the compiled model for this (it
    fails at the first request in eager mode), so the engine is started without
    ``enforce_eager``: the engine chooses ``enforce_eager=False`` for pipeline parallel."""
    s = two_layer_copy(scripted("chatml_tools"), tmp_path_factory.mktemp("pp"))
    options = {k: v for k, v in s.engine_kwargs.items() if k != "enforce_eager"}
    engine = get_engine(s.path, **options, pipeline_parallel_size=2)
    try:
        text = "".join(d.text for d in engine.stream([{"role": "user", "content": QUESTION}]))
        assert text == s.scenario.answer
        assert engine.platform_defaults.kwargs["enforce_eager"] is False
    finally:
        engine.shutdown()


def test_shutdown_leaves_no_worker_process(before) -> None:
    no_process_left(before)
