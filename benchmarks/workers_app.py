"""The app ``benchmarks/workers.py`` runs on every side: an SSE chat route, and a load route that
drives streams inside the worker itself. A BENCHMARK HARNESS, NOT A TEST.

Its settings come from ``WORKERS_BENCH`` (JSON): ``mode`` ``inline`` (``ChatVLLM`` and
LlamaIndex's ``VLLM`` on vllm-inline's engine) or ``openai`` (``ChatOpenAI`` against
``base_url``, a ``vllm serve``), ``model``, ``vllm_kwargs``.

``GET /chat?q=..&max_tokens=..``: Server-Sent Events of the answer. ``GET /load?streams=S&tokens=T
&path=ChatVLLM.astream|VLLM.astream_chat|ChatOpenAI.astream&step=..``: S streams of T tokens at once in this worker;
returns the tokens delivered, the wall time, this process's CPU time and each token's lag: how
late it arrived against the engine's fixed cadence (``step`` seconds a token, the simulated
engine's), counted from its stream's first token.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.responses import StreamingResponse

SETTINGS = json.loads(os.environ.get("WORKERS_BENCH", "{}"))
ENDLESS = {"ignore_eos": True, "skip_special_tokens": False}
"""The load's streams: past the end of the script, every token a chunk (the scripted model's
stop token included: skipped, its chunk would be empty and not sent)."""


def _models() -> tuple[Any, Any, Any]:
    """The LangChain chat model, and (inline only) the load's: ``ChatVLLM`` and LlamaIndex's
    ``VLLM``, both ignoring EOS (a stream runs ``tokens`` tokens)."""
    if SETTINGS["mode"] == "openai":
        from langchain_openai import ChatOpenAI

        chat = ChatOpenAI(
            model=SETTINGS["model"], base_url=SETTINGS["base_url"], api_key="unused", temperature=0
        )
        return chat, None, None
    from vllm_inline.integrations.langchain import ChatVLLM
    from vllm_inline.integrations.llama_index import VLLM

    kwargs = SETTINGS["vllm_kwargs"]
    chat = ChatVLLM(model=SETTINGS["model"], vllm_kwargs=kwargs, temperature=0)
    # No repetition penalty (vllm-inline's default 1.1): vllm serve applies none, and on these
    # CPUs the penalty is most of the engine core's own work per step.
    endless = ChatVLLM(
        model=SETTINGS["model"],
        vllm_kwargs=kwargs,
        repetition_penalty=1.0,
        extra_sampling=ENDLESS,
    )
    llama = VLLM(
        model=SETTINGS["model"],
        vllm_kwargs=kwargs,
        additional_kwargs={**ENDLESS, "repetition_penalty": 1.0},
    )
    return chat, endless, llama


chat_model, endless_chat, llama_llm = _models()


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    engine = getattr(chat_model, "engine", None)
    if engine is not None:
        await asyncio.to_thread(engine.start)
    yield
    if engine is not None:
        await asyncio.to_thread(engine.shutdown)


app = FastAPI(lifespan=lifespan)


@app.get("/ready")
async def ready() -> dict[str, int]:
    return {"pid": os.getpid()}


@app.get("/chat")
async def chat(q: str = "Hello", max_tokens: int = 32) -> StreamingResponse:
    async def events() -> AsyncIterator[str]:
        async for chunk in chat_model.bind(max_tokens=max_tokens).astream(q):
            if chunk.text:
                yield f"data: {json.dumps(chunk.text)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


@app.get("/load")
async def load(
    streams: int, tokens: int, step: float, path: str = "ChatVLLM.astream"
) -> dict[str, Any]:
    lags: list[float] = []
    delivered = 0

    async def one(index: int) -> None:
        nonlocal delivered
        arrivals: list[float] = []
        async for _ in _stream(path, tokens, index):
            arrivals.append(time.monotonic())
        delivered += len(arrivals)
        lags.extend(t - arrivals[0] - k * step for k, t in enumerate(arrivals))

    cpu, start = time.process_time(), time.monotonic()
    await asyncio.gather(*(one(i) for i in range(streams)))
    return {
        "pid": os.getpid(),
        "delivered": delivered,
        "wall": time.monotonic() - start,
        "cpu": time.process_time() - cpu,
        "lags": sorted(lags),
    }


def _stream(path: str, tokens: int, index: int) -> AsyncIterator[Any]:
    prompt = f"Say something, {index}."
    if path == "ChatVLLM.astream":
        return endless_chat.bind(max_tokens=tokens).astream(prompt)
    if path == "VLLM.astream_chat":
        return _llama_stream(prompt, tokens)
    if path == "ChatOpenAI.astream":
        endless = {"max_tokens": tokens, "extra_body": ENDLESS}
        return chat_model.bind(**endless).astream(prompt)
    raise ValueError(f"path must be one of the module docstring's, got {path!r}")


async def _llama_stream(prompt: str, tokens: int) -> AsyncIterator[Any]:
    from llama_index.core.llms import ChatMessage

    messages = [ChatMessage(role="user", content=prompt)]
    stream = await llama_llm.astream_chat(messages, max_tokens=tokens)
    async for part in stream:
        yield part
