"""Clients nobody here wrote, against ``vllm_inline.server`` on a real socket: the ``openai`` SDK
(sync and async, streamed and not, completions, embeddings, rerank and score through its generic
``post``), LangChain's ``ChatOpenAI`` and ``OpenAIEmbeddings``, LlamaIndex's ``OpenAILike`` and
``OpenAILikeEmbedding``, and the OpenAI Agents SDK running a tool through the chat route.

One server holds four engines of the suite (scripted models): two chat models (``llama3``, whose
answer is known, and ``chatml_tools``, which calls ``get_weather`` and answers from its result),
an embedder and a reranker. What each client reads is compared with the engine's own answer.
"""

from __future__ import annotations

import asyncio
import base64
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from serving import serving

from vllm_inline.engine import Engine, get_engine
from vllm_inline.server import OpenAIServer
from vllm_inline.testing import build_embedding_model
from vllm_inline.testing.reranker import build_reranker_model

pytestmark = pytest.mark.engine

QUERY = "How is the weather in Oslo today?"
DOCS = [
    "The weather in Oslo is cold and snowy in winter.",
    "Paris is the capital of France.",
    "Bananas are yellow fruit.",
]


def same_vectors(got: Any, expected: list[list[float]]) -> None:
    """The vectors a client read equal the engine's, to float32's precision (base64 is float32)."""
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-6, atol=1e-7)


class App:
    """The running server and the engines behind it."""

    def __init__(self, url: str, engines: dict[str, Engine], answers: dict[str, str]) -> None:
        self.url = url
        self.engines = engines
        self.answers = answers
        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        self.aclient = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def app(scripted: Any, scripted_root: Path) -> Iterator[App]:
    from fastapi import FastAPI

    llama3, tools = scripted("llama3"), scripted("chatml_tools")
    kwargs = llama3.engine_kwargs
    embedder = get_engine(str(build_embedding_model(scripted_root)), runner="pooling", **kwargs)
    reranker_path = str(build_reranker_model(scripted_root))
    reranker = get_engine(reranker_path, runner="pooling", **kwargs)
    engines = {"llama3": llama3.engine, "tools": tools.engine, "embedder": embedder,
               "reranker": reranker}  # fmt: skip
    server = OpenAIServer(
        chat={"llama3": llama3.engine, "tools": tools.engine},
        embedding={"embedder": embedder},
        rerank={"reranker": reranker},
        tool_parser={"tools": "hermes"},
        enable_auto_tool_choice=True,
    )
    fastapi_app = FastAPI(lifespan=server.lifespan)
    server.install(fastapi_app)
    answers = {"llama3": llama3.scenario.answer, "after_tool": "The weather in Oslo is sunny."}
    try:
        with serving(fastapi_app) as url:
            yield App(url, engines, answers)
    finally:
        reranker.shutdown()  # the module's own (the embedder is the suite's shared one)


def test_models_lists_every_served_model(app: App) -> None:
    listed = {m.id: m for m in app.client.models.list()}
    assert list(listed) == ["llama3", "tools", "embedder", "reranker"]
    assert listed["llama3"].owned_by == "vllm"


def test_openai_sync_chat_streamed_and_not(app: App) -> None:
    hello = [{"role": "user", "content": "Hello"}]
    answer = app.client.chat.completions.create(model="llama3", messages=hello)
    assert answer.choices[0].message.content == app.answers["llama3"]
    chunks = list(
        app.client.chat.completions.create(
            model="llama3", messages=hello, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == app.answers["llama3"] and len(chunks) > 3
    assert chunks[-1].usage is not None and chunks[-1].usage == answer.usage


async def test_openai_async_chat_streamed_and_not(app: App) -> None:
    hello = [{"role": "user", "content": "Hello"}]
    answer = await app.aclient.chat.completions.create(model="llama3", messages=hello)
    stream = await app.aclient.chat.completions.create(model="llama3", messages=hello, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert answer.choices[0].message.content == text == app.answers["llama3"]


def test_openai_completions_on_a_raw_prompt(app: App) -> None:
    engine = app.engines["llama3"]
    prompt = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hello"}], tokenize=False, add_generation_prompt=True
    )
    whole = app.client.completions.create(model="llama3", prompt=prompt)
    assert whole.object == "text_completion"
    assert whole.choices[0].text == app.answers["llama3"]
    assert whole.choices[0].finish_reason == "stop"
    pieces = list(app.client.completions.create(model="llama3", prompt=prompt, stream=True))
    assert "".join(p.choices[0].text for p in pieces if p.choices) == app.answers["llama3"]
    two = app.client.completions.create(model="llama3", prompt=[prompt, prompt], max_tokens=2)
    assert [c.index for c in two.choices] == [0, 1]
    assert two.usage is not None and two.usage.completion_tokens == 4


def test_openai_embeddings_float_and_base64(app: App) -> None:
    expected = app.engines["embedder"].embed(DOCS)
    floats = app.client.embeddings.create(model="embedder", input=DOCS, encoding_format="float")
    same_vectors([d.embedding for d in floats.data], expected)
    tokens = sum(len(app.engines["embedder"].tokenizer(d)["input_ids"]) for d in DOCS)
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == tokens
    raw = app.client.embeddings.with_raw_response.create(
        model="embedder", input=DOCS[0], encoding_format="base64"
    )
    packed = raw.http_response.json()["data"][0]["embedding"]
    decoded = struct.unpack(f"<{len(expected[0])}f", base64.b64decode(packed))
    assert list(decoded) == pytest.approx(expected[0], rel=1e-6)
    # The SDK's default asks for base64 and decodes it itself.
    assert app.client.embeddings.create(model="embedder", input=DOCS[0]).data[0].embedding == (
        pytest.approx(expected[0], rel=1e-6)
    )


def test_openai_rerank_and_score_through_post(app: App) -> None:
    expected = app.engines["reranker"].score(QUERY, DOCS)
    order = sorted(range(len(DOCS)), key=lambda i: expected[i], reverse=True)
    body = {"model": "reranker", "query": QUERY, "documents": DOCS, "top_n": 2}
    ranked = app.client.post("/rerank", body=body, cast_to=object)
    assert isinstance(ranked, dict)
    assert [r["index"] for r in ranked["results"]] == order[:2]
    assert [r["relevance_score"] for r in ranked["results"]] == pytest.approx(
        [expected[i] for i in order[:2]]
    )
    assert ranked["results"][0]["document"]["text"] == DOCS[order[0]]
    scored = app.client.post(
        "/score", body={"model": "reranker", "text_1": QUERY, "text_2": DOCS}, cast_to=object
    )
    assert isinstance(scored, dict)
    assert [d["score"] for d in scored["data"]] == pytest.approx(expected)


def test_the_wrong_kind_of_model_is_a_404_naming_those_that_serve(app: App) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        app.client.embeddings.create(model="llama3", input="x")
    assert "models that do: 'embedder'" in e.value.message


def test_chat_openai_and_openai_embeddings(app: App) -> None:
    from langchain_openai import ChatOpenAI, OpenAIEmbeddings

    llm = ChatOpenAI(model="llama3", base_url=f"{app.url}/v1", api_key="unused", max_retries=0)
    assert llm.invoke("Hello").content == app.answers["llama3"]
    assert "".join(str(c.content) for c in llm.stream("Hello")) == app.answers["llama3"]
    embeddings = OpenAIEmbeddings(
        model="embedder",
        base_url=f"{app.url}/v1",
        api_key="unused",
        check_embedding_ctx_length=False,  # it would count tokens with OpenAI's tokenizer
        max_retries=0,
    )
    expected = app.engines["embedder"].embed(DOCS)
    same_vectors(embeddings.embed_documents(DOCS), expected)
    assert embeddings.embed_query(DOCS[0]) == pytest.approx(expected[0], rel=1e-6)


def test_llama_index_openai_like_and_openai_like_embedding(app: App) -> None:
    from llama_index.core.llms import ChatMessage
    from llama_index.embeddings.openai_like import OpenAILikeEmbedding
    from llama_index.llms.openai_like import OpenAILike

    llm = OpenAILike(model="llama3", api_base=f"{app.url}/v1", api_key="unused", is_chat_model=True)
    hello = [ChatMessage(role="user", content="Hello")]
    assert llm.chat(hello).message.content == app.answers["llama3"]
    streamed = [r.delta or "" for r in llm.stream_chat(hello)]
    assert "".join(streamed) == app.answers["llama3"] and len(streamed) > 3
    embedding = OpenAILikeEmbedding(
        model_name="embedder", api_base=f"{app.url}/v1", api_key="unused"
    )
    expected = app.engines["embedder"].embed(DOCS)
    same_vectors(embedding.get_text_embedding_batch(DOCS), expected)


def test_openai_agents_sdk_runs_a_tool_through_the_chat_route(app: App) -> None:
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)  # its traces would go to OpenAI's servers
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        calls.append(city)
        return f"It is sunny in {city}."

    model = OpenAIChatCompletionsModel(model="tools", openai_client=app.aclient)
    agent = Agent(name="weather", instructions="", model=model, tools=[get_weather])
    result = asyncio.run(Runner.run(agent, "What is the weather like in Oslo today?"))
    assert calls == ["Oslo"]
    assert result.final_output == app.answers["after_tool"]


def test_dimensions_where_the_model_allows_it(
    app: App, scripted_root: Path, tmp_path: Path
) -> None:
    """A Matryoshka embedder (the kit's, its config marked so) gives shorter vectors; another
    refuses ``dimensions`` with vLLM's 400."""
    import json
    import shutil

    from fastapi import FastAPI

    with pytest.raises(openai.BadRequestError) as e:
        app.client.embeddings.create(model="embedder", input="x", dimensions=8)
    assert "Matryoshka" in e.value.message
    matryoshka = tmp_path / "matryoshka"
    shutil.copytree(build_embedding_model(scripted_root), matryoshka)
    config = json.loads((matryoshka / "config.json").read_text())
    (matryoshka / "config.json").write_text(json.dumps({**config, "is_matryoshka": True}))
    engine = get_engine(
        str(matryoshka), runner="pooling", **dict(app.engines["llama3"].vllm_kwargs)
    )
    server = OpenAIServer(embedding={"m": engine}, chat_page=False)
    own = FastAPI(lifespan=server.lifespan)
    server.install(own)
    try:
        with serving(own) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
            full = client.embeddings.create(model="m", input="x", encoding_format="float")
            short = client.embeddings.create(
                model="m", input="x", dimensions=8, encoding_format="float"
            )
    finally:
        engine.shutdown()
    vector = np.asarray(short.data[0].embedding)
    assert len(vector) == 8 < len(full.data[0].embedding)
    assert np.linalg.norm(vector) == pytest.approx(1.0, rel=1e-5)
