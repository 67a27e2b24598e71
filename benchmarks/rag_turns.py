"""The RAG turn of ``benchmarks/rag.py``, on any side's clients: the corpus and questions,
the two apps (as ``examples/rag_app.py`` builds them), one turn, the c=1 and c=16 blocks, each
step of the LangChain turn timed alone (:func:`client_steps`), and the same steps on the engines
themselves (:func:`floor`)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from measure import RssSampler, percentile
from report import progress

RETRIEVE, KEEP, MAX_TOKENS, CONCURRENCY, CHUNKS = 8, 3, 32, 16, 1000
# Greedy on both sides; repetition_penalty because vllm-inline's default is 1.1, vLLM's 1.0.
SAMPLING = {"temperature": 0.0, "repetition_penalty": 1.0}
PROMPT = "Answer from this context:\n{context}\n\nQuestion: {question}"
FRAMEWORKS = ("langchain", "llama_index")
SIDES = ("one_process", "three_servers", "one_server")  # rag.py runs them in this order
_ADJ = ["red", "quiet", "old", "bright", "small", "heavy", "silver", "hidden"]
_NOUN = ["robot", "river", "lantern", "engine", "garden", "library", "tower", "harbor"]
_VERB = ["repairs", "paints", "guards", "measures", "carries", "cleans", "counts", "opens"]
_PLACE = ["Oslo", "Lisbon", "Kyoto", "Lima", "Cairo", "Quebec", "Perth", "Bergen"]


log = progress("rag")


def corpus(n: int = CHUNKS) -> list[str]:
    """``n`` distinct short chunks, the same on every run (word lists with co-prime strides)."""
    return [
        f"Record {i}: the {_ADJ[i % 8]} {_NOUN[i * 3 % 8]} {_VERB[i * 5 % 8]} the "
        f"{_NOUN[i * 7 % 8]} in {_PLACE[i // 8 % 8]} every {i % 24 + 1} days."
        for i in range(n)
    ]


def questions() -> Callable[[], str]:
    """The next question, each asked once (no turn is answered from another's cache); both
    sides ask the same ones in the same order."""
    return (
        (f"What does the {_ADJ[k % 8]} {_NOUN[k * 3 % 8]} do in {_PLACE[k // 8 % 8]}? ({k})")
        for k in itertools.count()
    ).__next__


# -- the two apps (examples/rag_app.py), on either side's clients -------------------------------


async def langchain_app(llm: Any, embeddings: Any, rerank: Callable, chunks: list[str]) -> Any:
    """The LCEL chain ``{"question", "sources", "answer"}`` over an indexed vector store."""
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnableLambda, RunnableParallel, RunnablePassthrough
    from langchain_core.vectorstores import InMemoryVectorStore

    store = InMemoryVectorStore(embeddings)
    await store.aadd_texts(chunks)
    retriever = store.as_retriever(search_kwargs={"k": RETRIEVE})

    async def sources(q: str) -> list[Any]:
        return await rerank(await retriever.ainvoke(q), q)

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
    return RunnableParallel(question=RunnablePassthrough(), sources=RunnableLambda(sources)).assign(
        answer=answer
    )


def llama_index_app(llm: Any, embed_model: Any, rerank: Any, chunks: list[str]) -> Any:
    """A streaming query engine over a ``VectorStoreIndex`` of ``chunks``, reranked."""
    from llama_index.core import Document, PromptTemplate, VectorStoreIndex

    index = VectorStoreIndex.from_documents(
        [Document(text=c) for c in chunks], embed_model=embed_model
    )
    # One prompt, the chunks cut to fit: LlamaIndex's default mode ("compact") keeps 500 tokens
    # free for the answer (its DEFAULT_RESPONSE_PADDING_SIZE), which a 512-token window lacks.
    return index.as_query_engine(
        llm=llm,
        similarity_top_k=RETRIEVE,
        node_postprocessors=[rerank],
        streaming=True,
        response_mode="simple_summarize",
        text_qa_template=PromptTemplate(
            PROMPT.format(context="{context_str}", question="{query_str}")
        ),
    )


def streams(chain: Any, query_engine: Any) -> dict[str, Callable[[str], AsyncIterator[str]]]:
    """Each framework's turn as an async iterator of answer text, on its async API."""

    async def lc(q: str) -> AsyncIterator[str]:
        async for chunk in chain.astream(q):
            if chunk.get("answer"):
                yield chunk["answer"]

    async def li(q: str) -> AsyncIterator[str]:
        async for text in (await query_engine.aquery(q)).async_response_gen():
            if text:
                yield text

    return {"langchain": lc, "llama_index": li}


# -- measuring turns ---------------------------------------------------------------------------


async def turn(stream: Callable[[str], AsyncIterator[str]], q: str) -> dict[str, float]:
    """One turn: ms to the first answer text (an empty answer counts its end), ms to its end,
    this process's CPU ms meanwhile (meaningful at c=1 only), the answer's characters."""
    cpu0, t0, first, chars = time.process_time(), time.perf_counter(), None, 0
    async for text in stream(q):
        first = first or time.perf_counter()
        chars += len(text)
    end = time.perf_counter()
    return {
        "ttft_ms": ((first or end) - t0) * 1e3,
        "turn_ms": (end - t0) * 1e3,
        "chars": chars,
        "cpu_ms": (time.process_time() - cpu0) * 1e3,
    }


_KINDS = (  # a marker in the command line, the kind of process
    ("EngineCore", "engine cores"),
    ("VLLM::Worker", "workers"),
    ("api_server", "servers"),
    ("vllm_inline serve", "servers"),
)


def cpu_by_process() -> dict[int, tuple[str, float]]:
    """CPU seconds so far of this process and of each live descendant, by pid, with its kind:
    ``client`` (this process: on the one-process side with the engines' front ends),
    ``servers`` (vLLM's API servers, ``vllm_inline serve``), ``engine cores``, ``workers``,
    ``other`` (multiprocessing's fork server and resource tracker)."""
    import psutil

    me, out = psutil.Process(), {}
    for p in [me, *me.children(recursive=True)]:
        try:
            cmd, t = " ".join(p.cmdline()), p.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        kinds = [kind for marker, kind in _KINDS if marker in cmd]
        out[p.pid] = ("client" if p is me else (kinds or ["other"])[0], t.user + t.system)
    return out


def cpu_split(before: dict, after: dict, turns: int) -> dict[str, float]:
    """CPU ms per turn of each kind of process between two :func:`cpu_by_process` readings (a
    process that started meanwhile counts whole; one that ended meanwhile is lost)."""
    split: dict[str, float] = {}
    for pid, (kind, cpu) in after.items():
        start = before[pid][1] if pid in before else 0.0
        split[kind] = split.get(kind, 0.0) + (cpu - start) * 1e3 / turns
    return dict(sorted(split.items()))


async def at_concurrency(stream: Callable, qs: list[str]) -> dict[str, Any]:
    """All of ``qs`` through ``CONCURRENCY`` tasks: turns/s, CPU per turn (the client's, and
    every process of the side's by kind), peak RSS, final PSS."""
    pending, records = iter(qs), []

    async def user() -> None:
        for q in pending:  # one shared iterator: a task takes the next question when free
            records.append(await turn(stream, q))

    with RssSampler() as rss:
        cpu0, t0 = cpu_by_process(), time.perf_counter()
        await asyncio.gather(*(user() for _ in range(CONCURRENCY)))
        wall, cpu1 = time.perf_counter() - t0, cpu_by_process()
    return {
        "cpu_ms_per_turn_by_process": cpu_split(cpu0, cpu1, len(records)),
        "turns": len(records),
        "wall_s": wall,
        "turns_s": len(records) / wall,
        "cpu_ms_per_turn": rss.cpu_s * 1e3 / len(records),
        "peak_rss_mib": rss.peak_mib,
        "pss_mib": rss.pss_mib,
        "ttft_p50_ms": percentile([r["ttft_ms"] for r in records], 50),
    }


async def measure(apps: dict[str, Callable], cfg: dict, ask: Callable[[], str]) -> dict:
    """Warm-up, c=1 turns (the frameworks alternating, so drift hits both alike), then a c=16
    block per framework."""
    for name in FRAMEWORKS * 2:  # lazy imports, first kernels, connection pools
        await turn(apps[name], ask())
    c1: dict[str, list] = {name: [] for name in FRAMEWORKS}
    for i in range(cfg["turns"]):
        for name in FRAMEWORKS[:: 1 if i % 2 == 0 else -1]:
            c1[name].append(await turn(apps[name], ask()))
    log(f"  c=1 done ({cfg['turns']} turns each); c={CONCURRENCY}: {cfg['c16_turns']} each")
    out = {}
    for name, recs in c1.items():
        col = {k: [r[k] for r in recs] for k in recs[0]}
        qs = [ask() for _ in range(cfg["c16_turns"])]
        out[name] = {
            "c1": recs,
            "ttft_p50_ms": percentile(col["ttft_ms"], 50),
            "ttft_p90_ms": percentile(col["ttft_ms"], 90),
            "turn_p50_ms": percentile(col["turn_ms"], 50),
            "cpu_ms_per_turn_c1": sum(col["cpu_ms"]) / len(recs),
            "answer_chars": sum(col["chars"]) / len(recs),
            "c16": await at_concurrency(apps[name], qs),
        }
    return out


async def both_apps(
    side: str, t0: float, lc_parts: tuple, li_parts: tuple, cfg: dict, ask: Callable[[], str]
) -> dict[str, Any]:
    """Index the corpus for LangChain and ask its first question (the cold start, counted from
    ``t0``, ends at that answer's first token); index for LlamaIndex; then :func:`measure` and
    :func:`client_steps`."""
    chunks, t = corpus(), time.perf_counter()
    chain = await langchain_app(*lc_parts, chunks)
    index_lc, t = time.perf_counter() - t, time.perf_counter()
    cold = t - t0 + (await turn(streams(chain, None)["langchain"], ask()))["ttft_ms"] / 1e3
    log(f"{side}: cold start to the first token {cold:.1f} s")
    t = time.perf_counter()
    query_engine = await asyncio.to_thread(llama_index_app, *li_parts, chunks)  # a sync API
    index = {"langchain": index_lc, "llama_index": time.perf_counter() - t}
    frameworks = await measure(streams(chain, query_engine), cfg, ask)
    return {
        "cold_start_s": cold,
        "index_s": index,
        "frameworks": frameworks,
        "steps_p50_ms": await client_steps(*lc_parts, chunks, cfg["turns"], ask),
    }


# -- the HTTP sides' rerank client (no package ships one) --------------------------------


async def server_rerank(client: Any, model: str, query: str, texts: list[str]) -> list[int]:
    """The indices of the ``KEEP`` best ``texts``, best first, from vLLM's ``/rerank``."""
    r = await client.post(
        "/rerank", json={"model": model, "query": query, "documents": texts, "top_n": KEEP}
    )
    r.raise_for_status()
    return [
        x["index"] for x in sorted(r.json()["results"], key=lambda x: -x["relevance_score"])[:KEEP]
    ]


def http_postprocessor(client: Any, model: str) -> Any:
    """A LlamaIndex node postprocessor on vLLM's ``/rerank`` (no package ships one)."""
    from llama_index.core.postprocessor.types import BaseNodePostprocessor

    class VLLMServerRerank(BaseNodePostprocessor):
        def _postprocess_nodes(self, nodes: list, query_bundle: Any = None) -> list:
            raise NotImplementedError("the benchmark runs the async query path only")

        async def _apostprocess_nodes(self, nodes: list, query_bundle: Any = None) -> list:
            texts = [n.node.get_content() for n in nodes]
            return [
                nodes[i] for i in await server_rerank(client, model, query_bundle.query_str, texts)
            ]

    return VLLMServerRerank()


# -- each step alone -------------------------------------------------------------------------


CLIENT_STEPS = ("embed", "retrieve", "rerank", "answer_ttft")


async def client_steps(
    llm: Any,
    embeddings: Any,
    rerank: Callable,
    chunks: list[str],
    turns: int,
    ask: Callable[[], str],
) -> dict[str, float]:
    """Each step of the LangChain turn through this side's clients, timed alone (p50 of
    ``turns``, ms): ``aembed_query``, the vector store's top 8 for that vector, the rerank, the
    answer's first token from ``llm.astream``. Against the floor (the engines alone) they say
    what each client and hop adds; their sum against the chain's TTFT, what LCEL adds."""
    from langchain_core.messages import HumanMessage
    from langchain_core.vectorstores import InMemoryVectorStore

    store = InMemoryVectorStore(embeddings)
    await store.aadd_texts(chunks)
    times: dict[str, list[float]] = {k: [] for k in CLIENT_STEPS}
    for _ in range(turns):
        q, t0 = ask(), time.perf_counter()
        vector = await embeddings.aembed_query(q)
        t1 = time.perf_counter()
        docs = await store.asimilarity_search_by_vector(vector, k=RETRIEVE)
        t2 = time.perf_counter()
        best = await rerank(docs, q)
        t3 = time.perf_counter()
        prompt = PROMPT.format(context="\n".join(d.page_content for d in best), question=q)
        first = None
        async for chunk in llm.astream([HumanMessage(prompt)]):  # to the end, as a turn does
            first = first or (time.perf_counter() if chunk.content else None)
        t4 = first or time.perf_counter()
        for key, (a, b) in zip(CLIENT_STEPS, ((t0, t1), (t1, t2), (t2, t3), (t3, t4))):
            times[key].append((b - a) * 1e3)
    return {k: percentile(v, 50) for k, v in times.items()}


# -- the floor: the engines alone ------------------------------------------------------------


_raw_ids = itertools.count()
STEPS = ("embed", "search", "score", "raw_ttft", "engine_ttft")
FLOOR_OF = dict(zip(CLIENT_STEPS, STEPS))  # each client step and its floor


async def raw_first_token(llm: Any, prompt_ids: list[int]) -> float:
    """ms to the first text of raw ``AsyncLLM.generate`` (DELTA); run on the engine's loop."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(max_tokens=MAX_TOKENS, output_kind=RequestOutputKind.DELTA, **SAMPLING)
    t0, first, request_id = time.perf_counter(), None, f"rag-raw-{next(_raw_ids)}"
    async for out in llm.generate({"prompt_token_ids": prompt_ids}, params, request_id):
        if first is None and any(c.text for c in out.outputs):
            first = time.perf_counter()
    return ((first or time.perf_counter()) - t0) * 1e3


async def floor(engines: tuple, chunks: list[str], turns: int, ask: Callable[[], str]) -> dict:
    """Each step of a turn on the engines themselves, ``turns`` times: ``Engine.aembed`` of the
    question, a numpy top-8 over the corpus vectors, ``Engine.ascore`` of the 8, the first token
    of raw ``AsyncLLM.generate`` (prompt pre-rendered) and of ``Engine.astream``."""
    import numpy as np

    chat, emb, rerank = engines
    t = time.perf_counter()
    vectors = np.asarray(await emb.aembed(chunks), dtype=np.float32)
    index_s = time.perf_counter() - t
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    steps: dict[str, list[float]] = {k: [] for k in STEPS}
    prompt_tokens = 0
    for _ in range(turns):
        q, t0 = ask(), time.perf_counter()
        qv = np.asarray((await emb.aembed([q]))[0], dtype=np.float32)
        t1 = time.perf_counter()
        docs = [chunks[i] for i in np.argsort(-(vectors @ (qv / np.linalg.norm(qv))))[:RETRIEVE]]
        t2 = time.perf_counter()
        scores = await rerank.ascore(q, docs)
        t3 = time.perf_counter()
        best = [docs[i] for i in np.argsort(scores)[::-1][:KEEP]]
        messages = [{"role": "user", "content": PROMPT.format(context="\n".join(best), question=q)}]
        ids = await chat.aprompt_token_ids(messages)  # not timed: the raw path gets ids
        prompt_tokens, rt = max(prompt_tokens, len(ids)), chat.runtime
        raw = await asyncio.wrap_future(rt.loop.submit(raw_first_token(rt.llm, ids)))
        t4, first = time.perf_counter(), None
        async for delta in chat.astream(messages, max_tokens=MAX_TOKENS, **SAMPLING):
            first = first or (time.perf_counter() if delta.text else None)
        engine_ms = ((first or time.perf_counter()) - t4) * 1e3
        for key, ms in zip(
            STEPS, ((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3, raw, engine_ms)
        ):
            steps[key].append(ms)
    if prompt_tokens > chat.max_model_len - MAX_TOKENS:
        raise AssertionError(f"a prompt of {prompt_tokens} tokens leaves no room for the answer")
    p50 = {k: percentile(v, 50) for k, v in steps.items()}
    return {
        "steps_ms": steps,
        "p50_ms": p50,
        "index_s": index_s,
        "max_prompt_tokens": prompt_tokens,
        "turn_ttft_ms": p50["embed"] + p50["search"] + p50["score"] + p50["raw_ttft"],
    }
