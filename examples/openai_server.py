"""Your FastAPI app with vLLM in it: the OpenAI-compatible API for its models, next to your own
route, a LangChain RAG chain on the same engines.

    python examples/openai_server.py [--model M] [--embedding-model E] [--port 8000] [--api-key K]
        [--workers N]
    curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
        -d '{"messages": [{"role": "user", "content": "Hello"}], "stream": true}'
    curl 'http://127.0.0.1:8000/ask?q=What+does+vllm-inline+do'

``vllm_inline.server`` serves ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``,
``/v1/models``, ``/health``, ``/metrics`` and a chat page at ``/`` for any OpenAI client, with
``vllm serve``'s wire format and guard (``--api-key`` or ``$VLLM_API_KEY`` locks ``/v1``). The
``/ask`` route is yours: it retrieves with ``VLLMEmbeddings`` and answers with ``ChatVLLM``, on
the very engines the API serves (``get_engine`` hands out one engine per model and options).
``--workers N`` runs N worker processes on one engine per model (``vllm_inline.workers``): not
N copies of the models.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from fastapi import FastAPI
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.vectorstores import InMemoryVectorStore

from vllm_inline.engine import get_engine
from vllm_inline.integrations.langchain import ChatVLLM, VLLMEmbeddings
from vllm_inline.server import Limits, OpenAIServer
from vllm_inline.testing import build_embedding_model, build_scripted_model

DOCS = [
    "vllm-inline runs vLLM inside the LangChain or LlamaIndex process: no HTTP hop.",
    "Tokens stream straight from vLLM's delta output to ChatVLLM.astream.",
    "Every object on the same model shares one engine and its continuous batching.",
]
PROMPT = ChatPromptTemplate.from_messages(
    [("system", "Answer from this context:\n{context}"), ("human", "{question}")]
)


def create_app(
    model: str | None = None,
    embedding_model: str | None = None,
    *,
    limits: Limits | None = None,
    vllm_kwargs: dict[str, Any] | None = None,
) -> FastAPI:
    """The app: the API on a chat model and an embedder (default: the scripted demo models),
    and ``/ask`` on the same two engines."""
    model = model or os.environ.get("MODEL") or str(build_scripted_model("demo"))
    embedding_model = (
        embedding_model or os.environ.get("EMBEDDING_MODEL") or str(build_embedding_model())
    )
    options = dict(vllm_kwargs or {})
    llm = ChatVLLM(model=model, vllm_kwargs=options)
    embedder = VLLMEmbeddings(model=embedding_model, vllm_kwargs=options)
    server = OpenAIServer(
        chat=get_engine(model, **options),  # llm.engine: the same object
        embedding=get_engine(embedding_model, runner="pooling", **options),
        limits=limits or Limits(api_key=os.environ.get("VLLM_API_KEY")),
    )
    app = FastAPI(lifespan=server.lifespan)
    server.install(app)
    store = InMemoryVectorStore(embedder)
    chain = PROMPT | llm | StrOutputParser()

    @app.get("/ask")
    async def ask(q: str) -> dict[str, Any]:
        if not store.store:  # indexed on first use, once the engines are up
            await store.aadd_texts(DOCS)
        found = await store.asimilarity_search(q, k=2)
        context = "\n".join(doc.page_content for doc in found)
        answer = await chain.ainvoke({"context": context, "question": q})
        return {"answer": answer, "sources": [doc.page_content for doc in found]}

    return app


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", help="chat model (default: $MODEL, else the demo model)")
    parser.add_argument("--embedding-model", help="embedder (default: the scripted embedder)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"))
    parser.add_argument("--workers", type=int, default=1, help="worker processes (default: 1)")
    args = parser.parse_args(argv)
    if args.workers != 1:  # each worker builds the app from these variables
        from vllm_inline.workers import run

        settings = {"MODEL": args.model, "EMBEDDING_MODEL": args.embedding_model}
        settings["VLLM_API_KEY"] = args.api_key
        variables = {name: value for name, value in settings.items() if value}
        module = os.path.splitext(os.path.basename(__file__))[0]
        return run(f"{module}:create_app", factory=True, workers=args.workers, host=args.host,
                   port=args.port, environment=variables)  # fmt: skip
    app = create_app(args.model, args.embedding_model, limits=Limits(api_key=args.api_key))
    uvicorn.run(app, host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
