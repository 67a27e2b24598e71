"""Seeded random mutations of good requests to every route the server has that takes a body
(types swapped, fields dropped or added, values nested, sized up, or made of odd Unicode), on
the suite's shared engines: no 5xx, every error a JSON object in OpenAI's shape, and the engines
answering right afterwards. ``FUZZ_SEED=N`` repeats a run (the seed is in each failure);
``FUZZ_MUTATIONS=N`` sends more of them (40 per route by default: seconds)."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serving import serving

from vllm_inline.engine import get_engine, start_engines
from vllm_inline.server import OpenAIServer
from vllm_inline.server.responses import MemoryResponseStore
from vllm_inline.testing import build_embedding_model
from vllm_inline.testing.reranker import build_reranker_model

# A minute of requests (and a reranker's start): with the server's slower suites, not make test.
pytestmark = [pytest.mark.engine, pytest.mark.server]

SEED = int(os.environ.get("FUZZ_SEED", "20261207"))
MUTATIONS = int(os.environ.get("FUZZ_MUTATIONS", "40"))
"""Mutated requests per route and run."""
HI = [{"role": "user", "content": "Hi"}]
GOOD: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": "llama3", "messages": HI, "max_tokens": 8,
                             "temperature": 0, "stop": ["x"], "logprobs": False},
    "/v1/completions": {"model": "llama3", "prompt": "Hi", "max_tokens": 4, "n": 1,
                        "temperature": 0},
    "/v1/responses": {"model": "llama3", "input": HI, "max_output_tokens": 8, "store": False,
                      "temperature": 0,
                      "tools": [{"type": "function", "name": "f", "parameters": {}}]},
    "/v1/embeddings": {"model": "embedder", "input": ["a", "b"], "encoding_format": "float"},
    "/v1/rerank": {"model": "reranker", "query": "q", "documents": ["a", "b"], "top_n": 1},
    "/v2/rerank": {"model": "reranker", "query": "q", "documents": ["a", "b"]},
    "/rerank": {"model": "reranker", "query": "q", "documents": ["a"]},
    "/v1/score": {"model": "reranker", "queries": "q", "documents": ["a", "b"]},
    "/score": {"model": "reranker", "text_1": "q", "text_2": ["a"]},
    "/tokenize": {"model": "llama3", "messages": HI, "add_generation_prompt": True},
    "/detokenize": {"model": "llama3", "tokens": [1, 2, 3]},
}  # fmt: skip
ODD_TEXT = ["", "\udc80", "\ud83d", "\x00", "😀" * 50, "a" * 20_000, "\u202e", "𝔘𝔫𝔦"]


def odd_value(rng: random.Random, depth: int = 0) -> Any:
    """A value of a random type and size."""
    kinds = ["none", "bool", "int", "float", "text", "list", "dict"]
    kind = rng.choice(kinds if depth < 3 else kinds[:5])
    if kind == "none":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "int":
        return rng.choice([0, -1, 1, 7, 2**31, -(2**63), 10**30])
    if kind == "float":
        return rng.choice([0.0, -0.5, 1e308, -1e-308, 3.7])
    if kind == "text":
        return rng.choice(ODD_TEXT)
    if kind == "list":
        return [odd_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(["role", "content", "type", "x"]): odd_value(rng, depth + 1)}


def mutate(body: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """``body`` with one to three random changes, somewhere in it."""
    body = json.loads(json.dumps(body))
    for _ in range(rng.randint(1, 3)):
        target: Any = body
        key: Any = rng.choice(list(body))
        while isinstance(target[key], (dict, list)) and target[key] and rng.random() < 0.5:
            target = target[key]
            key = (
                rng.choice(list(target)) if isinstance(target, dict) else rng.randrange(len(target))
            )
        change = rng.choice(["swap", "swap", "drop", "add", "nest"])
        if change == "drop" and isinstance(target, dict):
            del target[key]
            if not body:
                break
        elif change == "add" and isinstance(target, dict):
            target[rng.choice(["extra", "n", "stream", "seed", "max_tokens"])] = odd_value(rng)
        elif change == "nest":
            target[key] = [target[key]] if rng.random() < 0.5 else {"value": target[key]}
        else:
            target[key] = odd_value(rng)
    return body


@pytest.fixture(scope="module")
def url(scripted: Any, scripted_root: Path) -> Iterator[str]:
    from fastapi import FastAPI

    llama3 = scripted("llama3")
    kwargs = llama3.engine_kwargs
    embedder = get_engine(str(build_embedding_model(scripted_root)), runner="pooling", **kwargs)
    reranker = get_engine(str(build_reranker_model(scripted_root)), runner="pooling", **kwargs)
    start_engines(llama3.engine, embedder)  # the suite's shared ones: not the lifespan's to stop
    server = OpenAIServer(
        chat={"llama3": llama3.engine},
        embedding={"embedder": embedder},
        rerank={"reranker": reranker},
        responses_store=MemoryResponseStore(),
    )
    app = FastAPI(lifespan=server.lifespan)  # starts the reranker, and stops it
    server.install(app)
    with serving(app) as base:
        yield base


def check_answer(response: httpx.Response, where: str) -> None:
    assert response.status_code < 500, f"{where}: {response.status_code} {response.text[:500]}"
    kind = response.headers.get("content-type", "")
    if kind.startswith("text/event-stream"):
        return
    assert kind.startswith("application/json"), f"{where}: {kind} {response.text[:300]}"
    answer = response.json()
    if response.status_code >= 400:
        error = answer.get("error") if isinstance(answer, dict) else None
        assert isinstance(error, dict) and error.get("message"), f"{where}: {answer}"
        assert error.get("code") == response.status_code, f"{where}: {answer}"


@pytest.mark.parametrize("route", list(GOOD))
def test_mutated_requests_get_no_5xx_and_a_json_error(url: str, route: str) -> None:
    rng = random.Random(f"{SEED}{route}")
    with httpx.Client(base_url=url, timeout=120) as client:
        good = client.post(route, json=GOOD[route])
        assert good.status_code == 200, good.text
        for i in range(MUTATIONS):
            body = mutate(GOOD[route], rng)
            where = f"FUZZ_SEED={SEED} {route} #{i}: {json.dumps(body)[:300]}"
            # json.dumps writes a lone surrogate as its escape, which JSON allows.
            content = json.dumps(body).encode()
            with client.stream("POST", route, content=content,
                               headers={"content-type": "application/json"}) as response:  # fmt: skip
                response.read()
                check_answer(response, where)
        again = client.post(route, json=GOOD[route])
        assert again.status_code == 200, again.text
        assert stable(again.json()) == stable(good.json())  # the same answer as before


def stable(answer: Any) -> Any:
    """``answer`` without its ids, times and cache hits (new in every answer)."""
    if isinstance(answer, dict):
        volatile = ("id", "cached_tokens")
        return {k: stable(v) for k, v in answer.items() if k not in volatile and "created" not in k}
    if isinstance(answer, list):
        return [stable(v) for v in answer]
    return answer


@pytest.mark.parametrize("field", ["seed", "max_tokens", "n", "top_k"])
def test_an_integer_beyond_64_bits_is_a_400_naming_it(url: str, field: str) -> None:
    """Found by the mutations: vLLM's engine core cannot carry it (was a 503 saying the engine
    failed the request)."""
    body = {**GOOD["/v1/completions"], field: 10**30}
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == field, answer.text
