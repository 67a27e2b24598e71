"""A RAG turn in one process against three vLLM servers, side by side in one run.

A turn: embed the question, take the top 8 of 1,000 chunks from an in-memory vector store,
rerank them to 3, stream the answer (max_tokens=32, greedy). Two sides, the same models and
engine options (``vllm_inline.testing.CPU_TEST_ENGINE_KWARGS``; flags for the servers):

- **one process**: ``VLLMEmbeddings`` + ``VLLMRerank`` + ``ChatVLLM`` in an LCEL chain over
  ``InMemoryVectorStore``; LlamaIndex ``VLLMEmbedding`` + ``VLLMRerank`` + ``VLLM`` in a
  streaming ``VectorStoreIndex`` query engine; the three engines started by ``start_engines``.
- **three servers**: ``python -m vllm.entrypoints.openai.api_server`` for the chat model, the
  embedder and the reranker (``--runner pooling``), launched in parallel; ``ChatOpenAI``
  (streaming, ``stream_usage``) + ``OpenAIEmbeddings``, ``OpenAILike`` + ``OpenAILikeEmbedding``,
  and ``/rerank`` through one kept-alive ``httpx.AsyncClient``.

Each side runs in a child process of its own, one after the other, so each client's CPU and
memory are its own. Figures: time to the first answer token from the start of the turn (c=1,
p50/p90); turns/s with 16 asyncio tasks on the async APIs; client CPU per turn (that process
alone); peak RSS of the side's processes (it and its descendants: engine cores and workers, or
the three server trees); cold start (from before ``start_engines``, or the servers' launch, to
the first token of the LangChain app's first answer, indexing included; servers' readiness by
polling ``/health``). The floor: each step timed on the one-process engines (``Engine.aembed``,
a numpy top-8, ``Engine.ascore``, raw ``AsyncLLM.generate``'s first token), summed.

    python benchmarks/rag.py --quick            # tiny tier, 8 and 16 turns: a smoke run
    python benchmarks/rag.py --tier real        # Gemma 3 270M + all-MiniLM-L6-v2
    make bench RAG_ARGS="--tier tiny"

Prints a markdown table per tier (progress on stderr); writes benchmarks/results/rag-<tier>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run  # noqa: E402  (sets VLLM_LOGGING_LEVEL before vLLM loads; keeps USER_ENV)
from measure import RssSampler, percentile  # noqa: E402

from vllm_inline.testing import CPU_TEST_ENGINE_KWARGS  # noqa: E402

RETRIEVE, KEEP, MAX_TOKENS, CONCURRENCY, CHUNKS = 8, 3, 32, 16, 1000
# Greedy on both sides; repetition_penalty because vllm-inline's default is 1.1, vLLM's 1.0.
SAMPLING = {"temperature": 0.0, "repetition_penalty": 1.0}
PROMPT = "Answer from this context:\n{context}\n\nQuestion: {question}"
FRAMEWORKS, SIDES = ("langchain", "llama_index"), ("one_process", "three_servers")
_ADJ = "red quiet old bright small heavy silver hidden".split()
_NOUN = "robot river lantern engine garden library tower harbor".split()
_VERB = "repairs paints guards measures carries cleans counts opens".split()
_PLACE = "Oslo Lisbon Kyoto Lima Cairo Quebec Perth Bergen".split()


def log(msg: str) -> None:
    print(f"[rag {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def corpus(n: int = CHUNKS) -> list[str]:
    """``n`` distinct short chunks, the same on every run (word lists with co-prime strides)."""
    return [f"Record {i}: the {_ADJ[i % 8]} {_NOUN[i * 3 % 8]} {_VERB[i * 5 % 8]} the "
            f"{_NOUN[i * 7 % 8]} in {_PLACE[i // 8 % 8]} every {i % 24 + 1} days."
            for i in range(n)]


def questions() -> Callable[[], str]:
    """The next question, each asked once (no turn is answered from another's cache); both
    sides ask the same ones in the same order."""
    return map(lambda k: f"What does the {_ADJ[k % 8]} {_NOUN[k * 3 % 8]} do in "
               f"{_PLACE[k // 8 % 8]}? ({k})", itertools.count()).__next__


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
        RunnableLambda(lambda x: {"context": "\n".join(d.page_content for d in x["sources"]),
                                  "question": x["question"]})
        | ChatPromptTemplate.from_messages([("human", PROMPT)]) | llm | StrOutputParser()
    )
    return RunnableParallel(question=RunnablePassthrough(),
                            sources=RunnableLambda(sources)).assign(answer=answer)


def llama_index_app(llm: Any, embed_model: Any, rerank: Any, chunks: list[str]) -> Any:
    """A streaming query engine over a ``VectorStoreIndex`` of ``chunks``, reranked."""
    from llama_index.core import Document, PromptTemplate, VectorStoreIndex

    index = VectorStoreIndex.from_documents([Document(text=c) for c in chunks],
                                            embed_model=embed_model)
    # One prompt, the chunks cut to fit: LlamaIndex's default mode ("compact") keeps 500 tokens
    # free for the answer (its DEFAULT_RESPONSE_PADDING_SIZE), which a 512-token window lacks.
    return index.as_query_engine(
        llm=llm, similarity_top_k=RETRIEVE, node_postprocessors=[rerank], streaming=True,
        response_mode="simple_summarize",
        text_qa_template=PromptTemplate(PROMPT.format(context="{context_str}",
                                                      question="{query_str}")))


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
    return {"ttft_ms": ((first or end) - t0) * 1e3, "turn_ms": (end - t0) * 1e3, "chars": chars,
            "cpu_ms": (time.process_time() - cpu0) * 1e3}


async def at_concurrency(stream: Callable, qs: list[str]) -> dict[str, Any]:
    """All of ``qs`` through ``CONCURRENCY`` tasks: turns/s, CPU per turn, peak RSS."""
    pending, records = iter(qs), []

    async def user() -> None:
        for q in pending:  # one shared iterator: a task takes the next question when free
            records.append(await turn(stream, q))

    with RssSampler() as rss:
        t0 = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(CONCURRENCY)))
        wall = time.perf_counter() - t0
    return {"turns": len(records), "wall_s": wall, "turns_s": len(records) / wall,
            "cpu_ms_per_turn": rss.cpu_s * 1e3 / len(records), "peak_rss_mib": rss.peak_mib,
            "ttft_p50_ms": percentile([r["ttft_ms"] for r in records], 50)}


async def measure(apps: dict[str, Callable], cfg: dict, ask: Callable[[], str]) -> dict:
    """Warm-up, c=1 turns (the frameworks alternating, so drift hits both alike), then a c=16
    block per framework."""
    for name in FRAMEWORKS * 2:  # lazy imports, first kernels, connection pools
        await turn(apps[name], ask())
    c1: dict[str, list] = {name: [] for name in FRAMEWORKS}
    for i in range(cfg["turns"]):
        for name in FRAMEWORKS[::1 if i % 2 == 0 else -1]:
            c1[name].append(await turn(apps[name], ask()))
    log(f"  c=1 done ({cfg['turns']} turns each); c={CONCURRENCY}: {cfg['c16_turns']} each")
    out = {}
    for name, recs in c1.items():
        col = {k: [r[k] for r in recs] for k in recs[0]}
        qs = [ask() for _ in range(cfg["c16_turns"])]
        out[name] = {"c1": recs, "ttft_p50_ms": percentile(col["ttft_ms"], 50),
                     "ttft_p90_ms": percentile(col["ttft_ms"], 90),
                     "turn_p50_ms": percentile(col["turn_ms"], 50),
                     "cpu_ms_per_turn_c1": sum(col["cpu_ms"]) / len(recs),
                     "answer_chars": sum(col["chars"]) / len(recs),
                     "c16": await at_concurrency(apps[name], qs)}
    return out


async def both_apps(side: str, t0: float, lc_parts: tuple, li_parts: tuple, cfg: dict,
                    ask: Callable[[], str]) -> dict[str, Any]:
    """Index the corpus for LangChain and ask its first question (the cold start, counted from
    ``t0``, ends at that answer's first token); index for LlamaIndex; then :func:`measure`."""
    chunks, t = corpus(), time.perf_counter()
    chain = await langchain_app(*lc_parts, chunks)
    index_lc, t = time.perf_counter() - t, time.perf_counter()
    cold = t - t0 + (await turn(streams(chain, None)["langchain"], ask()))["ttft_ms"] / 1e3
    log(f"{side}: cold start to the first token {cold:.1f} s")
    t = time.perf_counter()
    query_engine = await asyncio.to_thread(llama_index_app, *li_parts, chunks)  # a sync API
    index = {"langchain": index_lc, "llama_index": time.perf_counter() - t}
    return {"cold_start_s": cold, "index_s": index,
            "frameworks": await measure(streams(chain, query_engine), cfg, ask)}


# -- side 1: one process --------------------------------------------------------------------------


def one_process(cfg: dict[str, Any]) -> dict[str, Any]:
    """Both apps on three engines in this process; then the floor on the same engines."""
    from vllm_inline.engine import shutdown_engines, start_engines
    from vllm_inline.integrations import langchain as lc
    from vllm_inline.integrations import llama_index as li

    m, kw = cfg["models"], {"vllm_kwargs": dict(CPU_TEST_ENGINE_KWARGS)}
    chat = lc.ChatVLLM(model=m["chat"], max_tokens=MAX_TOKENS, **SAMPLING, **kw)
    emb, rerank = lc.VLLMEmbeddings(model=m["embedder"], **kw), lc.VLLMRerank(
        model=m["reranker"], top_n=KEEP, **kw)
    li_parts = (li.VLLM(model=m["chat"], max_tokens=MAX_TOKENS, **SAMPLING, **kw),
                li.VLLMEmbedding(model=m["embedder"], **kw),
                li.VLLMRerank(model=m["reranker"], top_n=KEEP, **kw))
    engines = (chat.engine, emb.engine, rerank.engine)
    assert tuple(x.engine for x in li_parts) == engines, "the frameworks must share the engines"
    ask = questions()

    async def main(t0: float) -> dict[str, Any]:
        result = await both_apps("one process", t0, (chat, emb, rerank.acompress_documents),
                                 li_parts, cfg, ask)
        return {**result, "floor": await floor(engines, corpus(), cfg["turns"], ask)}

    try:
        t0 = time.perf_counter()
        start_engines(*engines, progress=log)
        return asyncio.run(main(t0))
    finally:
        shutdown_engines(*engines)


_raw_ids = itertools.count()
STEPS = ("embed", "search", "score", "raw_ttft", "engine_ttft")


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
        for key, ms in zip(STEPS, ((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3, raw,
                                   engine_ms)):
            steps[key].append(ms)
    if prompt_tokens > chat.max_model_len - MAX_TOKENS:
        raise AssertionError(f"a prompt of {prompt_tokens} tokens leaves no room for the answer")
    p50 = {k: percentile(v, 50) for k, v in steps.items()}
    return {"steps_ms": steps, "p50_ms": p50, "index_s": index_s, "max_prompt_tokens":
            prompt_tokens, "turn_ttft_ms": p50["embed"] + p50["search"] + p50["score"]
            + p50["raw_ttft"]}


# -- side 2: three servers ------------------------------------------------------------------------


async def server_rerank(client: Any, model: str, query: str, texts: list[str]) -> list[int]:
    """The indices of the ``KEEP`` best ``texts``, best first, from vLLM's ``/rerank``."""
    r = await client.post("/rerank", json={"model": model, "query": query, "documents": texts,
                                           "top_n": KEEP})
    r.raise_for_status()
    return [x["index"] for x in sorted(r.json()["results"],
                                       key=lambda x: -x["relevance_score"])[:KEEP]]


def http_postprocessor(client: Any, model: str) -> Any:
    """A LlamaIndex node postprocessor on vLLM's ``/rerank`` (no package ships one)."""
    from llama_index.core.postprocessor.types import BaseNodePostprocessor

    class VLLMServerRerank(BaseNodePostprocessor):
        def _postprocess_nodes(self, nodes: list, query_bundle: Any = None) -> list:
            raise NotImplementedError("the benchmark runs the async query path only")

        async def _apostprocess_nodes(self, nodes: list, query_bundle: Any = None) -> list:
            texts = [n.node.get_content() for n in nodes]
            return [nodes[i] for i in await server_rerank(client, model, query_bundle.query_str,
                                                          texts)]

    return VLLMServerRerank()


def three_servers(cfg: dict[str, Any]) -> dict[str, Any]:
    """Three vLLM servers launched at once; both apps on their OpenAI-compatible clients."""
    out, pooling = pathlib.Path(cfg["out"]), ["--runner", "pooling"]
    flags = {"chat": cfg["chat_flags"], "embedder": pooling, "reranker": pooling}
    ports, procs = {role: run.free_port() for role in flags}, {}
    t0 = time.perf_counter()
    try:
        for role, extra in flags.items():
            procs[role] = run.start_server(cfg["models"][role], ports[role],
                                           dict(CPU_TEST_ENGINE_KWARGS),
                                           out / f"rag-server-{cfg['tier']}-{role}.log.tmp", extra)
        log(f"three servers: launched, ports {ports} (logs: {out}/rag-server-*.log.tmp)")
        return asyncio.run(servers_main(cfg, ports, procs, t0))
    finally:
        for proc in procs.values():
            run.stop_server(proc)


async def servers_main(cfg: dict, ports: dict, procs: dict, t0: float) -> dict[str, Any]:
    """Wait for the three servers' ``/health``, then :func:`both_apps` on their clients."""
    import httpx
    from langchain_openai import ChatOpenAI, OpenAIEmbeddings
    from llama_index.embeddings.openai_like import OpenAILikeEmbedding
    from llama_index.llms.openai_like import OpenAILike

    for role, proc in procs.items():  # launched together: the last one to be ready counts
        await asyncio.to_thread(run.wait_healthy, f"http://127.0.0.1:{ports[role]}/health",
                                proc, 900, 0.1)
    url = {role: f"http://127.0.0.1:{port}/v1" for role, port in ports.items()}
    m = cfg["models"]
    # Greedy as the other side, and the end-of-turn ids the engine stops at: the servers stop
    # only at generation_config's eos otherwise (Gemma 3 270M's lists <eos> alone).
    body = {"repetition_penalty": SAMPLING["repetition_penalty"],
            "stop_token_ids": cfg["stop_token_ids"]}
    common = {"api_key": "EMPTY", "max_retries": 0, "timeout": 300}
    sampling = {"max_tokens": MAX_TOKENS, "temperature": SAMPLING["temperature"]}
    chat = ChatOpenAI(model=m["chat"], base_url=url["chat"], streaming=True, stream_usage=True,
                      extra_body=body, **sampling, **common)
    emb = OpenAIEmbeddings(model=m["embedder"], base_url=url["embedder"],
                           check_embedding_ctx_length=False, **common)
    li_llm = OpenAILike(model=m["chat"], api_base=url["chat"], is_chat_model=True,
                        context_window=CPU_TEST_ENGINE_KWARGS["max_model_len"],
                        additional_kwargs={"extra_body": body}, **sampling, **common)
    li_emb = OpenAILikeEmbedding(model_name=m["embedder"], api_base=url["embedder"], **common)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{ports['reranker']}",
                                 timeout=300) as client:  # one client, kept alive: its pool

        async def rerank(docs: list[Any], q: str) -> list[Any]:
            texts = [d.page_content for d in docs]
            return [docs[i] for i in await server_rerank(client, m["reranker"], q, texts)]

        li_parts = (li_llm, li_emb, http_postprocessor(client, m["reranker"]))
        return await both_apps("three servers", t0, (chat, emb, rerank), li_parts, cfg,
                               questions())


# -- the parent: models, one child per side, the table ------------------------------------------


def build_models(tier: str) -> dict[str, str]:
    """The tier's chat model, embedder and reranker directories (built once, then cached)."""
    from vllm_inline.testing import build_embedding_model, build_reranker_model
    from vllm_inline.testing import build_scripted_model

    if tier == "tiny":
        chat, embedder = build_scripted_model("demo"), build_embedding_model()
    else:
        sys.path.insert(0, str(HERE.parent / "tests" / "real"))
        from checkpoints import cache_root, gemma_dir, minilm_dir

        chat, embedder = gemma_dir(cache_root()), minilm_dir(cache_root())
    return {"chat": str(chat), "embedder": str(embedder), "reranker": str(build_reranker_model())}


def chat_setup(model: str, scratch: pathlib.Path) -> tuple[list[str], list[int]]:
    """What vLLM's docs say a server needs for this chat model: ``--chat-template`` when its
    tokenizer has none (the family template vllm-inline falls back to); and the family's
    end-of-turn ids (vllm-inline stops at them) for the clients to send as stop_token_ids."""
    from transformers import AutoTokenizer

    from vllm_inline.engine.templates import detect_family

    tok = AutoTokenizer.from_pretrained(model)
    vocab = tok.get_vocab()
    family, flags = detect_family(vocab), []
    if tok.chat_template is None and family is not None:
        (scratch / "chat_template.jinja").write_text(family.template)
        flags = ["--chat-template", str(scratch / "chat_template.jinja")]
    return flags, [vocab[t] for t in (family.end_of_turn if family else ()) if t in vocab]


def run_side(side: str, cfg: dict[str, Any], scratch: pathlib.Path) -> dict[str, Any]:
    """Run one side in a child process (its own process group, this session: see
    ``run.start_server``); on an error or Ctrl-C stop it, by its pid."""
    cfg_path, result_path = scratch / f"{side}.json", scratch / f"{side}-result.json"
    cfg_path.write_text(json.dumps({**cfg, "result": str(result_path)}))
    child = subprocess.Popen([sys.executable, __file__, "--side", side, "--config", str(cfg_path)],
                             stdout=sys.stderr, process_group=0, env=run.USER_ENV)
    try:
        if child.wait() != 0:
            raise RuntimeError(f"the {side} side failed (exit {child.returncode}): see stderr")
    finally:  # SIGINT, then SIGTERM: the child cleans up on either (child_main); then SIGKILL
        for sig, grace in ((signal.SIGINT, 120), (signal.SIGTERM, 60), (signal.SIGKILL, None)):
            if child.poll() is not None:
                break
            (os.killpg if sig == signal.SIGKILL else os.kill)(child.pid, sig)
            try:
                child.wait(grace)
            except subprocess.TimeoutExpired:
                pass
    return json.loads(result_path.read_text())


ROWS = (  # label, key in a framework's figures ("c16.x": at c=16; "side.x": the side's), format
    ("answer TTFT p50, c=1 (ms)", "ttft_p50_ms", ".1f"),
    ("answer TTFT p90, c=1 (ms)", "ttft_p90_ms", ".1f"),
    ("turn p50, c=1 (ms)", "turn_p50_ms", ".1f"),
    (f"turns/s, c={CONCURRENCY}", "c16.turns_s", ".2f"),
    (f"answer TTFT p50, c={CONCURRENCY} (ms)", "c16.ttft_p50_ms", ".0f"),
    ("client CPU per turn, c=1 (ms)", "cpu_ms_per_turn_c1", ".1f"),
    (f"client CPU per turn, c={CONCURRENCY} (ms)", "c16.cpu_ms_per_turn", ".1f"),
    (f"peak RSS, all processes of the side, c={CONCURRENCY} (MiB)", "c16.peak_rss_mib", ".0f"),
    ("cold start to first token (s; LangChain app)", "side.cold_start_s", ".1f"),
    (f"index {CHUNKS:,} chunks (s)", "side.index_s", ".2f"),
    ("answer characters per turn, c=1", "answer_chars", ".0f"),
)


def figure(res: dict[str, Any], side: str, fw: str, key: str) -> float | None:
    """One cell of :data:`ROWS` (the cold start is the LangChain app's alone)."""
    if key.startswith("side."):
        value = res[side][key[5:]]
        return value.get(fw) if isinstance(value, dict) else value if fw == "langchain" else None
    value = res[side]["frameworks"][fw]
    for part in key.split("."):
        value = value[part]
    return value


def table(tier: str, res: dict[str, Any], cfg: dict[str, Any]) -> str:
    """The markdown table, then the floor lines."""
    m, fl = cfg["models"], res["one_process"]["floor"]
    out = [f"\n== {tier}: chat {m['chat']}, embedder {m['embedder']}, reranker {m['reranker']}; "
           f"{cfg['turns']} turns at c=1, {cfg['c16_turns']} at c={CONCURRENCY}, top {RETRIEVE} "
           f"of {CHUNKS:,} -> {KEEP}, max_tokens={MAX_TOKENS} ==\n",
           "| figure | one process (LangChain) | one process (LlamaIndex) | three servers "
           "(LangChain) | three servers (LlamaIndex) | ratio (one process / three servers): "
           "LangChain, LlamaIndex |", "|---|---|---|---|---|---|"]
    for label, key, fmt in ROWS:
        v = {(s, fw): figure(res, s, fw, key) for s in SIDES for fw in FRAMEWORKS}
        cells = ["-" if x is None else format(x, fmt) for x in v.values()]
        ratios = [f"{a / b:.2f}" if a and b else "-"
                  for a, b in ((v[SIDES[0], fw], v[SIDES[1], fw]) for fw in FRAMEWORKS)]
        out.append(f"| {label} | {' | '.join(cells)} | {', '.join(ratios)} |")
    p, ttft = fl["p50_ms"], {fw: figure(res, "one_process", fw, "ttft_p50_ms") for fw in FRAMEWORKS}
    out += ["", f"floor, raw vLLM on the one-process engines (p50 of {cfg['turns']} turns, ms): "
            f"Engine.aembed(question) {p['embed']:.1f} + numpy top-{RETRIEVE} {p['search']:.2f} + "
            f"Engine.ascore({RETRIEVE} pairs) {p['score']:.1f} + raw AsyncLLM first token "
            f"{p['raw_ttft']:.1f} = {fl['turn_ttft_ms']:.1f} ms (Engine.astream first token "
            f"{p['engine_ttft']:.1f}; Engine.aembed of the {CHUNKS:,} chunks {fl['index_s']:.2f} "
            f"s; longest prompt {fl['max_prompt_tokens']} tokens)",
            "one-process TTFT p50 / floor: " + ", ".join(
                f"{fw} {ttft[fw] / fl['turn_ttft_ms']:.2f}x" for fw in FRAMEWORKS)]
    return "\n".join(out)


def child_main(side: str, cfg_path: str) -> int:
    """A side's process: SIGTERM runs the same clean-up as Ctrl-C (engines, servers)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cfg = json.loads(pathlib.Path(cfg_path).read_text())
    result = (one_process if side == "one_process" else three_servers)(cfg)
    pathlib.Path(cfg["result"]).write_text(json.dumps(result))
    return 0


def meta(cfg: dict[str, Any], started: float) -> dict[str, Any]:
    """What the JSON file says about the run."""
    from importlib.metadata import version

    clients = ("openai", "httpx", "llama-index-llms-openai-like",
               "llama-index-embeddings-openai-like")
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
            "command": " ".join([os.path.relpath(sys.executable), *sys.argv]),
            "elapsed_s": round(time.perf_counter() - started, 1), "config": cfg,
            "engine_options": CPU_TEST_ENGINE_KWARGS, "sampling": {**SAMPLING, "max_tokens":
            MAX_TOKENS}, "versions": {**run.versions(), **{n: version(n) for n in clients}}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tier", choices=("tiny", "real", "both"), default="both")
    ap.add_argument("--turns", type=int, default=30, help="turns per framework at c=1")
    ap.add_argument("--c16-turns", type=int, default=64, help="turns per framework at c=16")
    ap.add_argument("--quick", action="store_true", help="tiny tier, 8 and 16 turns")
    ap.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # a child process
    ap.add_argument("--config", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.side:
        return child_main(args.side, args.config)
    if args.quick:
        args.tier, args.turns, args.c16_turns = "tiny", 8, 16
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    for tier in ("tiny", "real") if args.tier == "both" else (args.tier,):
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="rag-bench-") as tmp:
            models = build_models(tier)
            chat_flags, stop_ids = chat_setup(models["chat"], pathlib.Path(tmp))
            cfg = {"tier": tier, "models": models, "turns": args.turns,
                   "c16_turns": args.c16_turns, "chat_flags": chat_flags,
                   "stop_token_ids": stop_ids, "out": str(out)}
            res = {}
            for side in SIDES:  # one side at a time
                log(f"{tier}: {side.replace('_', ' ')}")
                res[side] = run_side(side, cfg, pathlib.Path(tmp))
        text = table(tier, res, cfg)
        print(text, flush=True)
        path = out / f"rag-{tier}.json"
        path.write_text(json.dumps({"meta": meta(cfg, started), **res, "table": text}, indent=1))
        log(f"{tier}: wrote {path} ({(time.perf_counter() - started) / 60:.1f} min)")
    return 0


if __name__ == "__main__":  # the engine core is a spawned process: keep this guard
    sys.exit(main())
