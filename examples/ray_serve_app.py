"""A LangChain chain on ``ChatVLLM`` as a Ray Serve deployment: replicas of the whole app, each
with its own engine, streaming Server-Sent Events.

    pip install "vllm-inline[ray]"
    python examples/ray_serve_app.py [--model M] [--num-replicas 2] [--num-cpus 1] [--num-gpus 1]
    curl -N 'http://127.0.0.1:8000/chat?q=Hello'
    curl http://127.0.0.1:8000/stats          # this replica's engine: requests in flight, tokens

Every replica is one Ray actor holding the chain and one engine (vLLM's engine core runs in a
process the replica spawns); Ray Serve's proxy spreads requests over the replicas, and a client
that hangs up cancels its request in the replica, which aborts it in vLLM. ``num_replicas`` and
each replica's resources (``ray_actor_options``: CPUs, GPUs) are options of :func:`build_app`.
The SSE events are those of ``examples/fastapi_sse.py``. Ray is an optional extra: nothing in
``vllm_inline`` imports it. See docs/ray_serve.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from langchain_core.prompts import ChatPromptTemplate
from ray import serve
from ray.serve import Application

from vllm_inline.commands.console import resolve_model
from vllm_inline.integrations.langchain import ChatVLLM

app = FastAPI()


def sse(data: str, event: str | None = None) -> str:
    """One Server-Sent Event; a text with newlines becomes several ``data:`` lines."""
    head = f"event: {event}\n" if event else ""
    return head + "".join(f"data: {line}\n" for line in data.split("\n")) + "\n"


@serve.deployment
@serve.ingress(app)
class ChainDeployment:
    """One replica: the chain, and the engine its ``ChatVLLM`` runs on (started here)."""

    def __init__(self, model: str, chat_options: dict[str, Any]) -> None:
        self.llm = ChatVLLM(model=model, **chat_options)
        prompt = ChatPromptTemplate.from_messages(
            [("system", "You are a concise assistant."), ("human", "{question}")]
        )
        self.chain = prompt | self.llm
        # Load the model before the replica takes traffic: Ray Serve routes requests to a
        # replica only once its constructor has returned.
        self.llm.engine.start()

    @app.get("/chat")
    async def chat(self, q: str) -> StreamingResponse:
        async def events() -> AsyncIterator[str]:
            # A client that disconnects cancels this generator (Ray Serve cancels the request
            # in the replica); closing the chain's stream aborts the request in vLLM.
            async for chunk in self.chain.astream({"question": q}):
                if chunk.text:
                    yield sse(chunk.text)
                if chunk.usage_metadata:
                    finish = chunk.response_metadata.get("finish_reason")
                    yield sse(
                        json.dumps({**chunk.usage_metadata, "finish_reason": finish}), "usage"
                    )
            yield sse("[DONE]", "done")

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.get("/stats")
    async def stats(self) -> dict[str, Any]:
        """This replica's engine: ``Engine.stats()`` and the requests still in flight in vLLM."""
        engine = self.llm.engine
        return {
            **asdict(engine.stats()),
            "num_unfinished_requests": engine.num_unfinished_requests(),
            "replica": serve.get_replica_context().replica_id.unique_id,
        }

    def __del__(self) -> None:
        # Ray Serve calls this when it stops the replica: shut the engine down so its engine
        # core process ends with the replica.
        engine = getattr(self, "llm", None)
        if engine is not None:
            engine.engine.shutdown()


def build_app(
    model: str | None = None,
    *,
    num_replicas: int = 1,
    num_cpus: float = 1,
    num_gpus: float = 0,
    max_tokens: int = 256,
    chat_options: dict[str, Any] | None = None,
) -> Application:
    """The Ray Serve application: ``num_replicas`` replicas of the chain on ``model`` (a hub id
    or path; default: the embedded scripted demo model), each with ``num_cpus`` CPUs and
    ``num_gpus`` GPUs reserved. ``chat_options`` are further ``ChatVLLM`` fields (sampling,
    parsers, the vllm_kwargs you pass to vLLM); on a CPU the engine picks dtype, KV-cache size
    and eager mode itself."""
    deployment = ChainDeployment.options(
        num_replicas=num_replicas,
        ray_actor_options={"num_cpus": num_cpus, "num_gpus": num_gpus},
    )
    options = {"max_tokens": max_tokens, **(chat_options or {})}
    return deployment.bind(resolve_model(model), options)


def main(argv: list[str] | None = None) -> None:
    import ray

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="hub id or local path (default: embedded demo model)")
    parser.add_argument("--num-replicas", type=int, default=1)
    parser.add_argument("--num-cpus", type=float, default=1, help="CPUs per replica")
    parser.add_argument("--num-gpus", type=float, default=0, help="GPUs per replica")
    parser.add_argument(
        "--address", help="an existing Ray cluster (default: start a local Ray instance)"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    ray.init(address=args.address, include_dashboard=False)
    serve.start(http_options={"host": args.host, "port": args.port})
    application = build_app(
        args.model,
        num_replicas=args.num_replicas,
        num_cpus=args.num_cpus,
        num_gpus=args.num_gpus,
    )
    serve.run(application, name="chain", route_prefix="/")
    print(f"Serving on http://{args.host}:{args.port}/chat?q=... (Ctrl-C stops)", flush=True)
    try:
        asyncio.run(asyncio.Event().wait())
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
