"""A RAG turn in one process against three vLLM servers, and against one vllm-inline server,
side by side in one run.

A turn: embed the question, take the top 8 of 1,000 chunks from an in-memory vector store,
rerank them to 3, stream the answer (max_tokens=32, greedy). Three sides, the same models and
engine options (``vllm_inline.testing.CPU_TEST_ENGINE_KWARGS``, the window cut to what each
model allows; flags for the servers):

- **one process**: ``VLLMEmbeddings`` + ``VLLMRerank`` + ``ChatVLLM`` in an LCEL chain over
  ``InMemoryVectorStore``; LlamaIndex ``VLLMEmbedding`` + ``VLLMRerank`` + ``VLLM`` in a
  streaming ``VectorStoreIndex`` query engine; the three engines started by ``start_engines``.
- **three servers**: ``python -m vllm.entrypoints.openai.api_server`` for the chat model, the
  embedder and the reranker (``--runner pooling``), launched in parallel; ``ChatOpenAI``
  (streaming, ``stream_usage``) + ``OpenAIEmbeddings``, ``OpenAILike`` + ``OpenAILikeEmbedding``,
  and ``/rerank`` through one kept-alive ``httpx.AsyncClient``.
- **one server**: ``python -m vllm_inline serve`` with the three models (``--vllm-kwargs``: the
  same options, one set for all three, so the smallest window of the three); the very clients
  of the three-servers side (``rag_http.openai_apps``), every base URL on it, sending the names
  its ``/v1/models`` lists.

Each side runs in a child process of its own, one after the other, so each client's CPU and
memory are its own. Figures: time to the first answer token from the start of the turn (c=1,
p50/p90); turns/s with 16 asyncio tasks on the async APIs; client CPU per turn (that process
alone); peak RSS of the side's processes (it and its descendants: engine cores and workers, or
the server trees), and their PSS at the end of the c=16 block (a shared page divided
among the processes that map it: what the side takes together); cold start (from before
``start_engines``, or the servers' launch, to the first token of the LangChain app's first
answer, indexing included; servers' readiness by polling ``/health``). The floor: each step
timed on the one-process engines (``Engine.aembed``, a numpy top-8, ``Engine.ascore``, raw
``AsyncLLM.generate``'s first token), summed; and the same steps through each side's LangChain
clients (``rag_turns.client_steps``): the hops.

    python benchmarks/rag.py --quick            # tiny tier, 8 and 16 turns: a smoke run
    python benchmarks/rag.py --tier real        # Gemma 3 270M + all-MiniLM-L6-v2
    python benchmarks/rag.py --tier tiny --sides three_servers,one_server --out /tmp/x.json
    make bench RAG_ARGS="--tier tiny"

Prints a markdown table per tier (progress on stderr); writes benchmarks/results/rag-<tier>.json
(``--out``: another file; ``{tier}`` in it becomes the tier).
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
from rag_http import one_server, three_servers
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
    log,
    questions,
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


RATIOS = (("one_process", "three_servers"), ("one_server", "three_servers"))
"""The ratio columns of the table, each where both sides ran."""
DIFFS = (("three_servers", "one_process"), ("one_server", "three_servers"))
"""The step table's differences (``three servers - one process``), each where both sides ran."""
FW_LABELS = {"langchain": "LangChain", "llama_index": "LlamaIndex"}


def _name(side: str) -> str:
    return side.replace("_", " ")


def _row(cells: list[str]) -> str:
    return f"| {' | '.join(cells)} |"


def table(tier: str, res: dict[str, Any], cfg: dict[str, Any]) -> str:
    """The markdown table of the sides that ran, then the floor lines (with the one-process
    side) and the step table."""
    m, sides = cfg["models"], [s for s in SIDES if s in res]
    pairs = [(a, b) for a, b in RATIOS if a in res and b in res]
    fl = res["one_process"]["floor"] if "one_process" in res else None
    head = [f"{_name(s)} ({FW_LABELS[fw]})" for s in sides for fw in FRAMEWORKS]
    head += [f"ratio ({_name(a)} / {_name(b)}): LangChain, LlamaIndex" for a, b in pairs]
    out = [
        (
            f"\n== {tier}: chat {m['chat']}, embedder {m['embedder']}, reranker {m['reranker']}; "
            f"{cfg['turns']} turns at c=1, {cfg['c16_turns']} at c={CONCURRENCY}, top {RETRIEVE} "
            f"of {CHUNKS:,} -> {KEEP}, max_tokens={MAX_TOKENS} ==\n"
        ),
        _row(["figure", *head]),
        "|---" * (len(head) + 1) + "|",
    ]
    for label, key, fmt in ROWS:
        v = {(s, fw): figure(res, s, fw, key) for s in sides for fw in FRAMEWORKS}
        cells = ["-" if x is None else format(x, fmt) for x in v.values()]
        for a, b in pairs:
            ratios = [(v[a, fw], v[b, fw]) for fw in FRAMEWORKS]
            cells.append(", ".join(f"{x / y:.2f}" if x and y else "-" for x, y in ratios))
        out.append(_row([label, *cells]))
    ttft = {s: figure(res, s, "langchain", "ttft_p50_ms") for s in sides}
    if fl is not None:
        p, one = (
            fl["p50_ms"],
            {fw: figure(res, "one_process", fw, "ttft_p50_ms") for fw in FRAMEWORKS},
        )
        out += [
            "",
            (
                f"floor, raw vLLM on the one-process engines (p50 of {cfg['turns']} turns, ms): "
                f"Engine.aembed(question) {p['embed']:.1f} + numpy top-{RETRIEVE} "
                f"{p['search']:.2f} + Engine.ascore({RETRIEVE} pairs) {p['score']:.1f} + raw "
                f"AsyncLLM first token {p['raw_ttft']:.1f} = {fl['turn_ttft_ms']:.1f} ms "
                f"(Engine.astream first token {p['engine_ttft']:.1f}; Engine.aembed of the "
                f"{CHUNKS:,} chunks {fl['index_s']:.2f} s; longest prompt "
                f"{fl['max_prompt_tokens']} tokens)"
            ),
            "one-process TTFT p50 / floor: "
            + ", ".join(f"{fw} {one[fw] / fl['turn_ttft_ms']:.2f}x" for fw in FRAMEWORKS),
        ]
    out += [
        "",
        (
            f"each step of the LangChain turn alone (p50 of {cfg['turns']}, ms; the store's "
            "top 8 against numpy's):"
        ),
        "",
    ]
    diffs = [(a, b) for a, b in DIFFS if a in res and b in res]
    head = [*(["floor"] if fl else []), *map(_name, sides)]
    head += [f"{_name(a)} - {_name(b)}" for a, b in diffs]
    out += [_row(["step", *head]), "|---" * (len(head) + 1) + "|"]
    st = {s: res[s]["steps_p50_ms"] for s in sides}
    rows = [
        (k, fl["p50_ms"][FLOOR_OF[k]] if fl else None, {s: st[s][k] for s in sides})
        for k in CLIENT_STEPS
    ]
    rows += [
        ("sum", fl["turn_ttft_ms"] if fl else None, {s: sum(st[s].values()) for s in sides}),
        ("the chain's TTFT", None, ttft),
    ]
    for k, f, by_side in rows:
        cells = ["-" if f is None else f"{f:.1f}"] if fl else []
        cells += [f"{by_side[s]:.1f}" for s in sides]
        cells += [f"{by_side[a] - by_side[b]:+.1f}" for a, b in diffs]
        out.append(_row([k, *cells]))
    return "\n".join(out)


def child_main(side: str, cfg_path: str) -> int:
    """A side's process: SIGTERM runs the same clean-up as Ctrl-C (engines, servers)."""
    exit_on_sigterm()
    cfg = json.loads(pathlib.Path(cfg_path).read_text())
    sides = {"one_process": one_process, "three_servers": three_servers, "one_server": one_server}
    result = sides[side](cfg)
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


def parse_sides(text: str) -> tuple[str, ...]:
    """``--sides``: names from :data:`~rag_turns.SIDES`, comma-separated; they run in that
    order (one side at a time), whatever the order given."""
    given = {name.strip() for name in text.split(",") if name.strip()}
    if not given or given - set(SIDES):
        msg = f"expected some of {','.join(SIDES)}, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return tuple(s for s in SIDES if s in given)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tier", choices=("tiny", "real", "both"), default="both")
    ap.add_argument("--turns", type=int, default=30, help="turns per framework at c=1")
    ap.add_argument("--c16-turns", type=int, default=64, help="turns per framework at c=16")
    ap.add_argument("--quick", action="store_true", help="tiny tier, 8 and 16 turns")
    ap.add_argument(
        "--sides",
        type=parse_sides,
        default=SIDES,
        help=f"the sides to run, comma-separated, run in this order: {','.join(SIDES)} (default)",
    )
    ap.add_argument(
        "--out",
        help="the JSON file to write ({tier} in it becomes the tier; default: "
        "benchmarks/results/rag-{tier}.json)",
    )
    ap.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # a child process
    ap.add_argument("--config", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.side:
        return child_main(args.side, args.config)
    if args.quick:
        args.tier, args.turns, args.c16_turns = "tiny", 8, 16
    if args.out and args.tier == "both" and "{tier}" not in args.out:
        ap.error("--out with --tier both needs {tier} in the name (one file per tier)")
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
            for side in args.sides:  # one side at a time
                log(f"{tier}: {side.replace('_', ' ')}")
                res[side] = run_side(side, cfg, pathlib.Path(tmp))
        text = table(tier, res, cfg)
        print(text, flush=True)
        path = pathlib.Path(str(args.out or out / "rag-{tier}.json").replace("{tier}", tier))
        write_json(path, {"meta": {**meta(cfg, started), "sides": list(res)}, **res, "table": text})
        log(f"{tier}: wrote {path} ({(time.perf_counter() - started) / 60:.1f} min)")
    return 0


if __name__ == "__main__":  # the engine core is a spawned process: keep this guard
    sys.exit(main())
