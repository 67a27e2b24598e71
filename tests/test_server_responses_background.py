"""Background responses on ``/v1/responses`` (``background: true``) over a real socket, on the
suite's shared scripted ``llama3`` engine: the ``queued`` answer, then the stored response;
cancel; and with ``stream`` too, the request's events read back from the store, resumed with
``GET /v1/responses/{id}?stream=true&starting_after=N`` after a lost connection (by raw HTTP
and by the openai SDK), ended for its readers by a cancel, and by ``response.failed`` when the
worker running it is killed. Every answer is the engine's own
(the script's). Resuming on another worker: tests/test_server_responses_workers.py; the events'
storage: tests/test_responses_store.py; the same requests against ``vllm serve``:
tests/test_server_responses_parity.py."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from serving import serving, sse_events

from vllm_inline.engine import Engine, start_engines
from vllm_inline.server import OpenAIServer
from vllm_inline.server.responses import BackgroundResponses, SQLiteResponseStore

pytestmark = pytest.mark.engine

ANSWER = "The answer is complete."
"""The scripted llama3's answer to "Hello"."""
LONG = {"model": "llama3", "input": "Hello", "background": True, "ignore_eos": True,
        "max_output_tokens": 400}  # fmt: skip
"""A long answer (the script's invented turns, to the end of the context)."""


class App:
    def __init__(self, url: str, engine: Engine) -> None:
        self.url = url
        self.engine = engine
        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

    def post(self, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(f"{self.url}/v1/responses", json=body, timeout=120)

    def get(self, response_id: str, **query: Any) -> httpx.Response:
        return httpx.get(f"{self.url}/v1/responses/{response_id}", params=query, timeout=120)

    def wait_for(self, response_id: str, statuses: tuple[str, ...]) -> dict[str, Any]:
        deadline = time.monotonic() + 60
        while True:
            got: dict[str, Any] = self.get(response_id).json()
            if got["status"] in statuses or time.monotonic() > deadline:
                return got
            time.sleep(0.05)

    def wait_idle(self) -> None:
        deadline = time.monotonic() + 10
        while self.engine.num_unfinished_requests() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.engine.num_unfinished_requests() == 0  # aborted in vLLM


def read_events(response: httpx.Response, most: int | None = None) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.read()
    return sse_events(response.iter_lines(), most)


def streamed(app: App, method: str, path: str, most: int | None = None, **kw: Any) -> list[Any]:
    with httpx.stream(method, f"{app.url}{path}", timeout=120, **kw) as r:
        return read_events(r, most)


@pytest.fixture(scope="module")
def app(scripted: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    from fastapi import FastAPI

    engine = scripted("llama3").engine
    start_engines(engine)  # the suite's shared engine: not stopped by the server's lifespan
    store = SQLiteResponseStore(tmp_path_factory.mktemp("responses") / "store.sqlite3")
    server = OpenAIServer(chat={"llama3": engine}, responses_store=store)
    fastapi_app = FastAPI(lifespan=server.lifespan)
    server.install(fastapi_app)
    with serving(fastapi_app) as url:
        yield App(url, engine)
    store.close()


def test_background_responses_and_cancel(app: App) -> None:
    queued = app.client.responses.create(model="llama3", input="Hello", background=True)
    assert queued.status == "queued" and queued.background and queued.output == []
    done = app.wait_for(queued.id, ("completed",))
    assert done["status"] == "completed" and done["background"] is True
    assert done["output"][0]["content"][0]["text"] == ANSWER
    running = app.post(LONG).json()
    cancelled = httpx.post(f"{app.url}/v1/responses/{running['id']}/cancel", timeout=30)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    time.sleep(1.0)  # its end, had it run on, would have been written by now
    assert app.wait_for(running["id"], ("cancelled",))["status"] == "cancelled"
    again = httpx.post(f"{app.url}/v1/responses/{running['id']}/cancel", timeout=30)
    assert again.status_code == 400
    app.wait_idle()
    refused = app.post({"model": "llama3", "input": "Hi", "background": True, "store": False})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "background"
    assert "store" in refused.json()["error"]["message"]


def test_a_background_stream_is_the_stream_and_resumes_after_any_event(app: App) -> None:
    body = {"model": "llama3", "input": "Hello", "background": True, "stream": True}
    events = streamed(app, "POST", "/v1/responses", json=body)
    types = [e["type"] for e in events]
    foreground = streamed(app, "POST", "/v1/responses", json={**body, "background": False})
    assert types[:4] == [e["type"] for e in foreground][:4]
    assert types[-4:] == [e["type"] for e in foreground][-4:]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["response"]["background"] is True
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == ANSWER and events[-1]["type"] == "response.completed"
    response_id = events[0]["response"]["id"]
    got = app.get(response_id).json()
    assert got == events[-1]["response"] and got["status"] == "completed"
    # The stored events again, from any one on; all of them without starting_after.
    path = f"/v1/responses/{response_id}"
    for after in (0, 3, len(events) - 2):
        params = {"stream": "true", "starting_after": after}
        assert streamed(app, "GET", path, params=params) == events[after + 1 :]
    assert streamed(app, "GET", path, params={"stream": "true"}) == events
    # The openai SDK's create and retrieve, both with stream.
    sdk = app.client.responses.create(model="llama3", input="Hello", background=True, stream=True)
    sdk_events = list(sdk)
    assert sdk_events[-1].type == "response.completed"
    assert sdk_events[-1].response.output_text == ANSWER
    resumed = app.client.responses.retrieve(
        sdk_events[0].response.id, stream=True, starting_after=2
    )
    assert [e.sequence_number for e in resumed] == list(range(3, len(sdk_events)))


def test_a_lost_connection_resumes_and_the_response_runs_on(app: App) -> None:
    body = {"model": "llama3", "input": "Hello", "background": True, "stream": True}
    first = streamed(app, "POST", "/v1/responses", most=5, json=body)  # then the client leaves
    response_id = first[0]["response"]["id"]
    assert app.wait_for(response_id, ("completed",))["status"] == "completed"
    params = {"stream": "true", "starting_after": first[-1]["sequence_number"]}
    rest = streamed(app, "GET", f"/v1/responses/{response_id}", params=params)
    events = first + rest
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == ANSWER and events[-1]["type"] == "response.completed"


def test_a_cancel_ends_the_background_stream_of_every_reader(app: App) -> None:
    with httpx.stream(
        "POST", f"{app.url}/v1/responses", json={**LONG, "stream": True}, timeout=120
    ) as r:
        lines = r.iter_lines()
        head = []
        for line in lines:
            if line.startswith("data: "):
                head.append(json.loads(line.removeprefix("data: ")))
            if len(head) == 4:
                break
        response_id = head[0]["response"]["id"]
        cancel = httpx.post(f"{app.url}/v1/responses/{response_id}/cancel", timeout=30)
        assert cancel.status_code == 200, cancel.text
        rest = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    # The stream ended (no last event: the response was cancelled, not finished).
    assert all(e["type"] not in ("response.completed", "response.failed") for e in rest)
    assert app.wait_for(response_id, ("cancelled",))["status"] == "cancelled"
    params = {"stream": "true", "starting_after": 0}
    again = streamed(app, "GET", f"/v1/responses/{response_id}", params=params)
    assert [e["type"] for e in again][:1] == ["response.in_progress"]  # and it ends
    app.wait_idle()


def test_a_stream_of_what_was_not_streamed_in_the_background_is_refused(app: App) -> None:
    foreground = app.client.responses.create(model="llama3", input="Hello")
    refused = app.get(foreground.id, stream="true")
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "stream"
    assert app.get("resp_nope", stream="true").status_code == 404
    bad = app.get(foreground.id, stream="true", starting_after="x")
    assert bad.status_code == 400 and "starting_after" in bad.json()["error"]["param"]
    bad = app.get(foreground.id, stream="maybe")
    assert bad.status_code == 400 and "stream" in bad.json()["error"]["param"]


STREAM_RUNNER = """
import sys, time
from vllm_inline.server.responses import SQLiteResponseStore, StoredResponse
from vllm_inline.server.responses.records import stored_event
store = SQLiteResponseStore(sys.argv[1])
kinds = ("response.created", "response.in_progress", "response.output_text.delta")
events = [stored_event({"type": k, "sequence_number": n}) for n, k in enumerate(kinds)]
store.put(StoredResponse({"id": "resp_s", "status": "queued"}, []), events=events)
print("stored", flush=True)
time.sleep(300)
"""


def test_a_stream_whose_worker_is_killed_ends_with_response_failed(tmp_path: Path) -> None:
    """A reader (on another worker) follows a background stream; its worker, a real process,
    is SIGKILLed: the reader gets the stored events, then ``response.failed`` naming that
    process, once (resumed after it: nothing more)."""
    path = tmp_path / "store.sqlite3"
    child = subprocess.Popen([sys.executable, "-c", STREAM_RUNNER, str(path)],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    store = SQLiteResponseStore(path)
    background = BackgroundResponses(lambda: store)

    async def read(after: int) -> list[dict[str, Any]]:
        frames = [frame async for frame in background.follow("resp_s", after)]
        return [json.loads(f.split("data: ", 1)[1]) for f in frames]

    async def killed_while_read() -> list[dict[str, Any]]:
        reader = asyncio.create_task(read(-1))
        await asyncio.sleep(0.5)
        assert not reader.done()  # its worker runs: the reader waits for more
        child.kill()
        child.wait(timeout=30)
        return await asyncio.wait_for(reader, 30)

    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "stored"
        events = asyncio.run(killed_while_read())
    finally:
        child.kill()
        child.wait(timeout=30)
    assert [e["type"] for e in events] == ["response.created", "response.in_progress",
                                           "response.output_text.delta", "response.failed"]  # fmt: skip
    assert [e["sequence_number"] for e in events] == [0, 1, 2, 3]
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and f"pid {child.pid}" in failed["error"]["message"]
    assert asyncio.run(read(3)) == []
    assert [e["type"] for e in asyncio.run(read(1))][-1] == "response.failed"
    store.close()
