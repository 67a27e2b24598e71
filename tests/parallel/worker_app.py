"""A user's own app for ``python -m vllm_inline run --workers 2 worker_app:create_app --factory``
(tests/parallel/test_workers.py): LangChain objects declared as in one process, each route
answering with what it got and the worker it ran in. Its models and adapters come from the
environment (``WORKER_APP``, JSON)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal, TypedDict

from fastapi import FastAPI, Response
from langchain_core.documents import Document
from langchain_core.tools import tool
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from vllm_inline.engine import RequestTimeoutError, prometheus_registry, start_engines
from vllm_inline.integrations.langchain import ChatVLLM, VLLMRerank


class Mood(TypedDict):
    """How the model feels."""

    mood: Literal["happy", "sad", "calm"]
    sunny: bool


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def create_app() -> FastAPI:
    settings = json.loads(os.environ["WORKER_APP"])
    kwargs = settings["vllm_kwargs"]
    lora = {"enable_lora": True, "max_loras": 2, "max_lora_rank": 8}
    chat = ChatVLLM(
        model=settings["chat"],
        temperature=0,
        vllm_kwargs={**kwargs, **lora, "scheduling_policy": "priority"},
    )
    tools_model = ChatVLLM(model=settings["tools"], temperature=0, vllm_kwargs=kwargs)
    thinker = ChatVLLM(
        model=settings["reasoning"],
        temperature=0,
        vllm_kwargs=kwargs,
        reasoning_parser=settings["reasoning_parser"],
    )
    reranker = VLLMRerank(model=settings["reranker"], top_n=2, vllm_kwargs=kwargs)
    adapters: dict[str, str] = settings["adapters"]

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engines = (chat.engine, tools_model.engine, thinker.engine, reranker.engine)
        await asyncio.to_thread(start_engines, *engines)
        yield
        for engine in engines:
            await asyncio.to_thread(engine.shutdown)

    app = FastAPI(lifespan=lifespan)
    worker = os.environ.get("VLLMINLINE_WORKER")

    @app.get("/chat")
    async def chat_route(adapter: str | None = None) -> dict[str, Any]:
        lora = adapters[adapter] if adapter else None
        chunks = [c.text async for c in chat.astream("Hi", lora=lora, priority=1)]
        return {"worker": worker, "text": "".join(chunks), "chunks": len(chunks)}

    @app.get("/deadline")
    async def deadline_route() -> dict[str, Any]:
        try:
            await chat.bind(timeout=0.3, max_tokens=400, ignore_eos=True).ainvoke("Hi")
        except RequestTimeoutError:
            return {"worker": worker, "timed_out": True}
        return {"worker": worker, "timed_out": False}

    @app.get("/reasoning")
    async def reasoning_route() -> dict[str, Any]:
        message = await thinker.ainvoke("Hi")
        reasoning = message.additional_kwargs.get("reasoning_content", "")
        return {"worker": worker, "reasoning": reasoning.strip(), "text": message.text}

    @app.get("/structured")
    async def structured_route() -> dict[str, Any]:
        mood = await tools_model.with_structured_output(Mood, method="json_schema").ainvoke(
            "How do you feel?"
        )
        return {"worker": worker, "mood": mood}

    @app.get("/tools")
    async def tools_route() -> dict[str, Any]:
        message = await tools_model.bind_tools([get_weather]).ainvoke("Weather in Oslo?")
        calls = [{"name": c["name"], "args": c["args"]} for c in message.tool_calls]
        return {"worker": worker, "tool_calls": calls}

    @app.get("/rerank")
    async def rerank_route() -> dict[str, Any]:
        documents = [Document(page_content=t) for t in ("snow", "sun", "rain")]
        ranked = await reranker.acompress_documents(documents, "weather")
        return {
            "worker": worker,
            "ranked": [(d.page_content, round(d.metadata["relevance_score"], 5)) for d in ranked],
        }

    @app.get("/stats")
    async def stats_route() -> dict[str, Any]:
        stats = chat.engine.stats()
        return {"worker": worker, "requests": stats.requests_finished}

    @app.get("/metrics")
    async def metrics_route() -> Response:
        return Response(generate_latest(prometheus_registry()), media_type=CONTENT_TYPE_LATEST)

    return app
