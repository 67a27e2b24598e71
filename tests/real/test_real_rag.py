"""Retrieval-augmented answers end to end on real weights, in one process.

MiniLM embeds the documents and the question (a pooling engine), the retriever finds the one
document that holds the answer, and Gemma 3 (the README snippet: no ``vllm_kwargs``, the engine's
own CPU defaults) streams an answer from it: through LlamaIndex (``VectorStoreIndex`` and a
streaming query engine) and through LangChain (``InMemoryVectorStore`` retriever, a prompt,
``ChatVLLM``, a parser). The fact asked for is invented, so the model can only know it from the
retrieved document; Gemma 3 270M is a base model, so the answer is greedy and short.
"""

from __future__ import annotations

import contextlib

DOCS = [
    "The Eiffel Tower is a wrought-iron lattice tower in Paris.",
    "The keeper of the Skerrivore lighthouse is a woman named Ingrid Halvorsen.",
    "Photosynthesis turns sunlight, water and carbon dioxide into sugar.",
    "A sonnet is a poem of fourteen lines.",
]
QUESTION = "Who is the keeper of the Skerrivore lighthouse?"
ANSWER = "Ingrid"
MAX_TOKENS = 48
PROMPT = "Answer from this context:\n{context}\n\nQuestion: {question}"


def test_llama_index_streaming_query(gemma: str, minilm: str) -> None:
    from llama_index.core import Document, PromptTemplate, VectorStoreIndex

    from vllm_inline.integrations.llama_index import VLLM, VLLMEmbedding

    index = VectorStoreIndex.from_documents(
        [Document(text=t) for t in DOCS], embed_model=VLLMEmbedding(model=minilm)
    )
    query_engine = index.as_query_engine(
        llm=VLLM(model=gemma, temperature=0.0, max_tokens=MAX_TOKENS),
        similarity_top_k=1,
        streaming=True,
        # LlamaIndex's default prompt asks in a system turn; the base model then writes its
        # own question-and-answer list instead of answering. One plain user turn, as below.
        text_qa_template=PromptTemplate(
            PROMPT.format(context="{context_str}", question="{query_str}")
        ),
    )
    response = query_engine.query(QUESTION)
    assert [n.node.get_content() for n in response.source_nodes] == [DOCS[1]]
    pieces = [p for p in response.response_gen if p]
    assert len(pieces) > 1, "the answer did not stream"
    assert ANSWER in "".join(pieces), "".join(pieces)


def test_langchain_retriever_chain(gemma: str, minilm: str) -> None:
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnablePassthrough
    from langchain_core.vectorstores import InMemoryVectorStore

    from vllm_inline.integrations.langchain import ChatVLLM, VLLMEmbeddings

    store = InMemoryVectorStore(VLLMEmbeddings(model=minilm))
    store.add_texts(DOCS)
    retriever = store.as_retriever(search_kwargs={"k": 1})
    assert [d.page_content for d in retriever.invoke(QUESTION)] == [DOCS[1]]

    prompt = ChatPromptTemplate.from_messages([("human", PROMPT)])
    chain = (
        {
            "context": retriever | (lambda docs: "\n".join(d.page_content for d in docs)),
            "question": RunnablePassthrough(),
        }
        | prompt
        | ChatVLLM(model=gemma, temperature=0.0, max_tokens=MAX_TOKENS)
        | StrOutputParser()
    )
    pieces = [p for p in chain.stream(QUESTION) if p]
    assert len(pieces) > 1, "the answer did not stream"
    assert ANSWER in "".join(pieces), "".join(pieces)


def test_rag_app_example_on_real_checkpoints(gemma: str, minilm: str, capsys) -> None:
    """``examples/rag_app.py`` as a user copies it, on Gemma 3 and MiniLM with the test kit's
    reranker, started with no memory option (Gemma and MiniLM on the same options may already run for
    the tests above; engines started together get planned KV caches, as ``make test`` checks
    on scripted models): the answer streams with 3 sources from its chunks."""
    import importlib.util
    import sys
    from pathlib import Path

    from vllm_inline.engine import get_engine
    from vllm_inline.testing import build_reranker_model

    path = Path(__file__).resolve().parents[2] / "examples" / "rag_app.py"
    spec = importlib.util.spec_from_file_location("example_rag_app", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = example
    spec.loader.exec_module(example)
    for framework in ("langchain", "llama-index"):
        answer, sources = example.main(gemma, minilm, None, framework, "What does a reranker do?")
        assert answer.strip(), framework
        assert len(sources) == example.KEEP and set(sources) <= set(example.CHUNKS)
    out = capsys.readouterr().out
    assert out.count("[source] ") == 2 * example.KEEP
    # the three engines the example started, each on the options it passes: none
    for engine in (
        get_engine(gemma),
        get_engine(minilm, runner="pooling"),
        get_engine(str(build_reranker_model()), runner="pooling"),
    ):
        assert engine.started
        assert not {"gpu_memory_utilization", "kv_cache_memory_bytes"} & set(engine.vllm_kwargs)


_SCRIPT = """
import importlib.util, json, sys

if __name__ == "__main__":
    path, gemma, minilm = sys.argv[1:4]
    spec = importlib.util.spec_from_file_location("rag_app", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    answer, sources = example.main(gemma, minilm, None, "langchain", "What does a reranker do?")

    from vllm_inline.engine import get_engine
    from vllm_inline.testing import build_reranker_model

    engines = [get_engine(gemma), get_engine(minilm, runner="pooling"),
               get_engine(str(build_reranker_model()), runner="pooling")]
    print("RESULT", json.dumps({"answer": answer, "sources": sources, "chosen": [
        {c.name: c.reason for c in e.platform_defaults.chosen} for e in engines]}))
"""


def test_rag_app_plans_the_real_checkpoints_memory_in_a_process_of_its_own(
    gemma: str, minilm: str
) -> None:
    """The example as a user runs it, in a new process: none of its three engines runs yet, so
    ``start_engines`` plans their memory together on the real checkpoints (with no memory
    option: every KV cache is a planned share), and the answer comes from 3 of its chunks. The
    process's engines end with it (a test of ``atexit``'s shutdown); any left are killed."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from processes import clean_up, describe, process_tree, wait_gone

    path = Path(__file__).resolve().parents[2] / "examples" / "rag_app.py"
    child = subprocess.Popen(
        [sys.executable, "-c", _SCRIPT, str(path), gemma, minilm],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    tree: dict[int, object] = {}
    try:
        while child.poll() is None:  # the processes it starts, by pid, to clean up after
            with contextlib.suppress(Exception):  # it ended meanwhile
                tree.update({p.pid: p for p in process_tree(child.pid)})
            try:
                child.wait(0.5)
            except subprocess.TimeoutExpired:
                pass
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err[-3000:]
        result = json.loads(
            next(line for line in out.splitlines() if line.startswith("RESULT "))[len("RESULT ") :]
        )
        assert result["answer"].strip()
        assert len(result["sources"]) == 3
        for chosen in result["chosen"]:
            assert chosen["kv_cache_memory_bytes"].startswith("planned with 2 other engine(s)"), (
                chosen
            )
        # The engines end in the app's atexit; its fork server and multiprocessing's resource
        # tracker end when they see it gone, a moment after (one CI run caught one exiting).
        left, _, waited = wait_gone(list(tree.values()), set(), 10.0)
        assert not left, (waited, describe(left))
    finally:
        if child.poll() is None:
            child.kill()
        clean_up(list(tree.values()), ())
