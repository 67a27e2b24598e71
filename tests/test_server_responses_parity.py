"""Wire parity of ``/v1/responses`` with ``vllm serve`` (issue 57): the same requests to vLLM's
own server and to ``vllm_inline.server``, on the same scripted models with the same engine
options, give the same response objects (field by field: ids, timestamps aside), the same
stream events in the same order, and the same status for the same bad input. vLLM's side runs
with ``VLLM_ENABLE_RESPONSES_API_STORE=1`` (its store is off by default) and, for the reasoning
model, ``--reasoning-parser qwen3``. ``make test-server`` runs this module.

Where ours differs on purpose, the comparison says so in a comment marked ALLOWED.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from serving import serving
from test_server_parity import assert_same, usage_as_vllm, vllm_server, wait_healthy

from vllm_inline.engine import get_engine, start_engines
from vllm_inline.server import OpenAIServer
from vllm_inline.server.responses import MemoryResponseStore

pytestmark = [pytest.mark.engine, pytest.mark.server]

ROUTE = "/v1/responses"
VARYING = {"id", "created_at", "call_id", "item_id", "sequence_number"}
"""Values that differ between any two requests or servers (left out on both sides)."""
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a given city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]},
}  # fmt: skip
ASK = "How is the weather in Oslo?"


def without_varying(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_varying(v) for k, v in value.items() if k not in VARYING}
    if isinstance(value, list):
        return [without_varying(v) for v in value]
    return value


def as_vllm(
    ours: dict[str, Any], theirs: dict[str, Any], body: dict[str, Any], key: str
) -> dict[str, Any]:
    """Ours, with the differences listed here made as vLLM's."""
    ours = dict(ours)
    if body.get("max_output_tokens") is None:
        # ALLOWED: without max_output_tokens vLLM reports the room left in the context
        # (max_model_len - prompt tokens), ours the engine's default cap (512, or
        # --max-tokens-cap): the prompt is not rendered before the response starts.
        ours["max_output_tokens"] = theirs["max_output_tokens"]
    # ALLOWED: vLLM echoes each tool through the openai SDK's FunctionTool, with the fields of
    # the SDK version installed (allowed_callers, defer_loading, output_schema: null); ours
    # echoes the fields the API has always had.
    ours["tools"] = sdk_fields(ours["tools"], theirs["tools"])
    if ours.get("usage") and theirs.get("usage"):
        usage = ours["usage"] = {**ours["usage"]}
        details = usage["input_tokens_details"] = {**usage["input_tokens_details"]}
        # ALLOWED: vLLM's details also hold its built-in tools' per-turn lists and
        # tool_output_tokens, which OpenAI's API does not define and the Agents SDK for
        # JavaScript refuses (a number is all its schema takes there): ours leave them out.
        for name in ("input_tokens_details", "output_tokens_details"):
            extra = {k: v for k, v in theirs["usage"][name].items() if k not in usage[name]}
            usage[name] = {**usage[name], **extra}
        details = usage["input_tokens_details"]
        # ALLOWED: vLLM counts the prompt tokens its prefix cache newly stored; vLLM's engine
        # gives a front end no such count, ours reports 0.
        details["cache_write_tokens"] = theirs["usage"]["input_tokens_details"][
            "cache_write_tokens"
        ]
        if key == "chat":
            # ALLOWED: vLLM's Responses route tokenizes the rendered prompt with the
            # tokenizer's special tokens added (TokenizeParams' default), so a template that
            # starts with <|begin_of_text|> (Llama 3) gets a second one: one more input token
            # than its own chat route, which ours and vLLM's chat route agree on.
            assert theirs["usage"]["input_tokens"] == usage["input_tokens"] + 1
            usage["input_tokens"] += 1
            usage["total_tokens"] += 1
    return ours


def sdk_fields(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Our tools with the fields vLLM's echo adds to each (a namespace's tools too)."""
    out = []
    for mine, vllm in zip(ours, theirs):
        tool = {**mine, **{k: v for k, v in vllm.items() if k not in mine}}
        if isinstance(mine.get("tools"), list):
            tool["tools"] = sdk_fields(mine["tools"], vllm["tools"])
        out.append(tool)
    return out


class Pair:
    def __init__(self, vllm: str, ours: str, model: str) -> None:
        self.urls = {"vllm": vllm, "ours": ours}
        self.model = model

    def post(self, side: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(self.urls[side] + ROUTE, json={"model": self.model, **body}, timeout=300)

    def both(self, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        answers = [self.post(side, body) for side in ("vllm", "ours")]
        for side, answer in zip(("vllm", "ours"), answers):
            assert answer.status_code == 200, (side, answer.text)
        return answers[0].json(), answers[1].json()

    def streams(self, body: dict[str, Any]) -> tuple[list[Any], list[Any]]:
        out = []
        for side in ("vllm", "ours"):
            payload = {"model": self.model, **body, "stream": True}
            with httpx.stream("POST", self.urls[side] + ROUTE, json=payload, timeout=300) as r:
                assert r.status_code == 200, (side, r.read())
                out.append([json.loads(line[6:]) for line in r.iter_lines()
                            if line.startswith("data: ")])  # fmt: skip
        return out[0], out[1]


@pytest.fixture(scope="module")
def pairs(scripted: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Pair]]:
    from fastapi import FastAPI

    options = scripted("llama3").engine_kwargs
    paths = {key: scripted(name).path
             for key, name in (("chat", "llama3"), ("tools", "chatml_tools"),
                               ("reasoning", "chatml_reasoning"))}  # fmt: skip
    flags = {
        "chat": [],
        "tools": ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
        "reasoning": ["--reasoning-parser", "qwen3"],
    }
    engines = {key: get_engine(path, **options) for key, path in paths.items()}
    logs = tmp_path_factory.mktemp("vllm-serve-responses")
    with contextlib.ExitStack() as stack:
        store_on = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}  # vLLM's Responses store
        servers = {key: stack.enter_context(vllm_server(path, options, flags[key], logs / key,
                                                        store_on))
                   for key, path in paths.items()}  # fmt: skip
        start_engines(*engines.values())
        server = OpenAIServer(
            chat={paths[k]: e for k, e in engines.items()},
            responses_store=MemoryResponseStore(),
            reasoning_parser={paths["reasoning"]: "qwen3"},
            tool_parser={paths["tools"]: "hermes"},  # as its vllm serve is started
            enable_auto_tool_choice=True,
        )
        app = FastAPI(lifespan=server.lifespan)
        server.install(app)
        ours = stack.enter_context(serving(app))
        for key, (proc, url) in servers.items():
            wait_healthy(proc, url, logs / key)
        yield {key: Pair(servers[key][1], ours, path) for key, path in paths.items()}


def assert_same_response(
    vllm: dict[str, Any], ours: dict[str, Any], body: dict[str, Any], key: str
) -> None:
    assert_same(without_varying(vllm), without_varying(as_vllm(ours, vllm, body, key)))


CASES = {  # case: (model, body)
    "text": ("chat", {"input": "Hello"}),
    "instructions and message items": ("chat", {
        "instructions": "Be brief.",
        "input": [{"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": "Hello"}]}],
    }),
    "max_output_tokens": ("chat", {"input": "Hello", "max_output_tokens": 3}),
    "json_schema": ("chat", {"input": "Hello", "max_output_tokens": 8, "temperature": 0,
                             "text": {"format": {"type": "json_schema", "name": "w",
                                                 "schema": WEATHER["parameters"]}}}),
    "a function call": ("tools", {"input": ASK, "tools": [WEATHER]}),
    "reasoning": ("reasoning", {"input": "Hi"}),
    # Issue 65: a namespace's tools flattened to <namespace>__<name> in the prompt (the same
    # input tokens), hosted tools dropped, the call to the plain function as a function_call.
    "namespace and hosted tools": ("tools", {"input": ASK, "tools": [
        {"type": "web_search"},
        {"type": "namespace", "name": "weather", "description": "Weather tools",
         "tools": [{**WEATHER, "name": "forecast"}]},
        WEATHER,
    ]}),
    # A custom tool as vLLM's one-string shim; the model's call to it a custom_tool_call whose
    # input is the arguments it wrote (not the shim's {"input": ...}: passed through whole).
    "a custom tool": ("tools", {"input": ASK, "tools": [
        {"type": "custom", "name": "get_weather", "description": "Weather by city"}]}),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_response(pairs: dict[str, Pair], case: str) -> None:
    key, body = CASES[case]
    vllm, ours = pairs[key].both(body)
    assert_same_response(vllm, ours, body, key)
    assert ours["output"]


def shape(events: list[dict[str, Any]]) -> list[tuple[str, int | None]]:
    """Event types in order, one per run of deltas of an item (ours may join deltas)."""
    out: list[tuple[str, int | None]] = []
    for e in events:
        step = (e["type"], e.get("output_index"))
        if not (out and step == out[-1] and step[0].endswith(".delta")):
            out.append(step)
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_streamed_events(pairs: dict[str, Pair], case: str) -> None:
    key, body = CASES[case]
    vllm, ours = pairs[key].streams(body)

    theirs_last, ours_last = vllm[-1], ours[-1]
    if ours_last["type"] == "response.incomplete":
        # ALLOWED: an answer cut by max_output_tokens ends with OpenAI's response.incomplete;
        # vLLM sends response.completed there too (with the same status "incomplete").
        assert theirs_last["type"] == "response.completed"
        ours = [*ours[:-1], {**ours_last, "type": "response.completed"}]
    assert shape(vllm) == shape(ours)
    assert [e["sequence_number"] for e in ours] == list(range(len(ours)))

    def items(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The events that open and close items and parts, field by field (the deltas are
        compared joined, in their .done events)."""
        return [e for e in events if "response" not in e and not e["type"].endswith(".delta")]

    for theirs_event, our_event in zip(items(vllm), items(ours), strict=True):
        assert_same(without_varying(theirs_event), without_varying(our_event))
    assert_same_response(vllm[-1]["response"], ours[-1]["response"], body, key)
    assert_same_response(vllm[0]["response"], ours[0]["response"], body, key)


def test_the_answer_after_the_tool(pairs: dict[str, Pair]) -> None:
    """The second turn of a tool loop, by items (how agents send it), on both servers."""
    pair = pairs["tools"]
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather",
            "arguments": '{"city": "Oslo"}'}  # fmt: skip
    output = {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}
    body = {"input": [{"role": "user", "content": ASK}, call, output], "tools": [WEATHER]}
    vllm, ours = pair.both(body)
    assert_same_response(vllm, ours, body, "tools")
    assert ours["output"][0]["content"][0]["text"] == "The weather in Oslo is sunny."


def test_previous_response_id(pairs: dict[str, Pair]) -> None:
    pair = pairs["chat"]
    firsts = pair.both({"input": "Hello"})
    seconds = [pair.post(side, {"input": "Again?", "previous_response_id": first["id"]}).json()
               for side, first in zip(("vllm", "ours"), firsts)]  # fmt: skip
    body = {"input": "Again?", "previous_response_id": "x"}
    for side in seconds:
        side["previous_response_id"] = "x"
    assert_same_response(seconds[0], seconds[1], body, "chat")
    assert seconds[1]["usage"]["input_tokens"] > firsts[1]["usage"]["input_tokens"]


SAME = "same"
ERRORS = {  # case: (body, vLLM's param or SAME as ours, ours)
    # ALLOWED (param): vLLM names response_id, ours the request's field.
    "unknown previous response": ({"input": "Hi", "previous_response_id": "resp_x"},
                                  "response_id", "previous_response_id"),
    "no input": ({}, "body.input", "body.input"),
    # ALLOWED (param): vLLM's is the first of its 238 union errors (body.input); ours names
    # the item's type.
    "an unknown item type": ({"input": [{"type": "no_such_item"}]}, "body.input",
                             "body.input.0.type"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(ERRORS))
def test_bad_input(pairs: dict[str, Pair], case: str) -> None:
    body, theirs_param, our_param = ERRORS[case]
    vllm, ours = (pairs["chat"].post(side, body) for side in ("vllm", "ours"))
    assert ours.status_code == vllm.status_code >= 400, (vllm.text, ours.text)
    theirs, mine = vllm.json()["error"], ours.json()["error"]
    assert theirs["type"] == mine["type"], (theirs, mine)
    assert theirs["param"] == (our_param if theirs_param is SAME else theirs_param), theirs
    assert mine["param"] == our_param


def test_a_tool_output_for_a_call_never_made(pairs: dict[str, Pair]) -> None:
    """ALLOWED: ours refuses it (400 naming body.input, nothing generated); vLLM renders the
    orphan tool message and answers."""
    body = {"input": [{"type": "function_call_output", "call_id": "call_x", "output": "sunny"}]}
    vllm, ours = (pairs["chat"].post(side, body) for side in ("vllm", "ours"))
    assert vllm.status_code == 200, vllm.text
    assert ours.status_code == 400 and ours.json()["error"]["param"] == "body.input"


def test_get_and_cancel(pairs: dict[str, Pair]) -> None:
    pair = pairs["chat"]
    vllm, ours = pair.both({"input": "Hello"})
    for side, answer in (("vllm", vllm), ("ours", ours)):
        got = httpx.get(f"{pair.urls[side]}{ROUTE}/{answer['id']}", timeout=30)
        assert got.status_code == 200 and got.json()["output"] == answer["output"]
    statuses = [
        (httpx.get(f"{pair.urls[side]}{ROUTE}/resp_nope", timeout=30).status_code,
         httpx.post(f"{pair.urls[side]}{ROUTE}/{answer['id']}/cancel", timeout=30).status_code)
        for side, answer in (("vllm", vllm), ("ours", ours))
    ]  # fmt: skip
    assert statuses[0] == statuses[1] == (404, 400)


def test_background(pairs: dict[str, Pair]) -> None:
    pair = pairs["chat"]
    body = {"input": "Hello", "background": True}
    queued = pair.both(body)
    assert_same_response(*queued, body, "chat")
    finals = []
    for side, answer in zip(("vllm", "ours"), queued):
        deadline = time.monotonic() + 60
        while True:
            got = httpx.get(f"{pair.urls[side]}{ROUTE}/{answer['id']}", timeout=30).json()
            if got["status"] != "queued" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        finals.append(got)
    assert finals[1]["status"] == "completed"
    assert_same_response(*finals, body, "chat")


def test_a_background_stream_and_its_resumption(pairs: dict[str, Pair]) -> None:
    """``background`` with ``stream``: the same events as a stream, and ``GET ...?stream=true
    &starting_after=N`` sends those after the Nth on both servers."""
    pair = pairs["chat"]
    body = {"input": "Hello", "background": True}
    vllm, ours = pair.streams(body)
    assert shape(vllm) == shape(ours)
    assert_same_response(vllm[-1]["response"], ours[-1]["response"], {**body, "stream": True},
                         "chat")  # fmt: skip
    tails = []
    for side, events in (("vllm", vllm), ("ours", ours)):
        url = f"{pair.urls[side]}{ROUTE}/{events[0]['response']['id']}"
        query = {"stream": "true", "starting_after": 3}
        with httpx.stream("GET", url, params=query, timeout=60) as r:
            assert r.status_code == 200, (side, r.read())
            tails.append([json.loads(line[6:]) for line in r.iter_lines()
                          if line.startswith("data: ")])  # fmt: skip
    assert shape(tails[0]) == shape(tails[1])
    assert tails[1] == ours[4:]
    # ALLOWED: a GET with stream of a response not streamed in the background: vLLM 0.32
    # sends a 200 and then breaks the connection (its "Unknown response_id" error is raised
    # after the headers went out); ours is a 400 naming stream and saying why.
    plain = pair.post("ours", {"input": "Hello"}).json()["id"]
    refused = httpx.get(f"{pair.urls['ours']}{ROUTE}/{plain}", params={"stream": "true"},
                        timeout=30)  # fmt: skip
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "stream"


def test_the_reasoning_parser_on_the_chat_route(pairs: dict[str, Pair]) -> None:
    """The same --reasoning-parser parts the chat answer's message.reasoning on both."""
    pair = pairs["reasoning"]
    body = {"model": pair.model, "messages": [{"role": "user", "content": "Hi"}]}
    vllm, ours = (
        httpx.post(pair.urls[side] + "/v1/chat/completions", json=body, timeout=300).json()
        for side in ("vllm", "ours")
    )
    # ALLOWED: vLLM's chat route counts the reasoning tokens with a reasoning parser on
    # (completion_tokens_details.reasoning_tokens); ours leaves completion_tokens_details null
    # there, as it always has (the Responses route counts them).
    assert vllm["usage"]["completion_tokens_details"] == {"reasoning_tokens": 3}
    assert ours["usage"]["completion_tokens_details"] is None
    vllm["usage"]["completion_tokens_details"] = None
    assert_same(vllm, usage_as_vllm(ours))
    assert ours["choices"][0]["message"]["reasoning"].strip() == "Need to think"
