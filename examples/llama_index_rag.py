"""A LlamaIndex RAG query engine streaming its answer, on vLLM in this process.

    python examples/llama_index_rag.py                           # embedded scripted model
    python examples/llama_index_rag.py --model Qwen/Qwen3-0.6B

Retrieval here is LlamaIndex's keyword table, which needs no embedding model (so nothing is
downloaded); with an embedding model installed, ``VectorStoreIndex`` works the same way.
"""

from __future__ import annotations

import argparse

from llama_index.core import Document, SimpleKeywordTableIndex

from vllm_inline.commands.console import resolve_model
from vllm_inline.integrations.llama_index import VLLM

DOCUMENTS = [
    (
        "vllm-inline runs the vLLM engine inside the Python process of the application. "
        "There is no HTTP server and no network hop between the framework and the engine."
    ),
    (
        "Streaming: each token vLLM generates reaches the LangChain or LlamaIndex stream as "
        "soon as it is decoded."
    ),
    (
        "Stop tokens: the engine stops at the end-of-turn tokens of the model family, so no "
        "second turn is ever invented."
    ),
]


def main(model: str | None = None, question: str = "How does streaming work?"):
    llm = VLLM(model=resolve_model(model), max_tokens=128)
    index = SimpleKeywordTableIndex.from_documents([Document(text=t) for t in DOCUMENTS], llm=llm)
    # "simple_summarize" puts the retrieved text into one prompt; the default ("compact")
    # reserves 500 tokens of padding, more than the embedded model's 512-token window allows.
    query_engine = index.as_query_engine(
        llm=llm, streaming=True, response_mode="simple_summarize", similarity_top_k=1
    )

    response = query_engine.query(question)
    for text in response.response_gen:
        print(text, end="", flush=True)
    print()
    for node in response.source_nodes:
        print(f"[source] {node.get_content()[:70]}...")
    return response


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="hub id or local path (default: embedded demo model)")
    parser.add_argument("--question", default="How does streaming work?")
    args = parser.parse_args()
    main(args.model, args.question)
