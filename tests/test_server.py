"""``vllm_inline.server`` over a real socket, read by the official ``openai`` client and by
langchain-openai's ``ChatOpenAI``, on real engines (scripted models): the chat routes, the guard,
the errors in ``vllm serve``'s shape. The pooling routes, the chat page, other clients and the
example app are in tests/test_server_*.py and tests/test_examples.py.

The servers run on the suite's shared engines (``vllm_kwargs`` are the scenario's engine options,
so ``get_engine`` hands out the engine the other modules use): their lifespan finds the engine
running and leaves it running when the server stops. One scenario's servers (uvicorn in
threads, on 127.0.0.1) run at a time; a server with options (API key, limits) runs next to its
scenario's plain one, without a lifespan.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from serving import serving
from streams import assert_token_pieces

from vllm_inline.engine import get_engine
from vllm_inline.server import Limits, create_app
from vllm_inline.server.guard import Guard

pytestmark = pytest.mark.engine

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a given city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city name"}},
            "required": ["city"],
        },
    },
}
HELLO = [{"role": "user", "content": "Hello"}]


class Served:
    """A running server for one scenario."""

    def __init__(self, s: Any, url: str, api_key: str | None = None) -> None:
        self.s = s
        self.url = url
        self.model = s.path  # the served model id is the --model given
        self.client = self.client_with(api_key or "unused")

    def client_with(self, api_key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url, api_key=api_key, max_retries=0, timeout=120)

    def chat(self, **kwargs: Any) -> Any:
        return self.client.chat.completions.create(model=self.model, **kwargs)

    def stream(self, **kwargs: Any) -> list[Any]:
        return list(self.client.chat.completions.create(model=self.model, stream=True, **kwargs))


@pytest.fixture(scope="module")
def serve(scripted: Any) -> Iterator[Callable[..., Served]]:
    """``serve("llama3")``: the server of that scenario, stopping another scenario's first;
    ``serve("llama3", api_key=..., max_n=...)``: one with those ``create_app`` options, next to
    the plain one (started first: its lifespan starts the shared engine if no test has yet)."""
    stack = contextlib.ExitStack()
    current: dict[tuple[Any, ...], Served] = {}

    def get(name: str, **options: Any) -> Served:
        key = (name, *sorted(options.items()))
        if key not in current:
            if options:
                get(name)
            elif current:
                stack.close()
                current.clear()
            s = scripted(name)
            parser = s.scenario.tool_parser  # as vllm serve is started for the model
            app = create_app(
                s.path,
                vllm_kwargs=s.engine_kwargs,
                limits=Limits(**options),
                tool_parser=parser,
                enable_auto_tool_choice=parser is not None,
            )
            url = stack.enter_context(serving(app, lifespan="off" if options else "on")) + "/v1"
            current[key] = Served(s, url, options.get("api_key"))
        return current[key]

    with stack:
        yield get


def streamed_text(chunks: list[Any], index: int = 0) -> str:
    return "".join(
        c.choices[0].delta.content or ""
        for c in chunks
        if c.choices and c.choices[0].index == index
    )


def finish_reasons(chunks: list[Any]) -> list[str]:
    return [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]


# -- every family: the right stop, no special token, no invented turn -------------------------


@pytest.mark.parametrize("name", ["gemma", "chatml", "llama3"])
def test_each_family_stops_at_its_end_of_turn(serve: Callable[[str], Served], name: str) -> None:
    srv = serve(name)
    sc = srv.s.scenario
    answer = srv.chat(messages=HELLO)
    chunks = srv.stream(messages=HELLO)
    streamed = streamed_text(chunks)
    assert answer.choices[0].message.content == sc.answer
    assert streamed == sc.answer
    assert answer.choices[0].finish_reason == "stop"
    assert finish_reasons(chunks) == ["stop"]
    for text in (answer.choices[0].message.content, streamed):
        assert not any(token in text for token in sc.special_tokens)
        assert sc.hallucinated_tail.strip() not in text


# -- llama3: streaming, usage, sampling fields, errors, disconnects ---------------------------


def test_streamed_deltas_concatenate_to_the_non_streamed_answer(
    serve: Callable[[str], Served],
) -> None:
    srv = serve("llama3")
    chunks = srv.stream(messages=HELLO)
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(texts) > 1
    assert "".join(texts) == srv.chat(messages=HELLO).choices[0].message.content
    assert_token_pieces(texts, ["The", " answer", " is", " complete", "."])  # no repeats
    first = chunks[0].choices[0].delta
    assert first.role == "assistant"
    assert all(c.choices[0].delta.role is None for c in chunks[1:] if c.choices)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert {c.id for c in chunks} == {chunks[0].id} and chunks[0].object == "chat.completion.chunk"


def test_usage_is_the_real_token_count(serve: Callable[[str], Served]) -> None:
    srv = serve("llama3")
    prompt_tokens = len(srv.s.engine.prompt_token_ids(HELLO))
    completion_tokens = 6  # "The", " answer", " is", " complete", ".", <|eot_id|>
    answer = srv.chat(messages=HELLO)
    assert answer.usage.prompt_tokens == prompt_tokens
    assert answer.usage.completion_tokens == completion_tokens
    assert answer.usage.total_tokens == prompt_tokens + completion_tokens
    chunks = srv.stream(messages=HELLO, stream_options={"include_usage": True})
    assert chunks[-1].choices == []  # OpenAI's extra usage chunk
    assert chunks[-1].usage.model_dump(exclude_none=True) == answer.usage.model_dump(
        exclude_none=True
    )
    assert all(c.usage is None for c in chunks[:-1])
    assert all(c.usage is None for c in srv.stream(messages=HELLO))  # not asked for


def test_max_tokens_gives_finish_reason_length(serve: Callable[[str], Served]) -> None:
    srv = serve("llama3")
    for field in ("max_tokens", "max_completion_tokens"):
        answer = srv.chat(messages=HELLO, **{field: 3})
        assert answer.choices[0].message.content == "The answer is"
        assert answer.choices[0].finish_reason == "length"
        assert answer.usage.completion_tokens == 3
    chunks = srv.stream(messages=HELLO, max_tokens=3)
    assert streamed_text(chunks) == "The answer is"
    assert finish_reasons(chunks) == ["length"]


def test_stop_is_the_same_streaming_and_not(serve: Callable[[str], Served]) -> None:
    srv = serve("llama3")
    answer = srv.chat(messages=HELLO, stop=[" complete"])
    assert answer.choices[0].message.content == "The answer is"
    assert answer.choices[0].finish_reason == "stop"
    chunks = srv.stream(messages=HELLO, stop=" complete")
    assert streamed_text(chunks) == "The answer is"
    assert finish_reasons(chunks) == ["stop"]


def test_openai_and_vllm_sampling_fields_pass_through(serve: Callable[[str], Served]) -> None:
    srv = serve("llama3")
    answer = srv.chat(
        messages=HELLO,
        temperature=0.7,
        top_p=0.9,
        seed=7,
        n=2,
        presence_penalty=0.1,
        extra_body={"repetition_penalty": 1.2, "top_k": 5, "min_p": 0.01},
    )
    assert [c.index for c in answer.choices] == [0, 1]
    assert [c.message.content for c in answer.choices] == ["The answer is complete."] * 2
    assert answer.usage.completion_tokens == 12  # both choices
    chunks = srv.stream(messages=HELLO, n=2)
    assert streamed_text(chunks, 0) == streamed_text(chunks, 1) == "The answer is complete."
    assert [c.choices[0].delta.role for c in chunks if c.choices[0].delta.role] == ["assistant"] * 2


def test_logprobs(serve: Callable[[str], Served]) -> None:
    srv = serve("llama3")
    answer = srv.chat(messages=HELLO, logprobs=True, top_logprobs=2)
    content = answer.choices[0].logprobs.content
    assert [lp.token for lp in content][:5] == ["The", " answer", " is", " complete", "."]
    assert all(lp.logprob <= 0 and len(lp.top_logprobs) >= 1 for lp in content)


def test_response_format_json_schema_constrains_the_answer(serve: Callable[[str], Served]) -> None:
    srv = serve("llama3")
    schema = {"type": "string", "enum": ["yes"]}
    answer = srv.chat(
        messages=HELLO,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "verdict", "schema": schema},
        },
        max_tokens=20,
    )
    assert json.loads(answer.choices[0].message.content) == "yes"


def test_multi_turn(serve: Callable[[str], Served]) -> None:
    srv = serve("llama3")
    messages = [
        {"role": "system", "content": "Be brief."},
        *HELLO,
        {"role": "assistant", "content": "The answer is complete."},
        {"role": "user", "content": [{"type": "text", "text": "Again."}]},
    ]
    answer = srv.chat(messages=messages)
    assert answer.choices[0].message.content == "The answer is complete."
    assert answer.usage.prompt_tokens == len(srv.s.engine.prompt_token_ids(messages))
    assert answer.usage.prompt_tokens > srv.chat(messages=HELLO).usage.prompt_tokens


def test_models_lists_the_served_model(serve: Callable[[str], Served]) -> None:
    srv = serve("llama3")
    assert [m.id for m in srv.client.models.list()] == [srv.model]


def test_bad_temperature_is_a_400_naming_temperature(serve: Callable[[str], Served]) -> None:
    srv = serve("llama3")
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            srv.client.chat.completions.create(
                model=srv.model, messages=HELLO, temperature=5, stream=stream
            )
        assert e.value.status_code == 400
        assert e.value.param == "temperature"
        assert "temperature=5" in e.value.message
    assert srv.chat(messages=HELLO).choices[0].message.content == "The answer is complete."


def test_other_bad_requests_are_openai_shaped(serve: Callable[[str], Served]) -> None:
    srv = serve("llama3")
    with pytest.raises(openai.NotFoundError) as e:
        srv.client.chat.completions.create(model="gpt-4o", messages=HELLO)
    assert e.value.status_code == 404 and e.value.param == "model"
    assert "The model `gpt-4o` does not exist." in e.value.message
    cases = [
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"messages": HELLO, "tool_choice": "get_time", "tools": [WEATHER_TOOL]}, "tool_choice"),
        ({"messages": HELLO, "response_format": {"type": "yaml"}}, "response_format"),
        ({"messages": HELLO, "max_tokens": 0}, "max_tokens"),
        ({"messages": HELLO, "logit_bias": {"the": 1}}, "logit_bias"),
    ]
    for body, param in cases:
        response = httpx.post(
            f"{srv.url}/chat/completions", json={"model": srv.model, **body}, timeout=60
        )
        assert response.status_code == 400, body
        error = response.json()["error"]
        assert error["type"] == "BadRequestError" and error["param"] == param
        assert error["code"] == 400
        assert error["message"]


def _wait_idle(engine: Any, timeout: float = 10.0) -> float:
    start = time.monotonic()
    while engine.num_unfinished_requests():
        assert time.monotonic() - start < timeout, "the request was not aborted"
        time.sleep(0.05)
    return time.monotonic() - start


def test_a_client_that_disconnects_aborts_its_request(serve: Callable[[str], Served]) -> None:
    srv = serve("llama3")
    engine = srv.s.engine  # the app's engine: the suite's shared one
    # ignore_eos makes the model loop over its invented turn up to max_tokens: a long request.
    body = {"model": srv.model, "messages": HELLO, "max_tokens": 400, "ignore_eos": True}
    start = time.monotonic()
    full = httpx.post(f"{srv.url}/chat/completions", json=body, timeout=120).json()
    full_s = time.monotonic() - start
    assert full["usage"]["completion_tokens"] == 400

    # Streaming: read two events, then hang up.
    stream_body = {**body, "stream": True}
    with httpx.stream("POST", f"{srv.url}/chat/completions", json=stream_body, timeout=60) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        start = time.monotonic()
        assert engine.num_unfinished_requests() == 1
    stream_abort_s = _wait_idle(engine) + (time.monotonic() - start)
    assert stream_abort_s < full_s

    # Not streaming: the client gives up (timeout) while the answer is being generated.
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{srv.url}/chat/completions", json=body, timeout=httpx.Timeout(60, read=0.3))
    abort_s = _wait_idle(engine)
    assert abort_s < full_s
    print(
        f"400 tokens: {full_s:.2f} s; aborted after a disconnect within {stream_abort_s:.2f} s "
        f"(streaming), {abort_s:.2f} s (not streaming)"
    )
    assert srv.chat(messages=HELLO).choices[0].message.content == "The answer is complete."
    assert engine.num_unfinished_requests() == 0


def test_chat_openai_against_the_app(serve: Callable[[str], Served]) -> None:
    from langchain_openai import ChatOpenAI

    srv = serve("llama3")
    llm = ChatOpenAI(
        model=srv.model, base_url=srv.url, api_key="unused", max_retries=0, stream_usage=True
    )
    message = llm.invoke("Hello")
    assert message.content == "The answer is complete."
    assert message.response_metadata["finish_reason"] == "stop"
    hello = [{"role": "user", "content": "Hello"}]
    prompt_tokens = len(srv.s.engine.prompt_token_ids(hello))
    assert message.usage_metadata["input_tokens"] == prompt_tokens
    assert message.usage_metadata["output_tokens"] == 6
    chunks = list(llm.stream("Hello"))
    assert len([c for c in chunks if c.content]) > 1
    assert "".join(c.content for c in chunks) == message.content
    total = chunks[0]
    for c in chunks[1:]:
        total += c
    assert total.usage_metadata == message.usage_metadata
    short = llm.bind(max_tokens=3).invoke("Hello")
    assert short.content == "The answer is" and short.response_metadata["finish_reason"] == "length"


# -- llama3, locked: the API key, the body size, the caps -------------------------------------

KEY = "sk-test-key"
LOCKED = {"api_key": KEY, "max_body_bytes": 4096, "max_tokens_cap": 4, "max_n": 2}


def test_an_api_key_locks_v1_but_not_health(serve: Callable[..., Served]) -> None:
    srv = serve("llama3", **LOCKED)
    with pytest.raises(openai.AuthenticationError) as e:
        srv.client_with("sk-wrong").chat.completions.create(model=srv.model, messages=HELLO)
    assert e.value.status_code == 401
    assert "Unauthorized: the API key is not valid." in e.value.message
    body = {"model": srv.model, "messages": HELLO}
    for headers in ({}, {"Authorization": f"Basic {KEY}"}, {"Authorization": KEY}):
        response = httpx.post(f"{srv.url}/chat/completions", json=body, headers=headers)
        assert response.status_code == 401, headers
        error = response.json()["error"]
        assert error["type"] == "Unauthorized" and error["param"] is None
        assert error["code"] == 401 and error["message"].startswith("Unauthorized")
        assert response.headers["www-authenticate"] == "Bearer"
    assert httpx.get(f"{srv.url}/models").status_code == 401
    # The key is checked before the body is read: an oversize body without it is a 401.
    assert httpx.post(f"{srv.url}/chat/completions", content=b"x" * 10_000).status_code == 401
    assert httpx.get(srv.url.removesuffix("/v1") + "/health").status_code == 200

    # The right key. max_tokens_cap=4 also caps the default (the answer takes 6 tokens).
    answer = srv.chat(messages=HELLO)
    assert answer.choices[0].message.content == "The answer is complete"
    assert answer.choices[0].finish_reason == "length"
    assert streamed_text(srv.stream(messages=HELLO, max_tokens=3)) == "The answer is"
    assert [m.id for m in srv.client.models.list()] == [srv.model]


FASTAPI_DOCS = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
"""FastAPI's own documentation of the app (no model runs, nothing stored is read): the app's,
not the server's (``OpenAIServer.install`` guards the routes it installs)."""


def test_the_key_guards_every_route_of_the_server_but_the_public_ones(
    serve: Callable[..., Served],
) -> None:
    """The whole route table, walked: without the key every route of the server is a 401 but
    the ones ``guard.PUBLIC`` lists (each with its reason) and FastAPI's own documentation;
    with it, none is. A route added later without the guard fails here."""
    from starlette.routing import Route

    from vllm_inline.server.guard import PUBLIC

    srv = serve("llama3", **LOCKED)
    base = srv.url.removesuffix("/v1")
    table = create_app("any/model", limits=Limits(api_key=KEY)).router.routes  # the same table
    walked = []
    for route in table:
        assert isinstance(route, Route), route
        path = route.path.replace("{response_id}", "resp_unknown")
        for method in sorted((route.methods or set()) - {"HEAD"}):
            walked.append(path)
            body = {} if method == "POST" else None
            without = httpx.request(method, base + path, json=body, timeout=60)
            if path in PUBLIC or path in FASTAPI_DOCS:
                assert without.status_code != 401, (method, path)
            else:
                assert without.status_code == 401, (method, path, without.text)
                assert without.json()["error"]["code"] == 401
            auth = {"Authorization": f"Bearer {KEY}"}
            with_key = httpx.request(method, base + path, json=body, headers=auth, timeout=60)
            assert with_key.status_code != 401, (method, path)
    # What vllm serve leaves open (its security page; vLLM issues 18892, 42591, 58144): not here.
    assert {"/rerank", "/v2/rerank", "/score", "/tokenize", "/detokenize"} <= set(walked)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/chat/completions", '{"model": "\\udc80", "messages": []}', "body.model"),
        ("/chat/completions", '{"messages": [], "stop": ["x", "\\udc80"]}', "body.stop.1"),
        ("/completions", '{"prompt": "Once", "stop": "\\udc80"}', "body.stop"),
        ("/responses", '{"model": "\\udc80", "input": "Hi"}', "body.model"),
        (
            "/responses",
            '{"input": [{"role": "user", "content": "\\ud800"}]}',
            "body.input.0.content",
        ),
        ("/embeddings", '{"input": ["\\udfff"]}', "body.input.0"),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_the_field(
    serve: Callable[..., Served], path: str, body: str, param: str
) -> None:
    """Valid JSON (a ``\\u`` escape of half a surrogate pair) that is no Unicode text: a 400
    in OpenAI's error shape naming the field, before the engine, which answers right after."""
    srv = serve("llama3")
    sent = httpx.post(srv.url + path, content=body, headers={"content-type": "application/json"})
    assert sent.status_code == 400, sent.text
    error = sent.json()["error"]
    assert error["param"] == param and "surrogate" in error["message"], error
    assert srv.chat(messages=HELLO).choices[0].message.content == srv.s.scenario.answer


def test_an_oversize_body_is_a_413_naming_the_limit(serve: Callable[..., Served]) -> None:
    srv = serve("llama3", **LOCKED)
    big = [{"role": "user", "content": "x" * 5000}]
    with pytest.raises(openai.APIStatusError) as e:
        srv.chat(messages=big)
    assert e.value.status_code == 413
    assert "limit of 4096 bytes" in e.value.message
    assert e.value.type == "Request Entity Too Large"

    # A chunked body has no Content-Length: its bytes are counted as they arrive.
    def chunked(body: dict[str, Any]) -> Iterator[bytes]:
        data = json.dumps({"model": srv.model, **body}).encode()
        yield from (data[i : i + 1000] for i in range(0, len(data), 1000))

    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    url = f"{srv.url}/chat/completions"
    response = httpx.post(url, content=chunked({"messages": big}), headers=headers, timeout=60)
    assert "content-length" not in response.request.headers
    assert response.status_code == 413
    assert response.json()["error"]["code"] == 413
    response = httpx.post(url, content=chunked({"messages": HELLO}), headers=headers, timeout=60)
    assert response.json()["choices"][0]["message"]["content"] == "The answer is complete"


def test_max_tokens_and_n_over_the_caps_are_400s_naming_them(serve: Callable[..., Served]) -> None:
    srv = serve("llama3", **LOCKED)
    for field, value in (("max_tokens", 5), ("max_completion_tokens", 5), ("n", 3)):
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as e:
                srv.client.chat.completions.create(
                    model=srv.model, messages=HELLO, stream=stream, **{field: value}
                )
            assert e.value.param == field
            assert f"{field}={value} is invalid: at most " in e.value.message
    answer = srv.chat(messages=HELLO, n=2, max_completion_tokens=4)
    assert [c.message.content for c in answer.choices] == ["The answer is complete"] * 2


# -- chatml_tools: tool calls, and the multi-turn tool loop -----------------------------------


def test_a_tool_call_comes_back_as_tool_calls(serve: Callable[[str], Served]) -> None:
    srv = serve("chatml_tools")
    ask = [{"role": "user", "content": "What is the weather like in Oslo today?"}]
    answer = srv.chat(messages=ask, tools=[WEATHER_TOOL])
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}

    chunks = srv.stream(messages=ask, tools=[WEATHER_TOOL], tool_choice="auto")
    fragments = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or ()]
    assert fragments[0].function.name == "get_weather" and fragments[0].id
    assert json.loads("".join(f.function.arguments or "" for f in fragments)) == {"city": "Oslo"}
    assert finish_reasons(chunks) == ["tool_calls"]
    assert "<tool_call>" not in streamed_text(chunks)

    # The second turn: the tool's result goes back, the model answers from it.
    history = [
        *ask,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "It is sunny in Oslo."},
    ]
    final = srv.chat(messages=history, tools=[WEATHER_TOOL])
    assert final.choices[0].message.content == "The weather in Oslo is sunny."
    assert final.choices[0].finish_reason == "stop"
    assert (
        streamed_text(srv.stream(messages=history, tools=[WEATHER_TOOL]))
        == "The weather in Oslo is sunny."
    )


def test_chat_openai_bind_tools_against_the_app(serve: Callable[[str], Served]) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    srv = serve("chatml_tools")
    llm = ChatOpenAI(model=srv.model, base_url=srv.url, api_key="unused", max_retries=0)
    with_tools = llm.bind_tools([WEATHER_TOOL])
    ask = HumanMessage("What is the weather like in Oslo today?")
    message = with_tools.invoke([ask])
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [
        ("get_weather", {"city": "Oslo"})
    ]
    streamed = None
    for chunk in with_tools.stream([ask]):
        streamed = chunk if streamed is None else streamed + chunk
    assert [(c["name"], c["args"]) for c in streamed.tool_calls] == [
        ("get_weather", {"city": "Oslo"})
    ]
    result = ToolMessage("It is sunny in Oslo.", tool_call_id=message.tool_calls[0]["id"])
    assert with_tools.invoke([ask, message, result]).content == "The weather in Oslo is sunny."


# -- the guard alone: a fake ASGI app behind it, no server, no engine -------------------------


def guarded(path: str, headers: dict[str, str], messages: list[dict[str, Any]]) -> dict[str, Any]:
    """``messages`` sent through ``Guard(app, KEY, 100)`` to a fake app; what happened."""
    guard_class = Guard
    seen: list[Any] = []
    incoming = list(messages)
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while not seen or seen[-1].get("more_body"):  # the body, as Starlette reads it
            seen.append(await receive())
        seen.append(await receive())  # then what the server has next: the disconnect
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def receive() -> dict[str, Any]:
        return incoming.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    scope = {"type": "http", "method": "POST", "path": path, "root_path": "", "headers": raw}
    asyncio.run(guard_class(app, api_key=KEY, max_body_bytes=100)(scope, receive, send))
    return {"status": sent[0]["status"], "app_saw": seen, "unread": len(incoming)}


def test_the_guard_refuses_before_the_app_and_replays_the_body() -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    disconnect = {"type": "http.disconnect"}

    def chunks(n: int, size: int) -> list[dict[str, Any]]:
        part = {"type": "http.request", "body": b"x" * size, "more_body": True}
        return [*[part] * (n - 1), {**part, "more_body": False}, disconnect]

    # Over the limit in the third of four chunks: refused there, the fourth never read.
    assert guarded("/v1/chat/completions", auth, chunks(4, 40)) == {
        "status": 413,
        "app_saw": [],
        "unread": 2,
    }
    assert guarded("/v1/chat/completions", {**auth, "Content-Length": "101"}, chunks(1, 101)) == {
        "status": 413,
        "app_saw": [],
        "unread": 2,
    }
    # Under it: the app reads the same messages, then the disconnect from the server.
    assert guarded("/v1/chat/completions", auth, chunks(3, 30)) == {
        "status": 200,
        "app_saw": chunks(3, 30),
        "unread": 0,
    }
    # No key or a wrong one: nothing read, the app never called; /health needs no key.
    for headers in ({}, {"Authorization": "Bearer sk-wrong"}):
        assert guarded("/v1/models", headers, chunks(1, 0)) == {
            "status": 401,
            "app_saw": [],
            "unread": 2,
        }
    assert guarded("/health", {}, chunks(1, 0))["status"] == 200


def test_the_api_key_comes_from_the_flag_else_vllm_api_key(
    scripted: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    from vllm_inline.cli import main

    apps: list[Any] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: apps.append(app))
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    path = scripted("llama3").path
    assert main(["serve", "--model", path]) == 0
    assert main(["serve", "--model", path, "--api-key", "from-flag"]) == 0
    guards = [m.kwargs for app in apps for m in app.user_middleware if m.cls is Guard]
    assert [g["api_key"] for g in guards] == ["from-env", "from-flag"]
    with pytest.raises(ValueError, match=r"max_n=0 is invalid"):
        Limits(max_n=0)


async def test_the_lifespan_stops_only_an_engine_it_started(scripted: Any) -> None:
    s = scripted("llama3")
    s.engine.start()  # running already, as for every test on the suite's engines
    shared = create_app(s.path, vllm_kwargs=s.engine_kwargs)
    async with shared.router.lifespan_context(shared):
        assert s.engine.started
    assert s.engine.started  # the suite's engine: other users in this process keep it
    own_options = {**s.engine_kwargs, "max_num_seqs": 3}  # another engine of the same model
    own = create_app(s.path, vllm_kwargs=own_options)
    engine = get_engine(s.path, **own_options)
    try:
        assert not engine.started
        async with own.router.lifespan_context(own):
            assert engine.started
        assert not engine.started
    finally:
        engine.shutdown()
