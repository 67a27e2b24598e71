"""A FastAPI endpoint streaming Server-Sent Events from ``ChatVLLM.astream``, in one process.

    python examples/fastapi_sse.py [--model M] [--port 8000] [--workers N]
    curl -N 'http://127.0.0.1:8000/chat?q=Hello'
    curl http://127.0.0.1:8000/metrics/        # vLLM's Prometheus metrics of the engine

or ``MODEL=<hub id or path> uvicorn examples.fastapi_sse:app``. The engine's front end lives in
the server process; ``--workers N`` runs N of them on one engine (``vllm_inline.workers``), where
``uvicorn --workers N`` would load N copies of the model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from prometheus_client import make_asgi_app

from vllm_inline.commands.console import resolve_model
from vllm_inline.engine import prometheus_registry
from vllm_inline.integrations.langchain import ChatVLLM


def sse(data: str, event: str | None = None) -> str:
    """One Server-Sent Event; a text with newlines becomes several ``data:`` lines."""
    head = f"event: {event}\n" if event else ""
    return head + "".join(f"data: {line}\n" for line in data.split("\n")) + "\n"


def create_app(model: str | None = None) -> FastAPI:
    llm = ChatVLLM(model=resolve_model(model), max_tokens=256)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Start the engine with the server (it would otherwise start on the first request);
        # in a thread, so the event loop keeps running while the model loads. At the end stop
        # it if this server started it: one already running in the process is shared (same
        # model and options) and stays up for its other users.
        started_here = not llm.engine.started
        await asyncio.to_thread(llm.engine.start)
        yield
        if started_here:
            await asyncio.to_thread(llm.engine.shutdown)

    app = FastAPI(lifespan=lifespan)
    # vLLM's own metrics of every engine in this process (docs/observability.md).
    app.mount("/metrics", make_asgi_app(registry=prometheus_registry()))

    @app.get("/chat")
    async def chat(q: str) -> StreamingResponse:
        async def events() -> AsyncIterator[str]:
            async for chunk in llm.astream(q):
                if chunk.text:
                    yield sse(chunk.text)
                if chunk.usage_metadata:
                    finish = chunk.response_metadata.get("finish_reason")
                    yield sse(
                        json.dumps({**chunk.usage_metadata, "finish_reason": finish}), "usage"
                    )
            yield sse("[DONE]", "done")

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


app = create_app(os.environ.get("MODEL") or None)


if __name__ == "__main__":
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="hub id or local path (default: embedded demo model)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1, help="worker processes (default: 1)")
    args = parser.parse_args()
    if args.workers != 1:
        from vllm_inline.workers import run

        module = os.path.splitext(os.path.basename(__file__))[0]
        variables = {"MODEL": args.model} if args.model else {}
        served = run(f"{module}:app", workers=args.workers, host=args.host, port=args.port,
                     environment=variables)  # fmt: skip
        raise SystemExit(served)
    uvicorn.run(create_app(args.model) if args.model else app, host=args.host, port=args.port)
