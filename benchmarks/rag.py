"""A RAG turn in one process against three vLLM servers, side by side in one run.

A turn: embed the question, take the top 8 of 1,000 chunks from an in-memory vector store,
rerank them to 3, stream the answer (max_tokens=32, greedy). Two sides, the same models and
engine options (``vllm_inline.testing.CPU_TEST_ENGINE_KWARGS``, the window cut to what each
model allows; flags for the servers):

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
the three server trees), and their PSS at the end of the c=16 block (a shared page divided
among the processes that map it: what the side takes together); cold start (from before
``start_engines``, or the servers' launch, to the first token of the LangChain app's first
answer, indexing included; servers' readiness by polling ``/health``). The floor: each step
timed on the one-process engines (``Engine.aembed``, a numpy top-8, ``Engine.ascore``, raw
``AsyncLLM.generate``'s first token), summed; and the same steps through each side's LangChain
clients (``rag_turns.client_steps``): the hops.

    python benchmarks/rag.py --quick            # tiny tier, 8 and 16 turns: a smoke run
    python benchmarks/rag.py --tier real        # Gemma 3 270M + all-MiniLM-L6-v2
    make bench RAG_ARGS="--tier tiny"

Prints a markdown table per tier (progress on stderr); writes benchmarks/results/rag-<tier>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import sys
import tempfile
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import servers  # first: it keeps the environment this script started with (servers.USER_ENV)

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # before vLLM is imported anywhere
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from children import exit_on_sigterm, run_to_end
from rag_turns import (
    CHUNKS,
    CLIENT_STEPS,
    CONCURRENCY,
    FLOOR_OF,
    FRAMEWORKS,
    KEEP,
    MAX_TOKENS,
    RETRIEVE,
    SAMPLING,
    SIDES,
    both_apps,
    corpus,
    floor,
    http_postprocessor,
    log,
    questions,
    server_rerank,
)
from report import versions, write_json

from vllm_inline.testing import CPU_TEST_ENGINE_KWARGS

# -- side 1: one process --------------------------------------------------------------------------


def one_process(cfg: dict[str, Any]) -> dict[str, Any]:
    """Both apps on three engines in this process; then the floor on the same engines."""
    from vllm_inline.engine import shutdown_engines, start_engines
    from vllm_inline.integrations import langchain as lc
    from vllm_inline.integrations import llama_index as li

    m, kw = cfg["models"], {role: {"vllm_kwargs": o} for role, o in cfg["options"].items()}
    chat = lc.ChatVLLM(model=m["chat"], max_tokens=MAX_TOKENS, **SAMPLING, **kw["chat"])
    emb, rerank = (
        lc.VLLMEmbeddings(model=m["embedder"], **kw["embedder"]),
        lc.VLLMRerank(model=m["reranker"], top_n=KEEP, **kw["reranker"]),
    )
    li_parts = (
        li.VLLM(model=m["chat"], max_tokens=MAX_TOKENS, **SAMPLING, **kw["chat"]),
        li.VLLMEmbedding(model=m["embedder"], **kw["embedder"]),
        li.VLLMRerank(model=m["reranker"], top_n=KEEP, **kw["reranker"]),
    )
    engines = (chat.engine, emb.engine, rerank.engine)
    assert tuple(x.engine for x in li_parts) == engines, "the frameworks must share the engines"
    ask = questions()

    async def main(t0: float) -> dict[str, Any]:
        result = await both_apps(
            "one process", t0, (chat, emb, rerank.acompress_documents), li_parts, cfg, ask
        )
        return {**result, "floor": await floor(engines, corpus(), cfg["turns"], ask)}

    try:
        t0 = time.perf_counter()
        start_engines(*engines, progress=log)
        return asyncio.run(main(t0))
    finally:
        shutdown_engines(*engines)


# -- side 2: three servers ------------------------------------------------------------------------


def three_servers(cfg: dict[str, Any]) -> dict[str, Any]:
    """Three vLLM servers launched at once; both apps on their OpenAI-compatible clients."""
    out, pooling = pathlib.Path(cfg["out"]), ["--runner", "pooling"]
    flags = {"chat": cfg["chat_flags"], "embedder": pooling, "reranker": pooling}
    ports, procs = {role: servers.free_port() for role in flags}, {}
    t0 = time.perf_counter()
    try:
        for role, extra in flags.items():
            procs[role] = servers.start_server(
                cfg["models"][role],
                ports[role],
                dict(cfg["options"][role]),
                out / f"rag-server-{cfg['tier']}-{role}.log.tmp",
                extra,
            )
        log(f"three servers: launched, ports {ports} (logs: {out}/rag-server-*.log.tmp)")
        return asyncio.run(servers_main(cfg, ports, procs, t0))
    finally:
        for proc in procs.values():
            servers.stop_server(proc)


async def servers_main(cfg: dict, ports: dict, procs: dict, t0: float) -> dict[str, Any]:
    """Wait for the three servers' ``/health``, then :func:`both_apps` on their clients."""
    import httpx
    from langchain_openai import ChatOpenAI, OpenAIEmbeddings
    from llama_index.embeddings.openai_like import OpenAILikeEmbedding
    from llama_index.llms.openai_like import OpenAILike

    for role, proc in procs.items():  # launched together: the last one to be ready counts
        await asyncio.to_thread(
            servers.wait_healthy, f"http://127.0.0.1:{ports[role]}/health", proc, 900, 0.1
        )
    url = {role: f"http://127.0.0.1:{port}/v1" for role, port in ports.items()}
    m = cfg["models"]
    # Greedy as the other side, and the end-of-turn ids the engine stops at: the servers stop
    # only at generation_config's eos otherwise (Gemma 3 270M's lists <eos> alone).
    body = {
        "repetition_penalty": SAMPLING["repetition_penalty"],
        "stop_token_ids": cfg["stop_token_ids"],
    }
    common = {"api_key": "EMPTY", "max_retries": 0, "timeout": 300}
    sampling = {"max_tokens": MAX_TOKENS, "temperature": SAMPLING["temperature"]}
    chat = ChatOpenAI(
        model=m["chat"],
        base_url=url["chat"],
        streaming=True,
        stream_usage=True,
        extra_body=body,
        **sampling,
        **common,
    )
    emb = OpenAIEmbeddings(
        model=m["embedder"], base_url=url["embedder"], check_embedding_ctx_length=False, **common
    )
    li_llm = OpenAILike(
        model=m["chat"],
        api_base=url["chat"],
        is_chat_model=True,
        context_window=cfg["options"]["chat"]["max_model_len"],
        additional_kwargs={"extra_body": body},
        **sampling,
        **common,
    )
    li_emb = OpenAILikeEmbedding(model_name=m["embedder"], api_base=url["embedder"], **common)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{ports['reranker']}", timeout=300
    ) as client:  # one client, kept alive: its pool

        async def rerank(docs: list[Any], q: str) -> list[Any]:
            texts = [d.page_content for d in docs]
            return [docs[i] for i in await server_rerank(client, m["reranker"], q, texts)]

        li_parts = (li_llm, li_emb, http_postprocessor(client, m["reranker"]))
        return await both_apps("three servers", t0, (chat, emb, rerank), li_parts, cfg, questions())


# -- the parent: models, one child per side, the table ------------------------------------------


def build_models(tier: str) -> dict[str, str]:
    """The tier's chat model, embedder and reranker directories (built once, then cached)."""
    from vllm_inline.testing import (
        build_embedding_model,
        build_reranker_model,
        build_scripted_model,
    )

    if tier == "tiny":
        chat, embedder = build_scripted_model("demo"), build_embedding_model()
    else:
        sys.path.insert(0, str(HERE.parent / "tests" / "real"))
        from checkpoints import cache_root, gemma_dir, minilm_dir

        chat, embedder = gemma_dir(cache_root()), minilm_dir(cache_root())
    return {"chat": str(chat), "embedder": str(embedder), "reranker": str(build_reranker_model())}


def engine_options(model: str) -> dict[str, Any]:
    """The tests' CPU options, the window cut to what the model allows: vLLM refuses a
    ``max_model_len`` past a sentence-transformers model's ``max_seq_length`` (MiniLM: 256)."""
    options = dict(CPU_TEST_ENGINE_KWARGS)
    st = pathlib.Path(model) / "sentence_bert_config.json"
    if st.exists():
        limit = json.loads(st.read_text()).get("max_seq_length")
        options["max_model_len"] = min(options["max_model_len"], limit or options["max_model_len"])
    return options


def chat_setup(model: str, scratch: pathlib.Path) -> tuple[list[str], list[int]]:
    """What vLLM's docs say a server needs for this chat model: ``--chat-template`` when its
    tokenizer has none (the family template vllm-inline falls back to); and the family's
    end-of-turn ids (vllm-inline stops at them) for the clients to send as stop_token_ids."""
    from transformers import AutoTokenizer

    from vllm_inline.engine.life.templates import detect_family

    tok = AutoTokenizer.from_pretrained(model)
    vocab = tok.get_vocab()
    family, flags = detect_family(vocab), []
    if tok.chat_template is None and family is not None:
        (scratch / "chat_template.jinja").write_text(family.template)
        flags = ["--chat-template", str(scratch / "chat_template.jinja")]
    return flags, [vocab[t] for t in (family.end_of_turn if family else ()) if t in vocab]


def run_side(side: str, cfg: dict[str, Any], scratch: pathlib.Path) -> dict[str, Any]:
    """Run one side in a child process, with the environment this script started with
    (``children.run_to_end``: on an error or Ctrl-C it is stopped, by its pid); its result."""
    cfg_path, result_path = scratch / f"{side}.json", scratch / f"{side}-result.json"
    cfg_path.write_text(json.dumps({**cfg, "result": str(result_path)}))
    run_to_end(
        [sys.executable, __file__, "--side", side, "--config", str(cfg_path)],
        f"the {side} side",
        servers.USER_ENV,
    )
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
    (f"PSS, all processes of the side, after c={CONCURRENCY} (MiB)", "c16.pss_mib", ".0f"),
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
    out = [
        (
            f"\n== {tier}: chat {m['chat']}, embedder {m['embedder']}, reranker {m['reranker']}; "
            f"{cfg['turns']} turns at c=1, {cfg['c16_turns']} at c={CONCURRENCY}, top {RETRIEVE} "
            f"of {CHUNKS:,} -> {KEEP}, max_tokens={MAX_TOKENS} ==\n"
        ),
        (
            "| figure | one process (LangChain) | one process (LlamaIndex) | three servers "
            "(LangChain) | three servers (LlamaIndex) | ratio (one process / three servers): "
            "LangChain, LlamaIndex |"
        ),
        "|---|---|---|---|---|---|",
    ]
    for label, key, fmt in ROWS:
        v = {(s, fw): figure(res, s, fw, key) for s in SIDES for fw in FRAMEWORKS}
        cells = ["-" if x is None else format(x, fmt) for x in v.values()]
        ratios = [
            f"{a / b:.2f}" if a and b else "-"
            for a, b in ((v[SIDES[0], fw], v[SIDES[1], fw]) for fw in FRAMEWORKS)
        ]
        out.append(f"| {label} | {' | '.join(cells)} | {', '.join(ratios)} |")
    p, ttft = fl["p50_ms"], {fw: figure(res, "one_process", fw, "ttft_p50_ms") for fw in FRAMEWORKS}
    out += [
        "",
        (
            f"floor, raw vLLM on the one-process engines (p50 of {cfg['turns']} turns, ms): "
            f"Engine.aembed(question) {p['embed']:.1f} + numpy top-{RETRIEVE} {p['search']:.2f} + "
            f"Engine.ascore({RETRIEVE} pairs) {p['score']:.1f} + raw AsyncLLM first token "
            f"{p['raw_ttft']:.1f} = {fl['turn_ttft_ms']:.1f} ms (Engine.astream first token "
            f"{p['engine_ttft']:.1f}; Engine.aembed of the {CHUNKS:,} chunks {fl['index_s']:.2f} "
            f"s; longest prompt {fl['max_prompt_tokens']} tokens)"
        ),
        "one-process TTFT p50 / floor: "
        + ", ".join(f"{fw} {ttft[fw] / fl['turn_ttft_ms']:.2f}x" for fw in FRAMEWORKS),
        "",
        (
            f"each step of the LangChain turn alone (p50 of {cfg['turns']}, ms; the store's "
            "top 8 against numpy's):"
        ),
        "",
        "| step | floor | one process | three servers | three servers - one process |",
        "|---|---|---|---|---|",
    ]
    st = [res[side]["steps_p50_ms"] for side in SIDES]
    rows = [(k, p[FLOOR_OF[k]], st[0][k], st[1][k]) for k in CLIENT_STEPS]
    rows += [
        ("sum", fl["turn_ttft_ms"], sum(st[0].values()), sum(st[1].values())),
        (
            "the chain's TTFT",
            None,
            ttft["langchain"],
            figure(res, SIDES[1], "langchain", "ttft_p50_ms"),
        ),
    ]
    out += [
        f"| {k} | {'-' if f is None else f'{f:.1f}'} | {a:.1f} | {b:.1f} | {b - a:+.1f} |"
        for k, f, a, b in rows
    ]
    return "\n".join(out)


def child_main(side: str, cfg_path: str) -> int:
    """A side's process: SIGTERM runs the same clean-up as Ctrl-C (engines, servers)."""
    exit_on_sigterm()
    cfg = json.loads(pathlib.Path(cfg_path).read_text())
    result = (one_process if side == "one_process" else three_servers)(cfg)
    pathlib.Path(cfg["result"]).write_text(json.dumps(result))
    return 0


def meta(cfg: dict[str, Any], started: float) -> dict[str, Any]:
    """What the JSON file says about the run."""
    from importlib.metadata import version

    clients = (
        "openai",
        "httpx",
        "llama-index-llms-openai-like",
        "llama-index-embeddings-openai-like",
    )
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "command": " ".join([os.path.relpath(sys.executable), *sys.argv]),
        "elapsed_s": round(time.perf_counter() - started, 1),
        "config": cfg,
        "sampling": {**SAMPLING, "max_tokens": MAX_TOKENS},
        "versions": {**versions(), **{n: version(n) for n in clients}},
    }


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
            cfg = {
                "tier": tier,
                "models": models,
                "turns": args.turns,
                "options": {role: engine_options(m) for role, m in models.items()},
                "c16_turns": args.c16_turns,
                "chat_flags": chat_flags,
                "stop_token_ids": stop_ids,
                "out": str(out),
            }
            res = {}
            for side in SIDES:  # one side at a time
                log(f"{tier}: {side.replace('_', ' ')}")
                res[side] = run_side(side, cfg, pathlib.Path(tmp))
        text = table(tier, res, cfg)
        print(text, flush=True)
        path = out / f"rag-{tier}.json"
        write_json(path, {"meta": meta(cfg, started), **res, "table": text})
        log(f"{tier}: wrote {path} ({(time.perf_counter() - started) / 60:.1f} min)")
    return 0


if __name__ == "__main__":  # the engine core is a spawned process: keep this guard
    sys.exit(main())
