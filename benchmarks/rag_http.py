"""The HTTP sides of ``benchmarks/rag.py``: the same OpenAI-compatible clients against three
``vllm serve`` processes (:func:`three_servers`) or against one ``python -m vllm_inline serve``
with the three models (:func:`one_server`).

Both sides build their apps with :func:`openai_apps`, one function: ``ChatOpenAI`` (streaming,
``stream_usage``) + ``OpenAIEmbeddings``, ``OpenAILike`` + ``OpenAILikeEmbedding``, and
``/rerank`` through one kept-alive ``httpx.AsyncClient``. Only the base URLs and the model names
differ: the three servers' own ports and model paths, or the one server's port (three times) and
the names its ``/v1/models`` lists. The cold start runs from before the launch to the first token
of the LangChain app's first answer; readiness is ``/health`` answering 200.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any

import servers
from children import stop
from rag_turns import (
    MAX_TOKENS,
    SAMPLING,
    both_apps,
    http_postprocessor,
    log,
    questions,
    server_rerank,
)

__all__ = ["one_server", "openai_apps", "shared_options", "three_servers"]

ROLES = ("chat", "embedder", "reranker")


# -- the clients, the same for both HTTP sides -----------------------------------------------------


async def openai_apps(
    side: str,
    cfg: dict[str, Any],
    urls: dict[str, str],
    names: dict[str, str],
    context_window: int,
    t0: float,
) -> dict[str, Any]:
    """:func:`~rag_turns.both_apps` on OpenAI-compatible clients: ``urls`` are the servers'
    roots (``http://127.0.0.1:PORT``) and ``names`` the models the clients send, by role."""
    import httpx
    from langchain_openai import ChatOpenAI, OpenAIEmbeddings
    from llama_index.embeddings.openai_like import OpenAILikeEmbedding
    from llama_index.llms.openai_like import OpenAILike

    v1 = {role: f"{url}/v1" for role, url in urls.items()}
    # Greedy as the other side, and the end-of-turn ids the engine stops at: the servers stop
    # only at generation_config's eos otherwise (Gemma 3 270M's lists <eos> alone).
    body = {
        "repetition_penalty": SAMPLING["repetition_penalty"],
        "stop_token_ids": cfg["stop_token_ids"],
    }
    common = {"api_key": "EMPTY", "max_retries": 0, "timeout": 300}
    sampling = {"max_tokens": MAX_TOKENS, "temperature": SAMPLING["temperature"]}
    chat = ChatOpenAI(
        model=names["chat"],
        base_url=v1["chat"],
        streaming=True,
        stream_usage=True,
        extra_body=body,
        **sampling,
        **common,
    )
    emb = OpenAIEmbeddings(
        model=names["embedder"], base_url=v1["embedder"], check_embedding_ctx_length=False, **common
    )
    li_llm = OpenAILike(
        model=names["chat"],
        api_base=v1["chat"],
        is_chat_model=True,
        context_window=context_window,
        additional_kwargs={"extra_body": body},
        **sampling,
        **common,
    )
    li_emb = OpenAILikeEmbedding(model_name=names["embedder"], api_base=v1["embedder"], **common)
    async with httpx.AsyncClient(base_url=urls["reranker"], timeout=300) as client:  # its pool

        async def rerank(docs: list[Any], q: str) -> list[Any]:
            texts = [d.page_content for d in docs]
            return [docs[i] for i in await server_rerank(client, names["reranker"], q, texts)]

        li_parts = (li_llm, li_emb, http_postprocessor(client, names["reranker"]))
        return await both_apps(side, t0, (chat, emb, rerank), li_parts, cfg, questions())


# -- three servers ---------------------------------------------------------------------------------


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
    """Wait for the three servers' ``/health``, then :func:`openai_apps` on them (each serves
    its model under its path, as ``vllm serve`` does without ``--served-model-name``)."""
    for role, proc in procs.items():  # launched together: the last one to be ready counts
        await asyncio.to_thread(
            servers.wait_healthy, f"http://127.0.0.1:{ports[role]}/health", proc, 900, 0.1
        )
    urls = {role: f"http://127.0.0.1:{port}" for role, port in ports.items()}
    window = cfg["options"]["chat"]["max_model_len"]
    return await openai_apps("three servers", cfg, urls, cfg["models"], window, t0)


# -- one server ------------------------------------------------------------------------------------


def shared_options(options: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The one set of engine options ``vllm_inline serve --vllm-kwargs`` gives all three engines:
    the roles' options, which are the same but for ``max_model_len`` where a model allows less
    (MiniLM: 256), which takes the smallest window (vLLM refuses one past the embedder's)."""
    shared = dict(options["chat"])
    for role in ROLES:
        rest = {k: v for k, v in options[role].items() if k != "max_model_len"}
        if rest != {k: v for k, v in shared.items() if k != "max_model_len"}:
            raise ValueError(f"the {role}'s engine options differ beyond max_model_len: {rest}")
        shared["max_model_len"] = min(shared["max_model_len"], options[role]["max_model_len"])
    return shared


def start_inline_server(
    models: dict[str, str], port: int, options: dict[str, Any], log_path: pathlib.Path
) -> subprocess.Popen[bytes]:
    """Start ``python -m vllm_inline serve`` for the chat model, the embedder and the reranker
    on 127.0.0.1:``port``, ``options`` as ``--vllm-kwargs``; as ``servers.start_server`` starts
    vLLM's (the user's environment, a process group of its own in this session, the log)."""
    cmd = [
        sys.executable, "-m", "vllm_inline", "serve",
        "--model", models["chat"],
        "--embedding-model", models["embedder"],
        "--rerank-model", models["reranker"],
        "--host", "127.0.0.1", "--port", str(port),
        "--vllm-kwargs", json.dumps(options),
    ]  # fmt: skip
    env = {**servers.USER_ENV, "VLLM_LOGGING_LEVEL": "WARNING"}
    with open(log_path, "wb") as server_log:
        return subprocess.Popen(
            cmd, stdout=server_log, stderr=subprocess.STDOUT, process_group=0, env=env
        )


def stop_inline_server(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server alone first (uvicorn's shutdown runs the lifespan, which shuts the
    engines down), 60 s; then SIGTERM to its process group, 30 s; then SIGKILL to the group.
    Its descendants (the engine processes have process groups of their own) get 30 s more to
    exit, then SIGTERM and 30 s, then SIGKILL, each by its pid."""
    import psutil

    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    stop(
        proc,
        ((signal.SIGTERM, False, 60), (signal.SIGTERM, True, 30), (signal.SIGKILL, True, None)),
    )
    _, alive = psutil.wait_procs(descendants, timeout=30)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not alive:
            return
        log(f"one server: {sig.name} to what outlived it: {[p.pid for p in alive]}")
        for p in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(sig)
        _, alive = psutil.wait_procs(alive, timeout=30)


def one_server(cfg: dict[str, Any]) -> dict[str, Any]:
    """``python -m vllm_inline serve`` with the three models in one process; both apps on
    :func:`openai_apps`, every base URL on that server."""
    port, options = servers.free_port(), shared_options(cfg["options"])
    log_path = pathlib.Path(cfg["out"]) / f"rag-serve-{cfg['tier']}.log.tmp"
    proc = None
    t0 = time.perf_counter()
    try:
        proc = start_inline_server(cfg["models"], port, options, log_path)
        log(f"one server: launched, port {port} (log: {log_path})")
        result = asyncio.run(one_server_main(cfg, port, proc, options, t0))
        return {**result, "vllm_kwargs": options}
    finally:
        if proc is not None:
            stop_inline_server(proc)


async def one_server_main(
    cfg: dict, port: int, proc: subprocess.Popen[bytes], options: dict, t0: float
) -> dict[str, Any]:
    """Wait for ``/health``; the names ``/v1/models`` lists (chat, embedding, rerank, each
    under its model path: ``root``); then :func:`openai_apps` with all three URLs on it."""
    import httpx

    url = f"http://127.0.0.1:{port}"
    await asyncio.to_thread(servers.wait_healthy, f"{url}/health", proc, 900, 0.1)
    async with httpx.AsyncClient(base_url=url) as client:
        cards = (await client.get("/v1/models")).raise_for_status().json()["data"]
    by_root = {card["root"]: card["id"] for card in cards}
    names = {role: by_root[cfg["models"][role]] for role in ROLES}
    result = await openai_apps(
        "one server", cfg, dict.fromkeys(ROLES, url), names, options["max_model_len"], t0
    )
    return {**result, "served_names": names}
