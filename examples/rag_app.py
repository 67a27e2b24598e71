"""A whole RAG app in one process: a chat model, an embedder and a reranker, started together,
streaming an answer with its sources. No vLLM server.

    python examples/rag_app.py                          # scripted models built locally, LangChain
    python examples/rag_app.py --framework llama-index
    python examples/rag_app.py --model Qwen/Qwen3-0.6B --embedder BAAI/bge-small-en-v1.5 \\
        --reranker BAAI/bge-reranker-v2-m3 --question "How do the engines stop?"

A turn: embed the question, take the 8 nearest chunks from an in-memory vector store, rerank
them to 3, stream the answer from those. The three engines start at once (``start_engines``,
one progress line per model on stderr) with their memory planned together: none sets a memory
option, and on a GPU each gets the share that lets all three start, on a CPU a KV cache sized
from what all three models' weights leave. They shut down together when the process exits.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from vllm_inline.commands.console import resolve_model
from vllm_inline.engine import start_engines

CHUNKS = [
    "vllm-inline runs the vLLM engine inside the application's Python process: no HTTP server.",
    "Each token vLLM generates reaches the LangChain or LlamaIndex stream as soon as it exists.",
    "The engine stops at the model family's end-of-turn tokens: no second turn is invented.",
    "Every object on the same model and options shares one engine and its batching.",
    "Embeddings run on a pooling engine next to the chat model, in the same process.",
    "A reranker scores query and document pairs on vLLM's pooling runner.",
    "Engines started together have their memory planned together, before any process spawns.",
    "An engine's processes stop when the application's process stops, however it stops.",
    "On a CPU the engine picks dtype, KV cache and eager mode itself unless you set them.",
    "Tool calls and reasoning are parsed by vLLM's own parsers as the answer streams.",
    "A LoRA adapter can be chosen per call on one base model.",
    "Images in chat messages reach vision-language models through vLLM's renderer.",
]
RETRIEVE = 8
"""Chunks taken from the vector store for each question."""
KEEP = 3
"""Chunks the reranker keeps for the answer."""
PROMPT = "Answer from this context:\n{context}\n\nQuestion: {question}"


def langchain_app(model: str, embedder: str, reranker: str) -> Any:
    """An LCEL chain: ``{"question", "sources", "answer"}``, the answer streamed."""
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnableLambda, RunnableParallel, RunnablePassthrough
    from langchain_core.vectorstores import InMemoryVectorStore

    from vllm_inline.integrations.langchain import ChatVLLM, VLLMEmbeddings, VLLMRerank

    llm = ChatVLLM(model=model, max_tokens=128)
    embeddings = VLLMEmbeddings(model=embedder)
    rerank = VLLMRerank(model=reranker, top_n=KEEP)
    start_engines(llm.engine, embeddings.engine, rerank.engine, progress=progress)

    store = InMemoryVectorStore(embeddings)
    store.add_texts(CHUNKS)
    retriever = store.as_retriever(search_kwargs={"k": RETRIEVE})
    sources = RunnableLambda(
        lambda question: rerank.compress_documents(retriever.invoke(question), question)
    )
    answer = (
        RunnableLambda(
            lambda x: {
                "context": "\n".join(d.page_content for d in x["sources"]),
                "question": x["question"],
            }
        )
        | ChatPromptTemplate.from_messages([("human", PROMPT)])
        | llm
        | StrOutputParser()
    )
    return RunnableParallel(question=RunnablePassthrough(), sources=sources).assign(answer=answer)


def llama_index_app(model: str, embedder: str, reranker: str) -> Any:
    """A streaming LlamaIndex query engine over a ``VectorStoreIndex``, reranked."""
    from llama_index.core import Document, PromptTemplate, VectorStoreIndex

    from vllm_inline.integrations.llama_index import VLLM, VLLMEmbedding, VLLMRerank

    llm = VLLM(model=model, max_tokens=128)
    embed_model = VLLMEmbedding(model=embedder)
    rerank = VLLMRerank(model=reranker, top_n=KEEP)
    start_engines(llm.engine, embed_model.engine, rerank.engine, progress=progress)

    index = VectorStoreIndex.from_documents(
        [Document(text=chunk) for chunk in CHUNKS], embed_model=embed_model
    )
    return index.as_query_engine(
        llm=llm,
        similarity_top_k=RETRIEVE,
        node_postprocessors=[rerank],
        streaming=True,
        text_qa_template=PromptTemplate(
            PROMPT.format(context="{context_str}", question="{query_str}")
        ),
    )


def ask(app: Any, framework: str, question: str) -> tuple[str, list[str]]:
    """Stream the answer to stdout, then its sources; returns both."""
    if framework == "langchain":
        answer, sources = "", []
        for chunk in app.stream(question):
            if "sources" in chunk:
                sources = [d.page_content for d in chunk["sources"]]
            if "answer" in chunk:
                answer += chunk["answer"]
                print(chunk["answer"], end="", flush=True)
    else:
        response = app.query(question)
        answer = ""
        for text in response.response_gen:
            answer += text
            print(text, end="", flush=True)
        sources = [n.node.get_content() for n in response.source_nodes]
    print()
    for source in sources:
        print(f"[source] {source}")
    return answer, sources


def progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(
    model: str | None = None,
    embedder: str | None = None,
    reranker: str | None = None,
    framework: str = "langchain",
    question: str = "How does streaming work?",
) -> tuple[str, list[str]]:
    from vllm_inline.testing import build_embedding_model, build_reranker_model

    model = resolve_model(model)
    embedder = embedder or str(build_embedding_model())
    reranker = reranker or str(build_reranker_model())
    build = langchain_app if framework == "langchain" else llama_index_app
    return ask(build(model, embedder, reranker), framework, question)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="chat model: hub id or local path (default: scripted)")
    parser.add_argument("--embedder", help="embedding model (default: scripted)")
    parser.add_argument("--reranker", help="cross-encoder reranker (default: scripted)")
    parser.add_argument("--framework", choices=["langchain", "llama-index"], default="langchain")
    parser.add_argument("--question", default="How does streaming work?")
    args = parser.parse_args()
    main(args.model, args.embedder, args.reranker, args.framework, args.question)
