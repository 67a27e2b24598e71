"""An OpenAI Agents SDK tool loop through ``/v1/responses``: ``python -m vllm_inline serve``
against ``vllm serve`` on the same scripted model, and the response store's cost per turn at
``serve --workers 2``. A BENCHMARK HARNESS, NOT A TEST.

The model is the test kit's ``chatml_tools`` (Qwen's ChatML, the ``hermes`` tool parser): asked
for the weather it calls ``get_weather``, and answers once the prompt holds the tool's result.
A conversation is 3 user turns through ``Runner.run_streamed`` with the SDK's default Responses
model (``OpenAIResponsesModel``): the first turn runs the tool (two model calls), the next two
answer (one each). Per turn: the first text token (the first ``response.output_text.delta`` the
SDK yields, from the turn's start) and the turn's time (to its end). Each server runs alone, one
after the other, on the same engine options.

The store's cost per turn, at 2 workers of ``serve``: (1) the same loop resending the whole
conversation with ``store: false`` against chaining the turns with ``previous_response_id``
(``auto_previous_response_id``: each turn reads the previous response and stores its own);
(2) the store alone, two processes on one file at once, a ``put`` and a ``get`` of the loop's
last conversation, as the two workers do per turn.

    python benchmarks/responses_agents.py [--conversations 5] [--out benchmarks/results/responses_agents.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import httpx
from report import aligned, machine, now_utc, versions, write_json
from servers import USER_ENV, free_port, start_server, stop_server, wait_healthy

QUESTIONS = ("What is the weather like in Oslo today?", "And tomorrow?", "Thanks. Anything else?")


@contextlib.contextmanager
def ours(model: str, options: dict[str, Any], workers: int, store: pathlib.Path,
         log: pathlib.Path) -> Iterator[str]:  # fmt: skip
    port = free_port()
    command = [
        sys.executable, "-m", "vllm_inline", "serve", "--model", model, "--served-model-name",
        "tools", "--port", str(port), "--workers", str(workers), "--responses-store", str(store),
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",  # as vllm serve's below
        "--vllm-kwargs", json.dumps(options),
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, process_group=0,
                                env={**USER_ENV, "VLLM_LOGGING_LEVEL": "WARNING"})  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(f"{url}/health", proc, timeout=600)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextlib.contextmanager
def vllm_serve(model: str, options: dict[str, Any], log: pathlib.Path) -> Iterator[str]:
    port = free_port()
    extra = ["--served-model-name", "tools", "--enable-auto-tool-choice",
             "--tool-call-parser", "hermes"]  # fmt: skip
    proc = start_server(model, port, options, log, extra)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc, timeout=600)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_server(proc)


async def conversation(url: str, *, store: bool, chain: bool) -> list[dict[str, float]]:
    """One 3-turn conversation; per turn its first text token and its time, in ms."""
    import openai
    from agents import Agent, ModelSettings, RunConfig, Runner, function_tool
    from agents.models.openai_provider import OpenAIProvider

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return f"It is sunny in {city}."

    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    config = RunConfig(
        model_provider=OpenAIProvider(openai_client=client, use_responses=True),
        tracing_disabled=True,
    )
    agent = Agent(name="weather", instructions="", model="tools", tools=[get_weather],
                  model_settings=ModelSettings(store=store))  # fmt: skip
    history: list[Any] = []
    previous: str | None = None
    turns = []
    for question in QUESTIONS:
        start = time.perf_counter()
        first = None
        if chain:
            result = Runner.run_streamed(agent, question, run_config=config,
                                         previous_response_id=previous,
                                         auto_previous_response_id=True)  # fmt: skip
        else:
            turn_input = [*history, {"role": "user", "content": question}]
            result = Runner.run_streamed(agent, turn_input, run_config=config)
        async for event in result.stream_events():
            if (first is None and event.type == "raw_response_event"
                    and event.data.type == "response.output_text.delta"):  # fmt: skip
                first = time.perf_counter()
        end = time.perf_counter()
        assert result.final_output, "no answer"
        history = result.to_input_list()
        previous = result.last_response_id
        turns.append({"first_token_ms": ((first or end) - start) * 1e3,
                      "turn_ms": (end - start) * 1e3})  # fmt: skip
    await client.close()
    return turns


def loops(
    url: str, conversations: int, *, store: bool = False, chain: bool = False
) -> dict[str, Any]:
    asyncio.run(conversation(url, store=store, chain=chain))  # warm-up, not counted
    runs = [asyncio.run(conversation(url, store=store, chain=chain)) for _ in range(conversations)]
    out: dict[str, Any] = {}
    for turn in range(len(QUESTIONS)):
        for key in ("first_token_ms", "turn_ms"):
            out[f"turn {turn + 1} {key}"] = statistics.median(r[turn][key] for r in runs)
    return out


STORE_CHILD = """
import json, sys, time
from vllm_inline.server.responses import SQLiteResponseStore, StoredResponse
path, record, rounds, name = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
store = SQLiteResponseStore(path)
puts, gets = [], []
for k in range(rounds):
    response = {**record["response"], "id": f"resp_{name}_{k}"}
    t = time.perf_counter(); store.put(StoredResponse(response, record["messages"]))
    puts.append(time.perf_counter() - t)
    t = time.perf_counter(); store.get(response["id"]); gets.append(time.perf_counter() - t)
puts.sort(); gets.sort()
print(json.dumps({"put_ms": puts[len(puts) // 2] * 1e3, "get_ms": gets[len(gets) // 2] * 1e3}))
"""


def store_alone(url: str, path: pathlib.Path, rounds: int = 200) -> dict[str, Any]:
    """A put and a get per turn, two processes on one file at once (the two workers)."""
    last = httpx.post(f"{url}/v1/responses", json={"model": "tools", "input": QUESTIONS[0],
                                                    "store": True}, timeout=60).json()  # fmt: skip
    from vllm_inline.server.responses import SQLiteResponseStore

    record = SQLiteResponseStore(path).get(last["id"])
    assert record is not None
    payload = json.dumps({"response": record.response, "messages": record.messages})
    children = [
        subprocess.Popen([sys.executable, "-c", STORE_CHILD, str(path), payload, str(rounds), n],
                         stdout=subprocess.PIPE, text=True)
        for n in ("a", "b")
    ]  # fmt: skip
    results = [json.loads(c.communicate(timeout=300)[0]) for c in children]
    return {
        "record_bytes": len(payload),
        "put_ms": statistics.mean(r["put_ms"] for r in results),
        "get_ms": statistics.mean(r["get_ms"] for r in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=5)
    parser.add_argument("--out", default=str(HERE / "results" / "responses_agents.json"))
    args = parser.parse_args()
    from vllm_inline.testing import CPU_TEST_ENGINE_KWARGS, scripted_model

    options = dict(CPU_TEST_ENGINE_KWARGS)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="responses-bench-") as tmp:
        work = pathlib.Path(tmp)
        model = scripted_model("chatml_tools", work / "models").path
        with ours(model, options, 1, work / "one.sqlite3", work / "ours.log") as url:
            results["vllm-inline serve"] = loops(url, args.conversations)
        with vllm_serve(model, options, work / "vllm.log") as url:
            results["vllm serve"] = loops(url, args.conversations)
        store = work / "two.sqlite3"
        with ours(model, options, 2, store, work / "ours2.log") as url:
            results["2 workers, store: false, items resent"] = loops(url, args.conversations)
            results["2 workers, previous_response_id"] = loops(
                url, args.conversations, store=True, chain=True
            )
            results["store alone, 2 processes"] = store_alone(url, store)
    keys = [k for k in results["vllm serve"]]
    sides = [s for s in results if s != "store alone, 2 processes"]
    rows = [["ms (median)", *sides]]
    rows += [[k, *(f"{results[s][k]:.0f}" for s in sides)] for k in keys]
    print(aligned(rows))
    alone = results["store alone, 2 processes"]
    print(f"store alone: put {alone['put_ms']:.2f} ms, get {alone['get_ms']:.2f} ms per turn "
          f"({alone['record_bytes']} bytes a response), 2 processes on one file")  # fmt: skip
    write_json(args.out, {"when": now_utc(), "machine": machine(), "versions": versions(),
                          "conversations": args.conversations, "results": results})  # fmt: skip


if __name__ == "__main__":
    main()
